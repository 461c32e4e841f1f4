//! What every logger shares: its compiled entry conf, its batch processor (one per conf,
//! kept across snapshots while the conf is unchanged) and the log phase that builds, encodes
//! and pushes one entry per request.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{Clock, CompileCtx, Lease, LogCtx, LogNeeds, Phases, Plugin, StateMap};
use serde_json::{Map, Value};

use super::batch_processor::{
    Backlogs, BatchConfig, BatchProcessor, BatchSink, DEFAULT_MAX_PENDING_ENTRIES,
};
use super::log_entry::LogEntryConf;

/// One logger conf, compiled.
pub struct Logger {
    entry: LogEntryConf,
    needs: LogNeeds,
    processor: Lease<BatchProcessor>,
    clock: Clock,
    /// http-logger names requests that matched no route `no-matched`.
    no_matched: bool,
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logger")
            .field("processor", &*self.processor)
            .finish()
    }
}

impl Logger {
    /// Compiles `cx`'s conf of logger `plugin`; `sink` makes the sink from the filled conf
    /// (called only when the conf has no processor yet).
    pub fn compile(
        cx: &CompileCtx<'_>,
        plugin: &'static str,
        no_matched: bool,
        sink: impl FnOnce(&Map<String, Value>) -> Result<Arc<dyn BatchSink>, String>,
    ) -> Result<Logger, String> {
        Logger::compile_keyed(cx, plugin, no_matched, cx.state_key(), false, sink)
    }

    /// As [`Logger::compile`] for a logger whose sink reads the plugin's metadata as well
    /// (where loggly and datadog send): the processor is kept while both the conf and the
    /// metadata are unchanged, so a batch goes where the metadata said when it was pushed.
    pub fn compile_with_metadata(
        cx: &CompileCtx<'_>,
        plugin: &'static str,
        sink: impl FnOnce(&Map<String, Value>) -> Result<Arc<dyn BatchSink>, String>,
    ) -> Result<Logger, String> {
        Logger::compile_keyed(cx, plugin, false, metadata_key(cx), false, sink)
    }

    /// As [`Logger::compile_with_metadata`] for a plugin that makes its own entry from the
    /// request's log context (datadog's metrics): APISIX's log entry is not built, so only
    /// `route_id` and `service_id` are captured besides what [`Logger::with_vars`] adds.
    pub fn compile_own_entry(
        cx: &CompileCtx<'_>,
        plugin: &'static str,
        sink: impl FnOnce(&Map<String, Value>) -> Result<Arc<dyn BatchSink>, String>,
    ) -> Result<Logger, String> {
        Logger::compile_keyed(cx, plugin, false, metadata_key(cx), true, sink)
    }

    fn compile_keyed(
        cx: &CompileCtx<'_>,
        plugin: &'static str,
        no_matched: bool,
        key: String,
        own_entry: bool,
        sink: impl FnOnce(&Map<String, Value>) -> Result<Arc<dyn BatchSink>, String>,
    ) -> Result<Logger, String> {
        let filled = cx.filled();
        let conf = filled.as_object().ok_or("conf is not an object")?;
        let entry = if own_entry {
            let mut minimal = Map::new();
            minimal.insert("log_format".into(), Value::Object(Map::new()));
            LogEntryConf::compile(&minimal, None)?
        } else {
            LogEntryConf::compile(conf, cx.metadata)?
        };
        let max_pending = cx
            .metadata
            .and_then(|m| m.get("max_pending_entries"))
            .and_then(Value::as_u64)
            .map_or(DEFAULT_MAX_PENDING_ENTRIES, |n| n as usize);
        let services = cx.services;
        let map = services.shared::<StateMap<BatchProcessor>>();
        // The sink is made before the lease so that a bad conf fails the compile.
        let sink = sink(conf)?;
        let processor = map.lease(&key, || {
            BatchProcessor::new(
                BatchConfig::from_conf(conf),
                sink,
                services.shared::<Backlogs>().of(plugin),
                max_pending,
                services,
            )
        });
        let mut needs = entry.needs();
        if processor.wants_labels() {
            // The batch_process_entries gauge's labels come from the first request logged.
            needs = needs.union(&LogNeeds {
                vars: Some(vec!["route_id".into(), "server_addr".into()].into()),
                ..LogNeeds::default()
            });
        }
        Ok(Logger {
            needs,
            entry,
            processor,
            clock: services.clock().clone(),
            no_matched,
        })
    }

