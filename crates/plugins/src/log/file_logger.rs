//! file-logger (`apisix/plugins/file-logger.lua`): each request's log entry appended to
//! `path` (the conf's, else `plugin_metadata`'s) as one JSON line, with the loggers'
//! `log_format` (the conf's, else the metadata's), `log_format_extra`, `include_req_body(_expr)`,
//! `include_resp_body(_expr)` and the body limits; `match` (lua-resty-expr expressions, any of
//! which must accept the request) decides whether a request is logged at all.
//!
//! The log phase never touches the file: it encodes the line and hands it to the path's
//! writer task on the gateway's executor through a bounded queue ([`QUEUE_LINES`]); when the
//! queue is full the line is dropped and counted, with one error a second saying how many. One
//! writer per path and gateway (routes logging to one file share it), so lines never
//! interleave; the writer appends whole lines, as many as are queued, in one write. After
//! SIGUSR1 ([`LogReopen`], logrotate's `postrotate`) the writer reopens the path before its
//! next write, as APISIX's `reopen cached log file`. On the gateway's graceful shutdown the
//! writer writes what is queued before the shutdown ends. A path that cannot be opened is
//! logged as APISIX logs it (`failed to open file: <path>, error info: ...`) and tried again
//! for the next lines.
//!
//! Not as APISIX: a conf without `path` passes the check (the check does not see
//! `plugin_metadata`, where the path may be); with neither, each request logs APISIX's
//! `property "path" is not set ...` error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CheckCtx, Clock, CompileCtx, LogCtx, LogNeeds, LogReopen, Phases, Plugin, PluginDef,
    PluginServices, SharedState, Shutdown, ShutdownHold,
};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::log_entry::{self, LogEntryConf};

pub const NAME: &str = "file-logger";

/// Lines queued per file before new ones are dropped (the batch processor's bound).
pub const QUEUE_LINES: usize = 8192;

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    check: Some(check),
    schema_error: Some(schema_error),
    ..PluginDef::new(NAME, 399, schema, compile)
};

fn schema() -> Value {
    let mut schema = json!({
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "match": {"type": "array", "maxItems": 20, "items": {"type": "array"}}
        }
    });
    if let Some(props) = schema["properties"].as_object_mut() {
        props.extend(log_entry::entry_properties());
    }
    schema
}

fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "log_format": {"type": "object"},
            "log_format_extra": {"type": "object"}
        }
    })
}

/// `match` compiles.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    log_entry::check_match(cx.conf)
}

/// APISIX checks `match` before the schema, so its error wins over the schema's.
fn schema_error(cx: &CheckCtx<'_>, schema: String) -> String {
    log_entry::check_match(cx.conf).err().unwrap_or(schema)
}

const NO_PATH: &str = "property \"path\" is not set in either the plugin conf or the metadata";

