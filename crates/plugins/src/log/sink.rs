//! What a logger that ships entries to a log server is made of, so that its file holds only
//! its schema, its entry encoding and its send:
//!
//! - [`def`] is the logger's `PluginDef` with the metadata schema and check every logger
//!   shares ([`metadata_schema`], [`check`]); [`schema`] adds the log entry's properties
//!   (`log_format`, the bodies) and the batch processor's (`batch_max_size`, ...) to the
//!   logger's own.
//! - [`Logger::compile`] makes the conf's entry builder and its batch processor (kept across
//!   snapshots while the conf is unchanged) around the logger's [`BatchSink`];
//!   [`Logger::into_plugin`] is the plugin with JSON entries, [`Logger::encoded_by`] the
//!   plugin with the logger's own encoding of each entry.
//! - [`conf`] reads the usual shapes of a filled conf (host and port, endpoints, timeouts,
//!   headers); [`net`] sends one batch over a new TCP (or TLS) connection or as a UDP
//!   datagram; [`rfc5424`] writes syslog lines; [`http`] sends it through the gateway's HTTP client (`https` with
//!   `ssl_verify`); [`encode_batch`] joins encoded entries as APISIX's loggers do.
//!
//! A new logger (say kafka-logger) is then:
//!
//! ```ignore
//! pub static DEF: PluginDef = sink::def(NAME, 403, schema, compile);
//! fn schema() -> Value {
//!     sink::schema(json!({"type": "object", "properties": {...}, "required": [...]}), "kafka logger")
//! }
//! struct KafkaSink { ... }
//! impl BatchSink for KafkaSink {
//!     fn send<'a>(&'a self, entries: &'a [Bytes], batch_max_size: usize) -> SendFuture<'a> { ... }
//! }
//! fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
//!     Ok(Logger::compile(cx, NAME, false, |conf| Ok(Arc::new(KafkaSink::new(conf)?) as Arc<dyn BatchSink>))?
//!         .into_plugin())
//! }
//! ```

pub mod conf;
pub mod http;
pub mod net;
pub mod rfc5424;
#[cfg(test)]
pub(crate) mod testing;

use ferrisix_plugin_api::{CheckCtx, CompileFn, PluginDef};
use serde_json::Value;

pub use super::batch_processor::{BatchSink, SendError, SendFuture};
pub use super::logger::{encode_batch, Concat, EntryParts, Logger};
use super::{batch_processor, log_entry};

/// A logger's definition: its name, priority, schema and compile, with every logger's
/// metadata schema and check (add `encrypt_fields` with `..sink::def(...)`).
pub const fn def(
    name: &'static str,
    priority: i64,
    schema: fn() -> Value,
    compile: CompileFn,
) -> PluginDef {
    PluginDef {
        metadata_schema: Some(metadata_schema),
        check: Some(check),
        ..PluginDef::new(name, priority, schema, compile)
    }
}

/// A logger's schema: `schema` (an object schema of the logger's own properties, its
/// `required` or `oneOf`) with the log entry's properties and the batch processor's, `name`
/// defaulting to `name_default`.
pub fn schema(mut schema: Value, name_default: &str) -> Value {
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (k, v) in log_entry::entry_properties() {
            props.entry(k).or_insert(v);
        }
    }
    batch_processor::wrap_schema(schema, name_default)
}

/// A logger's schema without the log entry's shared properties (a logger whose schema has
/// only some of them, as APISIX's splunk-hec-logging): `schema` with the batch processor's.
pub fn batch_schema(schema: Value, name_default: &str) -> Value {
    batch_processor::wrap_schema(schema, name_default)
}

/// The schema of a logger that writes to `host:port` (syslog, tcp-logger, udp-logger):
/// `host`, then `port` (an integer, at least `port_minimum` where given), then the logger's
/// other `properties`, `host` and `port` required.
pub fn host_port_schema(port_minimum: Option<u64>, properties: Value, name_default: &str) -> Value {
    let mut port = serde_json::json!({"type": "integer"});
    if let Some(min) = port_minimum {
        port["minimum"] = min.into();
    }
    let mut props = serde_json::Map::new();
    props.insert("host".into(), serde_json::json!({"type": "string"}));
    props.insert("port".into(), port);
    if let Value::Object(more) = properties {
        props.extend(more);
    }
    schema(
        serde_json::json!({"type": "object", "properties": props, "required": ["host", "port"]}),
        name_default,
    )
}

/// Every logger's metadata schema (`log_format`, `log_format_extra`, `max_pending_entries`).
pub fn metadata_schema() -> Value {
    batch_processor::wrap_metadata_schema(log_entry::metadata_schema())
}

/// Every logger's check once its schema passed: the entry's expressions
/// (`log_util.check_log_schema`).
pub fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    log_entry::check(cx.conf)
}