    /// Also captures `names` for the log phase (loki's label templates).
    pub fn with_vars(mut self, names: &[Box<str>]) -> Logger {
        if !names.is_empty() {
            let extra = LogNeeds {
                vars: Some(names.to_vec().into()),
                ..LogNeeds::default()
            };
            self.needs = self.needs.union(&extra);
        }
        self
    }

    pub fn needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    /// The log phase: one entry, encoded now, pushed (never waits).
    pub fn log(&self, ctx: &LogCtx) {
        self.log_with(ctx, |entry, _| {
            Bytes::from(lua::cjson_encode(&Value::Object(entry)))
        });
    }

    /// The log phase with the logger's own encoding of the entry.
    pub fn log_with(&self, ctx: &LogCtx, encode: impl FnOnce(Map<String, Value>, u64) -> Bytes) {
        let now = self.clock.epoch_ms();
        if !self.entry.matches(ctx, now) {
            return;
        }
        let mut entry = self.entry.build(ctx, now);
        if self.no_matched && !entry.contains_key("route_id") {
            entry.insert("route_id".into(), Value::String("no-matched".into()));
        }
        self.label(ctx);
        self.processor.push(encode(entry, now));
    }

    /// The log phase with the entry's parts kept apart (`get_log_entry`'s three results).
    pub fn log_parts(&self, ctx: &LogCtx, encode: impl FnOnce(EntryParts, u64) -> Bytes) {
        let now = self.clock.epoch_ms();
        if !self.entry.matches(ctx, now) {
            return;
        }
        let (entry, extra) = self.entry.build_parts(ctx, now);
        let parts = EntryParts {
            entry,
            extra,
            customized: self.entry.customized(),
        };
        self.label(ctx);
        self.processor.push(encode(parts, now));
    }

    /// Gives the processor's gauge its labels from the first request with a route.
    fn label(&self, ctx: &LogCtx) {
        if !self.processor.wants_labels() {
            return;
        }
        use ferrisix_router::VarSource;
        if let (Some(route), Some(addr)) = (ctx.var("route_id"), ctx.var("server_addr")) {
            if !route.is_empty() {
                self.processor.label(&route, &addr);
            }
        }
    }

    /// The plugin logging each request as `encode` makes it from the entry's parts (the
    /// parts, the wall clock in milliseconds, the request's log context).
    pub fn encoded_by_parts(
        self,
        encode: impl Fn(EntryParts, u64, &LogCtx) -> Bytes + Send + Sync + 'static,
    ) -> Arc<dyn Plugin> {
        Arc::new(PartsPlugin {
            logger: self,
            encode: Box::new(encode),
        })
    }

    /// The plugin logging each request's entry as JSON.
    pub fn into_plugin(self) -> Arc<dyn Plugin> {
        Arc::new(LogPlugin {
            logger: self,
            encode: None,
        })
    }

    /// The plugin logging each request's entry as `encode` makes it (the entry, the wall
    /// clock in milliseconds, the request's log context).
    pub fn encoded_by(
        self,
        encode: impl Fn(Map<String, Value>, u64, &LogCtx) -> Bytes + Send + Sync + 'static,
    ) -> Arc<dyn Plugin> {
        Arc::new(LogPlugin {
            logger: self,
            encode: Some(Box::new(encode)),
        })
    }
}

/// The state key of a conf together with the plugin's metadata.
fn metadata_key(cx: &CompileCtx<'_>) -> String {
    let meta = cx.metadata.map(lua::cjson_encode).unwrap_or_default();
    format!(
        "{}:m{:08x}",
        cx.state_key(),
        crc32fast::hash(meta.as_bytes())
    )
}

type Encode = Box<dyn Fn(Map<String, Value>, u64, &LogCtx) -> Bytes + Send + Sync>;

/// A logger as a plugin: the log phase only.
struct LogPlugin {
    logger: Logger,
    encode: Option<Encode>,
}

impl Plugin for LogPlugin {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        match &self.encode {
            None => self.logger.log(ctx),
            Some(encode) => self
                .logger
                .log_with(ctx, |entry, now| encode(entry, now, ctx)),
        }
    }
}

