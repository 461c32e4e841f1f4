//! The process's own log (nginx's error log): where it goes (`nginx_config.error_log`: stderr
//! by default, stdout or a file that SIGUSR1 reopens), its level (`nginx_config.error_log_level`,
//! replaced by `RUST_LOG` when that is set, and re-read on SIGHUP), and its format
//! (`ferrisix.log.format`: text, or one JSON object per line for log collectors); the lines
//! plugins ask for (error-log-logger) are handed to them as well.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::{AccessLogTarget, LogFormat, Settings};
use ferrisix_plugin_api::ErrorLogTap;
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The filter in force and how to change it.
pub struct LogControl {
    filter: reload::Handle<EnvFilter, Registry>,
    /// The directive config.yaml asked for (`None` while `RUST_LOG` decides).
    level: Option<String>,
    format: LogFormat,
    target: Option<AccessLogTarget>,
    /// Where the lines plugins ask for go (error-log-logger).
    tap: Arc<ErrorLogTap>,
}

/// `RUST_LOG` when set, else config.yaml's level (default `info`), with rustls's message
/// parsing kept to errors (see [`QUIET_PEER_INPUT`]).
fn directive(settings: &Settings) -> (String, bool) {
    let (directive, from_env) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => (v, true),
        _ => (
            settings
                .nginx_config
                .error_log_level
                .map_or("info", |l| l.directive())
                .to_owned(),
            false,
        ),
    };
    (quiet_peer_input(directive), from_env)
}

/// rustls warns, with the bytes whole, about ClientHello fields it refuses: a client's 10 KB
/// SNI would be written on every handshake, before any authentication. ferrisix logs the
/// failed handshake itself, bounded, so these lines stay out unless the filter names rustls.
const QUIET_PEER_INPUT: &str = "rustls::msgs=error";

fn quiet_peer_input(directive: String) -> String {
    if directive.contains("rustls") {
        directive
    } else {
        format!("{directive},{QUIET_PEER_INPUT}")
    }
}

/// Installs the process's subscriber. Called once, before anything logs. The lines the
/// plugins ask for (error-log-logger) are handed to [`LogControl::error_log`] too.
pub fn init(settings: &Settings, reopen: &LogReopen) -> LogControl {
    let tap = Arc::new(ErrorLogTap::new());
    let (directive, from_env) = directive(settings);
    let filter = EnvFilter::try_new(&directive).unwrap_or_else(|e| {
        eprintln!("ferrisix: log filter {directive:?} not usable ({e}); using info");
        EnvFilter::new("info")
    });
    let (filter, handle) = reload::Layer::new(filter);
    let target = settings.nginx_config.error_log.clone();
    let sink = ErrorLog::new(target.as_ref(), reopen.clone());
    let ansi = sink.is_terminal();
    let format = settings.ferrisix.log.format;
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(Capture(tap.clone()));
    let installed = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(sink)
                    .with_ansi(ansi),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(JsonLines)
                    .with_writer(sink),
            )
            .try_init(),
    };
    if let Err(e) = installed {
        eprintln!("ferrisix: cannot install the log: {e}");
    }
    LogControl {
        filter: handle,
        level: (!from_env).then_some(directive),
        format,
        target,
        tap,
    }
}

impl LogControl {
    /// The log's lines as plugins may read them.
    pub fn error_log(&self) -> &Arc<ErrorLogTap> {
        &self.tap
    }

    /// Applies config.yaml's log settings again (SIGHUP): the level changes at once (unless
    /// `RUST_LOG` sets it); the format and destination need a restart, and are named.
    pub fn reload(&mut self, settings: &Settings) -> Vec<&'static str> {
        let mut restart = Vec::new();
        if settings.ferrisix.log.format != self.format {
            restart.push("ferrisix.log.format");
        }
        if settings.nginx_config.error_log != self.target {
            restart.push("nginx_config.error_log");
        }
        let Some(current) = &self.level else {
            return restart;
        };
        let (wanted, _) = directive(settings);
        if &wanted != current {
            match EnvFilter::try_new(&wanted) {
                Ok(f) => match self.filter.reload(f) {
                    Ok(()) => {
                        tracing::info!(level = %wanted, "log level changed");
                        self.level = Some(wanted);
                    }
                    Err(e) => tracing::warn!(error = %e, "log level not changed"),
                },
                Err(e) => tracing::warn!(error = %e, "log level not changed"),
            }
        }
        restart
    }
}

/// Where log lines go: stderr, stdout or a file reopened after SIGUSR1.
#[derive(Clone)]
pub struct ErrorLog {
    target: Arc<Target>,
}

enum Target {
    Stderr,
    Stdout,
    File {
        path: PathBuf,
        reopen: LogReopen,
        /// The open file and the reopen generation it was opened at.
        file: Mutex<Option<(u64, File)>>,
    },
}

impl ErrorLog {
    pub fn new(target: Option<&AccessLogTarget>, reopen: LogReopen) -> ErrorLog {
        let target = match target {
            None | Some(AccessLogTarget::Stderr) => Target::Stderr,
            Some(AccessLogTarget::Stdout) => Target::Stdout,
            // nginx cannot turn its error log off either (`error_log off` writes a file
            // called "off"); ferrisix keeps it on stderr.
            Some(AccessLogTarget::Off) => Target::Stderr,
            Some(AccessLogTarget::File(path)) => Target::File {
                path: path.clone(),
                reopen,
                file: Mutex::new(None),
            },
        };
        ErrorLog {
            target: Arc::new(target),
        }
    }