/// The path's writer: the queue into its task and what it dropped.
pub struct FileWriter {
    path: PathBuf,
    tx: mpsc::Sender<Bytes>,
    dropped: AtomicU64,
    /// Dropped since the last report, and when that was (epoch seconds).
    unreported: AtomicU64,
    last_report_s: AtomicU64,
    clock: Clock,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FileWriter {
    /// Queues one line; never waits.
    fn push(&self, line: Bytes) {
        if self.tx.try_send(line).is_ok() {
            return;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        let n = self.unreported.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.clock.epoch_ms() / 1000;
        let last = self.last_report_s.load(Ordering::Relaxed);
        if now > last
            && self
                .last_report_s
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.unreported.fetch_sub(n, Ordering::Relaxed);
            tracing::error!(
                "file-logger: the writer of {} is behind: {n} log entries dropped",
                self.path.display()
            );
        }
    }

    /// Lines dropped because the queue was full, since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The gateway's file writers by path, alive while a conf uses them.
#[derive(Default)]
struct FileWriters(Mutex<HashMap<PathBuf, Weak<FileWriter>>>);

impl SharedState for FileWriters {
    fn create(_: &PluginServices) -> Self {
        FileWriters::default()
    }
}

impl FileWriters {
    fn of(&self, path: &Path, services: &PluginServices) -> Result<Arc<FileWriter>, String> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = map.get(path).and_then(Weak::upgrade) {
            return Ok(w);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let (tx, rx) = mpsc::channel(QUEUE_LINES);
        let writer = Arc::new(FileWriter {
            path: path.to_owned(),
            tx,
            dropped: AtomicU64::new(0),
            unreported: AtomicU64::new(0),
            last_report_s: AtomicU64::new(0),
            clock: services.clock().clone(),
        });
        let task = WriterTask {
            path: path.to_owned(),
            reopen: services.log_reopen().clone(),
            file: None,
        };
        // Held from now (lines may be queued before the task first runs) until the shutdown
        // starts and what is queued then is written.
        let hold = services.shutdown().hold();
        let shutdown = services.shutdown().clone();
        services
            .executor()
            .spawn(task.run(rx, shutdown, hold))
            .map_err(|e| {
                format!(
                    "file-logger: cannot start the writer of {}: {e}",
                    path.display()
                )
            })?;
        map.insert(path.to_owned(), Arc::downgrade(&writer));
        Ok(writer)
    }
}

/// Lua's `io.open` error: `<path>: <strerror>`.
fn lua_io_error(path: &Path, e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    format!("{}: {text}", path.display())
}

/// Owns the open file of one path.
struct WriterTask {
    path: PathBuf,
    reopen: LogReopen,
    /// The file and the reopen generation it was opened at.
    file: Option<(tokio::fs::File, u64)>,
}

impl WriterTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Bytes>, shutdown: Shutdown, hold: ShutdownHold) {
        let mut hold = Some(hold);
        let mut buf = BytesMut::new();
        loop {
            let first = if hold.is_some() {
                tokio::select! {
                    line = rx.recv() => line,
                    () = shutdown.started() => {
                        while let Ok(line) = rx.try_recv() {
                            buf.put_slice(&line);
                        }
                        self.write(&mut buf).await;
                        hold = None;
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            // Every sender gone: the last conf using the path is gone.
            let Some(first) = first else {
                return;
            };
            buf.put_slice(&first);
            while let Ok(line) = rx.try_recv() {
                buf.put_slice(&line);
                if buf.len() >= 1 << 20 {
                    break;
                }
            }
            self.write(&mut buf).await;
        }
    }

    /// Appends `buf` (whole lines), reopening the path first when asked to; empties `buf`.
    async fn write(&mut self, buf: &mut BytesMut) {
        if buf.is_empty() {
            return;
        }
        let generation = self.reopen.generation();
        if let Some((_, opened_at)) = &self.file {
            if *opened_at != generation {
                tracing::info!("reopen cached log file: {}", self.path.display());
                self.file = None;
            }
        }
        if self.file.is_none() {
            match tokio::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)
                .await
            {
                Ok(f) => self.file = Some((f, generation)),
                Err(e) => {
                    tracing::error!(
                        "failed to open file: {}, error info: {}",
                        self.path.display(),
                        lua_io_error(&self.path, &e)
                    );
                    buf.clear();
                    return;
                }
            }
        }
        if let Some((file, _)) = &mut self.file {
            let written = async {
                file.write_all(buf).await?;
                file.flush().await
            }
            .await;
            if let Err(e) = written {
                tracing::error!(
                    "failed to write file: {}, error info: {}",
                    self.path.display(),
                    lua_io_error(&self.path, &e)
                );
                // Opened again for the next lines (a file system that came back).
                self.file = None;
            }
        }
        buf.clear();
    }
}

/// One file-logger conf, compiled.
struct FileLogger {
    entry: LogEntryConf,
    needs: LogNeeds,
    clock: Clock,
    /// `None`: no path in the conf nor the metadata.
    writer: Option<Arc<FileWriter>>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let filled = cx.filled();
    let conf = filled.as_object().ok_or("conf is not an object")?;
    let entry = LogEntryConf::compile(conf, cx.metadata)?;
    let path = conf.get("path").and_then(Value::as_str).or_else(|| {
        cx.metadata
            .and_then(|m| m.get("path"))
            .and_then(Value::as_str)
    });
    let writer = match path {
        Some(p) => Some(
            cx.services
                .shared::<FileWriters>()
                .of(Path::new(p), cx.services)?,
        ),
        None => None,
    };
    Ok(Arc::new(FileLogger {
        needs: entry.needs(),
        entry,
        clock: cx.services.clock().clone(),
        writer,
    }))
}

impl Plugin for FileLogger {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        self.needs.clone()
    }