/// One request's entry as log-util's `get_log_entry` returns it.
pub struct EntryParts {
    /// The default entry (without `log_format_extra`) or the `log_format` entry.
    pub entry: Map<String, Value>,
    /// The default entry's `log_format_extra` fields, resolved.
    pub extra: Option<Map<String, Value>>,
    /// Whether `entry` is a `log_format` entry.
    pub customized: bool,
}

type PartsEncode = Box<dyn Fn(EntryParts, u64, &LogCtx) -> Bytes + Send + Sync>;

/// A logger encoding the entry's parts itself.
struct PartsPlugin {
    logger: Logger,
    encode: PartsEncode,
}

impl Plugin for PartsPlugin {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.logger.needs()
    }

    fn log(&self, ctx: &LogCtx) {
        self.logger
            .log_parts(ctx, |parts, now| (self.encode)(parts, now, ctx));
    }
}

/// `meta_format: origin` (kafka-logger, rocketmq-logger): what the log phase needs for
/// [`req_original`] on top of the logger's own needs.
pub fn origin_needs(conf: &Value) -> LogNeeds {
    let max = conf
        .get("max_req_body_bytes")
        .and_then(Value::as_u64)
        .map_or(super::log_entry::MAX_BODY, |n| n as usize);
    let include_req_body = conf.get("include_req_body").and_then(Value::as_bool) == Some(true);
    LogNeeds {
        vars: Some(vec![Box::<str>::from("request")].into()),
        request_headers: true,
        request_body: include_req_body.then_some(max),
        ..LogNeeds::default()
    }
}

/// `log_util.get_req_original`: the request line, the headers, a blank line, the body (with
/// `include_req_body`).
pub fn req_original(ctx: &LogCtx, include_req_body: bool) -> String {
    let mut out = String::new();
    out.push_str(ctx.vars.get("request").unwrap_or(""));
    out.push_str("\r\n");
    for (name, value) in ctx.request_headers.iter().flatten() {
        out.push_str(name.as_str());
        out.push_str(": ");
        out.push_str(&String::from_utf8_lossy(value.as_bytes()));
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    if include_req_body {
        if let Some(body) = &ctx.request_body {
            out.push_str(&String::from_utf8_lossy(body));
        }
    }
    out
}

/// `meta_format: origin`: the request as it came is the entry, as it is with a batch of one
/// (`batch_max_size: 1`), else as a JSON string.
pub fn log_original(logger: &Logger, ctx: &LogCtx, include_req_body: bool, raw: bool) {
    let text = req_original(ctx, include_req_body);
    logger.log_with(ctx, move |_, _| {
        if raw {
            Bytes::from(text)
        } else {
            Bytes::from(Value::String(text).to_string())
        }
    });
}

/// How a batch of encoded entries is joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concat {
    /// A JSON array (a lone entry unwrapped when `batch_max_size` is 1).
    Json,
    /// The entries, one a line.
    NewLine,
    /// The entries separated by spaces (ClickHouse's `JSONEachRow`).
    Space,
}

/// The body of one batch, as APISIX's loggers encode it.
pub fn encode_batch(entries: &[Bytes], batch_max_size: usize, concat: Concat) -> Bytes {
    if batch_max_size == 1 && entries.len() == 1 {
        return entries[0].clone();
    }
    let len: usize = entries.iter().map(|e| e.len() + 1).sum::<usize>() + 2;
    let mut out = BytesMut::with_capacity(len);
    let (open, sep, close): (&[u8], &[u8], &[u8]) = match concat {
        Concat::Json => (b"[", b",", b"]"),
        Concat::NewLine => (b"", b"\n", b""),
        Concat::Space => (b"", b" ", b""),
    };
    out.put_slice(open);
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.put_slice(sep);
        }
        out.put_slice(e);
    }
    out.put_slice(close);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches() {
        let e = [Bytes::from("{\"a\":1}"), Bytes::from("{\"b\":2}")];
        assert_eq!(encode_batch(&e[..1], 1, Concat::Json), "{\"a\":1}");
        assert_eq!(encode_batch(&e[..1], 10, Concat::Json), "[{\"a\":1}]");
        assert_eq!(encode_batch(&e, 10, Concat::Json), "[{\"a\":1},{\"b\":2}]");
        assert_eq!(
            encode_batch(&e, 10, Concat::NewLine),
            "{\"a\":1}\n{\"b\":2}"
        );
    }
}