    fn is_terminal(&self) -> bool {
        use std::io::IsTerminal;
        match *self.target {
            Target::Stderr => io::stderr().is_terminal(),
            Target::Stdout => io::stdout().is_terminal(),
            Target::File { .. } => false,
        }
    }

    fn write_line(&self, buf: &[u8]) -> io::Result<()> {
        match &*self.target {
            Target::Stderr => io::stderr().lock().write_all(buf),
            Target::Stdout => io::stdout().lock().write_all(buf),
            Target::File { path, reopen, file } => {
                // Counted until the line is written: a rotation waits for it before it
                // compresses the file it moved away (see `LogReopen::settle`).
                let _writing = reopen.writing();
                let generation = reopen.generation();
                let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
                if file.as_ref().is_none_or(|(g, _)| *g != generation) {
                    *file = None;
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        let _ = std::fs::create_dir_all(dir);
                    }
                    let opened = OpenOptions::new().create(true).append(true).open(path);
                    match opened {
                        Ok(f) => *file = Some((generation, f)),
                        // Not lost: the line goes to stderr, and the next one tries again.
                        Err(e) => {
                            let mut err = io::stderr().lock();
                            let _ = writeln!(err, "ferrisix: cannot open {}: {e}", path.display());
                            return err.write_all(buf);
                        }
                    }
                }
                match file.as_mut() {
                    Some((_, f)) => f.write_all(buf),
                    None => io::stderr().lock().write_all(buf),
                }
            }
        }
    }
}

/// Hands the log's lines to the plugins' [`ErrorLogTap`] while one asks for them, written
/// as nginx's error log writes them: `2024/01/02 03:04:05 [warn] <pid>#0: <message>, <field>:
/// <value>, ...`.
struct Capture(Arc<ErrorLogTap>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        use ferrisix_plugin_api::error_log as level;
        let (rank, name) = match *event.metadata().level() {
            tracing::Level::ERROR => (level::ERROR, "error"),
            tracing::Level::WARN => (level::WARN, "warn"),
            tracing::Level::INFO => (level::INFO, "info"),
            tracing::Level::DEBUG => (level::DEBUG, "debug"),
            tracing::Level::TRACE => (level::TRACE, "debug"),
        };
        if !self.0.wants(rank) {
            return;
        }
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let mut line = match fields.0.remove("message") {
            Some(serde_json::Value::String(m)) => m,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        for (k, v) in &fields.0 {
            match v {
                serde_json::Value::String(s) => line.push_str(&format!(", {k}: {s}")),
                other => line.push_str(&format!(", {k}: {other}")),
            }
        }
        let t = ferrisix_plugin_api::clock::CivilTime::from_unix_secs(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        );
        self.0.push(
            rank,
            format!(
                "{:04}/{:02}/{:02} {:02}:{:02}:{:02} [{name}] {}#0: {line}",
                t.year,
                t.month,
                t.day,
                t.hour,
                t.minute,
                t.second,
                std::process::id()
            ),
        );
    }
}

/// One [`ErrorLog`] write (tracing formats each event whole, then writes it once).
pub struct ErrorLogWriter<'a>(&'a ErrorLog);

impl Write for ErrorLogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_line(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for ErrorLog {
    type Writer = ErrorLogWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        ErrorLogWriter(self)
    }
}

/// `ferrisix.log.format: json`: one object per line,
/// `{"timestamp", "level", "target", "fields": {"message", ...}, "spans": [...]}`.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let meta = event.metadata();
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let mut line = serde_json::Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("fields".into(), serde_json::Value::Object(fields.0));
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<serde_json::Value> =
                scope.from_root().map(|span| span.name().into()).collect();
            if !spans.is_empty() {
                line.insert("spans".into(), spans.into());
            }
        }
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// An event's fields as JSON values (numbers and booleans stay typed).
#[derive(Default)]
struct JsonFields(serde_json::Map<String, serde_json::Value>);

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn rustls_peer_input_warnings_stay_out_unless_named() {
        assert_eq!(quiet_peer_input("info".into()), "info,rustls::msgs=error");
        assert!(EnvFilter::try_new(quiet_peer_input("warn,ferrisix=debug".into())).is_ok());
        assert_eq!(quiet_peer_input("rustls=trace".into()), "rustls=trace");
    }

    #[test]
    fn json_lines_carry_typed_fields_and_spans() {
        let out = Captured::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .with_writer(move || sink.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("compile");
            let _in = span.enter();
            tracing::warn!(routes = 3_u64, ok = true, addr = %"127.0.0.1:9080", "served \"x\"");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["fields"]["message"], "served \"x\"");
        assert_eq!(line["fields"]["routes"], 3);
        assert_eq!(line["fields"]["ok"], true);
        assert_eq!(line["fields"]["addr"], "127.0.0.1:9080");
        assert_eq!(line["spans"], serde_json::json!(["compile"]));
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn a_file_log_is_reopened_after_the_signal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/error.log");
        let reopen = LogReopen::new();
        let log = ErrorLog::new(Some(&AccessLogTarget::File(path.clone())), reopen.clone());
        log.make_writer().write_all(b"one\n").unwrap();
        let rotated = dir.path().join("logs/error.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.make_writer().write_all(b"two\n").unwrap();
        reopen.trigger();
        log.make_writer().write_all(b"three\n").unwrap();
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three\n");
    }
}