    fn log(&self, ctx: &LogCtx) {
        let now = self.clock.epoch_ms();
        if !self.entry.matches(ctx, now) {
            return;
        }
        let Some(writer) = &self.writer else {
            tracing::error!("{NO_PATH}");
            return;
        };
        let entry = self.entry.build(ctx, now);
        let mut line = lua::cjson_encode(&Value::Object(entry));
        line.push('\n');
        writer.push(Bytes::from(line));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::LogVars;

    use super::*;
    use crate::testing::Compiler;

    fn ctx_with(p: &dyn Plugin, status: u16, arg: &'static str) -> LogCtx {
        struct V(&'static str);
        impl ferrisix_router::VarSource for V {
            fn var(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
                match name {
                    "route_id" => Some("r1".into()),
                    "arg_name" => Some(self.0.into()),
                    _ => None,
                }
            }
        }
        LogCtx {
            status,
            vars: LogVars::capture(p.log_needs().vars.unwrap(), &V(arg)),
            ..Default::default()
        }
    }

    async fn lines(path: &Path, n: usize) -> Vec<Value> {
        for _ in 0..500 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.lines().count() >= n {
                return text
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} has not {n} lines", path.display());
    }

    #[tokio::test]
    async fn one_json_line_per_matching_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let c = Compiler::new();
        let conf = json!({"path": path.to_str().unwrap(), "log_format": {"s": "$status"},
            "match": [[["arg_name", "==", "jack"]], [["status", "==", 500]]]});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fl-1", None)).unwrap();
        p.log(&ctx_with(&*p, 200, "jack"));
        p.log(&ctx_with(&*p, 201, "rose"));
        p.log(&ctx_with(&*p, 500, "rose"));
        let got = lines(&path, 2).await;
        assert_eq!(
            got,
            vec![
                json!({"s": "200", "route_id": "r1"}),
                json!({"s": "500", "route_id": "r1"})
            ]
        );
    }

    #[tokio::test]
    async fn the_metadata_gives_path_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.log");
        let c = Compiler::new();
        let meta = json!({"path": path.to_str().unwrap(), "log_format": {"m": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &json!({}), "fl-2", Some(&meta))).unwrap();
        p.log(&ctx_with(&*p, 404, ""));
        assert_eq!(
            lines(&path, 1).await,
            vec![json!({"m": "404", "route_id": "r1"})]
        );
    }

    #[tokio::test]
    async fn reopened_after_the_signal_so_logrotate_works() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rot.log");
        let c = Compiler::new();
        let conf = json!({"path": path.to_str().unwrap(), "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fl-3", None)).unwrap();
        p.log(&ctx_with(&*p, 200, ""));
        lines(&path, 1).await;
        // logrotate moves the file away, then signals.
        let rotated = dir.path().join("rot.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        p.log(&ctx_with(&*p, 201, ""));
        assert_eq!(
            lines(&rotated, 2).await.len(),
            2,
            "before the signal the old file is written"
        );
        c.registry.services().log_reopen().trigger();
        p.log(&ctx_with(&*p, 202, ""));
        assert_eq!(
            lines(&path, 1).await,
            vec![json!({"s": "202", "route_id": "r1"})]
        );
        assert_eq!(lines(&rotated, 2).await.len(), 2);
    }

    #[tokio::test]
    async fn routes_with_one_path_share_one_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.log");
        let c = Compiler::new();
        let conf = json!({"path": path.to_str().unwrap(), "log_format": {"s": "$status"}});
        let a = (DEF.compile)(&c.cx(NAME, &conf, "fl-a", None)).unwrap();
        let b = (DEF.compile)(&c.cx(NAME, &conf, "fl-b", None)).unwrap();
        for i in 0..50 {
            a.log(&ctx_with(&*a, 200 + i, ""));
            b.log(&ctx_with(&*b, 300 + i, ""));
        }
        assert_eq!(lines(&path, 100).await.len(), 100);
        let w = c.registry.services().shared::<FileWriters>();
        assert_eq!(w.0.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.log");
        let services = Arc::new(PluginServices::default());
        let writer = services
            .shared::<FileWriters>()
            .of(&path, &services)
            .unwrap();
        // The writer task cannot run before this test yields: the queue fills.
        for _ in 0..QUEUE_LINES + 10 {
            writer.push(Bytes::from_static(b"{}\n"));
        }
        assert_eq!(writer.dropped(), 10);
        let text = loop {
            let t = std::fs::read_to_string(&path).unwrap_or_default();
            if t.lines().count() == QUEUE_LINES {
                break t;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(text.lines().all(|l| l == "{}"));
    }

    #[tokio::test]
    async fn a_bad_path_is_logged_and_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("x.log");
        let c = Compiler::new();
        let conf = json!({"path": path.to_str().unwrap(), "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fl-4", None)).unwrap();
        p.log(&ctx_with(&*p, 200, ""));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!path.exists());
        let e = std::fs::File::open(&path).unwrap_err();
        assert_eq!(
            lua_io_error(&path, &e),
            format!("{}: No such file or directory", path.display())
        );
        // The directory appears: the next lines are written.
        std::fs::create_dir(path.parent().unwrap()).unwrap();
        p.log(&ctx_with(&*p, 201, ""));
        assert_eq!(
            lines(&path, 1).await,
            vec![json!({"s": "201", "route_id": "r1"})]
        );
    }

    #[tokio::test]
    async fn the_shutdown_waits_for_queued_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drain.log");
        let c = Compiler::new();
        let conf = json!({"path": path.to_str().unwrap(), "log_format": {"s": "$status"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fl-5", None)).unwrap();
        for i in 0..100 {
            p.log(&ctx_with(&*p, 200 + i, ""));
        }
        assert!(
            c.registry
                .services()
                .shutdown()
                .drain(Duration::from_secs(5))
                .await
        );
        let n = std::fs::read_to_string(&path).unwrap().lines().count();
        assert_eq!(n, 100);
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"path": "logs/file.log"})).is_ok());
        assert_eq!(
            r.check(NAME, &json!({"path": "x", "match": [[["arg_name", "=x", "jack"]]]})),
            Err("failed to check the configuration of plugin file-logger err: failed to validate the 'match' expression: invalid operator '=x'".into())
        );
        assert!(r.check(NAME, &json!({"path": 1})).is_err());
        // Both `match` and the schema fail: APISIX checks `match` first.
        assert_eq!(
            r.check(NAME, &json!({"path": 1, "match": [[["arg_name", "=x", "jack"]]]})),
            Err("failed to check the configuration of plugin file-logger err: failed to validate the 'match' expression: invalid operator '=x'".into())
        );
        assert!(r
            .check_metadata(NAME, &json!({"path": "logs/x.log"}))
            .is_ok());
        assert_eq!(r.get(NAME).unwrap().priority, 399);
    }
}
