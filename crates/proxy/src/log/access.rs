//! The buffered access log: one line per request in nginx's combined style, driven by APISIX's
//! `access_log_format`.
//!
//! The format is parsed once into segments. Each worker thread appends finished lines to its
//! own buffer and writes it out in whole lines when it grows past 32 KiB or a second has passed
//! (nginx's `access_log ... buffer=` behaviour), so logging costs no lock and no syscall per
//! request. Files are opened in append mode so concurrent workers never interleave inside a line.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrisix_config::reopen::LogReopen;
use ferrisix_config::settings::LogEscape;
use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{preset_var, LateVarSource, RequestValues};
use http::{HeaderValue, Method, Uri, Version};
use smallvec::SmallVec;

use crate::log::record::UpstreamRecord;

const FLUSH_BYTES: usize = 32 * 1024;
const FLUSH_AFTER: Duration = Duration::from_secs(1);

/// Where lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogSink {
    Off,
    Stderr,
    Stdout,
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Var(Var),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    ProxyProtocolAddr,
    ProxyProtocolPort,
    RemoteUser,
    TimeLocal,
    TimeIso8601,
    Msec,
    Request,
    RequestMethod,
    RequestUri,
    Uri,
    ServerProtocol,
    Status,
    BodyBytesSent,
    RequestTime,
    RequestLength,
    /// An `http_<name>` header, by index into the record's captured headers.
    Header(usize),
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamScheme,
    UpstreamHost,
    UpstreamUri,
    ServerPort,
    Scheme,
    RouteId,
    /// `$consumer_name`: the consumer an auth plugin found.
    ConsumerName,
    /// `$request_type` and the `$llm_*` variables: an AI plugin's, else nginx.conf's presets.
    Late(Box<str>),
    Unknown,
}

/// A compiled `access_log_format` plus its sink.
#[derive(Debug)]
pub struct AccessLog {
    sink: LogSink,
    /// SIGUSR1: a file sink is reopened at the next write after it fires (logrotate).
    reopen: Option<LogReopen>,
    segments: Vec<Segment>,
    /// Header names the format reads, in capture order.
    headers: Vec<http::HeaderName>,
    /// The format has `$request_length` (its value costs a pass over the request's headers).
    request_length: bool,
    /// `access_log_format_escape`: how variables' values are written.
    escape: LogEscape,
    /// A failed write was reported (once per log, not once per line).
    warned: AtomicBool,
}

/// What one request leaves for its log line (what happened upstream is in its
/// [`UpstreamRecord`]).
#[derive(Debug)]
pub struct LogRecord {
    pub start: Instant,
    pub remote_addr: IpAddr,
    pub server_port: u16,
    /// The PROXY protocol header's client (`$proxy_protocol_addr`, `$proxy_protocol_port`).
    pub proxy_protocol: Option<std::net::SocketAddr>,
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: SmallVec<[Option<HeaderValue>; 4]>,
    pub status: u16,
    pub request_length: u64,
    pub body_bytes_sent: u64,
    pub route_id: Option<Arc<str>>,
    pub consumer_name: Option<String>,
    /// The values the request's plugins kept (an AI plugin's late variables among them).
    pub values: Option<Arc<RequestValues>>,
}

impl AccessLog {
    /// Parses an nginx-style format with `$var` and `${var}` references.
    pub fn new(sink: LogSink, format: &str) -> AccessLog {
        let mut segments = Vec::new();
        let mut headers: Vec<http::HeaderName> = Vec::new();
        let mut literal = String::new();
        let mut chars = format.char_indices().peekable();
        while let Some((_, c)) = chars.next() {
            if c != '$' {
                literal.push(c);
                continue;
            }
            let mut name = String::new();
            let braced = chars.peek().map(|(_, c)| *c) == Some('{');
            if braced {
                chars.next();
            }
            while let Some((_, c)) = chars.peek() {
                if c.is_ascii_alphanumeric() || *c == '_' {
                    name.push(*c);
                    chars.next();
                } else {
                    break;
                }
            }
            if braced && chars.peek().map(|(_, c)| *c) == Some('}') {
                chars.next();
            }
            if name.is_empty() {
                literal.push('$');
                continue;
            }
            if !literal.is_empty() {
                segments.push(Segment::Literal(std::mem::take(&mut literal)));
            }
            let var = match name.as_str() {
                "remote_addr" => Var::RemoteAddr,
                "proxy_protocol_addr" => Var::ProxyProtocolAddr,
                "proxy_protocol_port" => Var::ProxyProtocolPort,
                "remote_user" => Var::RemoteUser,
                "time_local" => Var::TimeLocal,
                "time_iso8601" => Var::TimeIso8601,
                "msec" => Var::Msec,
                "request" | "request_line" => Var::Request,
                "request_method" => Var::RequestMethod,
                "request_uri" => Var::RequestUri,
                "uri" => Var::Uri,
                "server_protocol" => Var::ServerProtocol,
                "status" => Var::Status,
                "body_bytes_sent" | "bytes_sent" => Var::BodyBytesSent,
                "request_time" => Var::RequestTime,
                "request_length" => Var::RequestLength,
                "upstream_addr" => Var::UpstreamAddr,
                "upstream_status" => Var::UpstreamStatus,
                "upstream_response_time" => Var::UpstreamResponseTime,
                "upstream_scheme" => Var::UpstreamScheme,
                "upstream_host" => Var::UpstreamHost,
                "upstream_uri" => Var::UpstreamUri,
                "server_port" => Var::ServerPort,
                "scheme" => Var::Scheme,
                "route_id" => Var::RouteId,
                "consumer_name" => Var::ConsumerName,
                "host" => Var::Header(capture(&mut headers, "host")),
                other => match other.strip_prefix("http_") {
                    Some(h) => Var::Header(capture(&mut headers, &h.replace('_', "-"))),
                    None if preset_var(other).is_some()
                        || other == "apisix_upstream_response_time" =>
                    {
                        Var::Late(other.into())
                    }
                    None => Var::Unknown,
                },
            };
            segments.push(Segment::Var(var));
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        let request_length = segments.contains(&Segment::Var(Var::RequestLength));
        AccessLog {
            sink,
            reopen: None,
            segments,
            headers,
            request_length,
            escape: LogEscape::Default,
            warned: AtomicBool::new(false),
        }
    }

    /// Writes variables' values escaped as nginx's `log_format ... escape=` does.
    pub fn with_escape(mut self, escape: LogEscape) -> AccessLog {
        self.escape = escape;
        self
    }

    /// Reopens a file sink whenever `reopen` fires.
    pub fn with_reopen(mut self, reopen: LogReopen) -> AccessLog {
        self.reopen = Some(reopen);
        self
    }

    fn reopen_generation(&self) -> u64 {
        self.reopen.as_ref().map_or(0, LogReopen::generation)
    }

    pub fn enabled(&self) -> bool {
        self.sink != LogSink::Off
    }

    /// Whether a record must carry `$request_length`.
    pub fn wants_request_length(&self) -> bool {
        self.enabled() && self.request_length
    }

    /// Header names whose values a record must capture, in order.
    pub fn captured_headers(&self) -> &[http::HeaderName] {
        &self.headers
    }

    /// `at` is when the line is written: the log phase's one clock read (the end of the
    /// request) and the wall time it stands for.
    fn format(&self, r: &LogRecord, up: &UpstreamRecord, at: &LineTime, out: &mut Vec<u8>) {
        for seg in &self.segments {
            match seg {
                Segment::Literal(s) => out.extend_from_slice(s.as_bytes()),
                Segment::Var(v) => {
                    let start = out.len();
                    if r.write_var(v, up, at, out) {
                        if v.is_text() {
                            escape_from(self.escape, out, start);
                        }
                    } else if self.escape == LogEscape::Default {
                        // nginx: a variable without a value is `-`, except with `json` or
                        // `none`, where it is left empty.
                        out.push(b'-');
                    }
                }
            }
        }
        out.push(b'\n');
    }
}

/// The bytes `escape=default` (`json` when `json`) writes escaped.
const fn escapes(json: bool) -> [bool; 256] {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        table[i] = b == b'"' || b == b'\\' || b < 32 || (!json && b > 126);
        i += 1;
    }
    table
}

static DEFAULT_ESCAPES: [bool; 256] = escapes(false);
static JSON_ESCAPES: [bool; 256] = escapes(true);

/// nginx escapes each variable's value, never the format's own text: `default` writes `"`,
/// `\` and bytes below 32 or above 126 as `\xHH` (upper-case hex), `json` escapes as a JSON
/// string (`\"`, `\\`, `\n` and the like, other control bytes as `\u00HH`), `none` leaves
/// the value as it is. A header value can hold `"` and bytes above 126: unescaped, a
/// client could end a quoted field of the line early.
fn escape_from(escape: LogEscape, out: &mut Vec<u8>, start: usize) {
    let table = match escape {
        LogEscape::Default => &DEFAULT_ESCAPES,
        LogEscape::Json => &JSON_ESCAPES,
        LogEscape::NoEscape => return,
    };
    let needs = |b: u8| table[usize::from(b)];
    // Most values need nothing: one scan, no copy.
    let Some(first) = out[start..].iter().position(|&b| needs(b)) else {
        return;
    };
    let tail = out.split_off(start + first);
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in tail {
        if !needs(b) {
            out.push(b);
            continue;
        }
        match escape {
            LogEscape::Default => out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
            _ => match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                _ => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]),
            },
        }
    }
}

fn capture(headers: &mut Vec<http::HeaderName>, name: &str) -> usize {
    let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap_or(http::header::HOST);
    match headers.iter().position(|h| *h == name) {
        Some(i) => i,
        None => {
            headers.push(name);
            headers.len() - 1
        }
    }
}

/// A header's bytes as they came (the escape deals with what is not printable ASCII); `false`
/// when it is absent.
fn push_header(out: &mut Vec<u8>, v: Option<&HeaderValue>) -> bool {
    match v {
        Some(v) => {
            out.extend_from_slice(v.as_bytes());
            true
        }
        None => false,
    }
}

impl Var {
    /// Whether a value of this variable can hold a byte that an escape rewrites: the request's
    /// own text, headers, names. Numbers, addresses and times cannot, so their bytes are not
    /// scanned.
    fn is_text(&self) -> bool {
        matches!(
            self,
            Var::Request
                | Var::RequestMethod
                | Var::RequestUri
                | Var::UpstreamUri
                | Var::Uri
                | Var::Header(_)
                | Var::UpstreamHost
                | Var::RouteId
                | Var::ConsumerName
                | Var::Late(_)
        )
    }
}

impl LogRecord {
    /// `$request_type` and the `$llm_*` variables: an AI plugin's, else nginx.conf's presets.
    /// Out of line and not calling back into [`LogRecord::write_var`], so that one stays a
    /// plain match the line's loop can inline.
    #[inline(never)]
    fn write_late(&self, name: &str, up: &UpstreamRecord, now: Instant, out: &mut Vec<u8>) -> bool {
        let late = self
            .values
            .as_deref()
            .and_then(|v| v.get::<LateVarSource>())
            .and_then(|s| s.0.late_var(name));
        match late {
            Some(v) => out.extend_from_slice(v.as_bytes()),
            // nginx.conf: `set $apisix_upstream_response_time $upstream_response_time;`
            None if name == "apisix_upstream_response_time" => match up.start {
                Some(s) => push_secs_ms(out, now.saturating_duration_since(s)),
                None => return false,
            },
            None => out.extend_from_slice(preset_var(name).unwrap_or("").as_bytes()),
        }
        true
    }

    /// Writes `v`'s value; `false` (nothing written) when it has none.
    fn write_var(&self, v: &Var, up: &UpstreamRecord, at: &LineTime, out: &mut Vec<u8>) -> bool {
        let now = at.now;
        match v {
            Var::RemoteAddr => push_ip(out, self.remote_addr),
            Var::ProxyProtocolAddr => match self.proxy_protocol {
                Some(pp) => push_ip(out, pp.ip()),
                None => return false,
            },
            Var::ProxyProtocolPort => match self.proxy_protocol {
                Some(pp) => push_int(out, pp.port()),
                None => return false,
            },
            Var::RemoteUser | Var::Unknown => return false,
            // nginx's `$time_local`, `$time_iso8601` and `$msec` are the time of the log write.
            Var::TimeLocal => {
                TIME.with(|t| out.extend_from_slice(t.borrow_mut().local(at.wall).as_bytes()))
            }
            Var::TimeIso8601 => {
                TIME.with(|t| out.extend_from_slice(t.borrow_mut().iso(at.wall).as_bytes()))
            }
            Var::Msec => push_secs_ms(out, at.wall.duration_since(UNIX_EPOCH).unwrap_or_default()),
            Var::Request => {
                out.extend_from_slice(self.method.as_str().as_bytes());
                out.push(b' ');
                out.extend_from_slice(request_uri(&self.uri).as_bytes());
                out.push(b' ');
                out.extend_from_slice(protocol(self.version).as_bytes());
            }
            Var::RequestMethod => out.extend_from_slice(self.method.as_str().as_bytes()),
            Var::RequestUri | Var::UpstreamUri => {
                out.extend_from_slice(request_uri(&self.uri).as_bytes())
            }
            Var::Uri => out.extend_from_slice(self.uri.path().as_bytes()),
            Var::ServerProtocol => out.extend_from_slice(protocol(self.version).as_bytes()),
            Var::Status => push_int(out, self.status),
            Var::BodyBytesSent => push_int(out, self.body_bytes_sent),
            Var::RequestTime => push_secs_ms(out, now.saturating_duration_since(self.start)),
            Var::RequestLength => push_int(out, self.request_length),
            Var::Header(i) => {
                return push_header(out, self.headers.get(*i).and_then(Option::as_ref))
            }
            Var::UpstreamAddr => return join(out, &up.addrs),
            Var::UpstreamStatus => return join(out, &up.statuses),
            Var::UpstreamResponseTime => match up.start {
                Some(s) => push_secs_ms(out, now.saturating_duration_since(s)),
                None => return false,
            },
            Var::UpstreamScheme | Var::Scheme => out.extend_from_slice(b"http"),
            Var::UpstreamHost => return push_header(out, up.host.as_ref()),
            Var::ServerPort => push_int(out, self.server_port),
            Var::RouteId => match &self.route_id {
                Some(id) => out.extend_from_slice(id.as_bytes()),
                None => return false,
            },
            Var::Late(name) => return self.write_late(name, up, now, out),
            Var::ConsumerName => match &self.consumer_name {
                Some(name) => out.extend_from_slice(name.as_bytes()),
                None => return false,
            },
        }
        true
    }

    /// Formats the line into this worker's buffer; `now` is the end of the request.
    pub fn finish(&self, log: &Arc<AccessLog>, up: &UpstreamRecord, now: Instant) {
        if !log.enabled() {
            return;
        }
        WORKER_BUFFER.with(|b| {
            let mut b = b.borrow_mut();
            b.use_sink(log);
            let at = LineTime {
                now,
                wall: b.wall_at(now),
            };
            log.format(self, up, &at, &mut b.data);
            b.line_written(now);
        });
    }
}

fn request_uri(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

// The line is written without `fmt`: its machinery (and float formatting above all) was the
// larger part of the access log's cost per request. It is written as bytes, straight into
// the worker's buffer: a `String` would need a UTF-8 check wherever digits are assembled on
// the stack, and a second copy into the buffer.

fn push_int<I: itoa::Integer>(out: &mut Vec<u8>, n: I) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// nginx's `%T.%03M` (`$request_time`, `$msec`): seconds and milliseconds, truncated.
fn push_secs_ms(out: &mut Vec<u8>, d: Duration) {
    let ms = d.as_millis();
    push_int(out, ms / 1000);
    let frac = (ms % 1000) as u32;
    out.push(b'.');
    for digit in [frac / 100, frac / 10 % 10, frac % 10] {
        out.push(b'0' + digit as u8);
    }
}

fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // Formatted on the stack and appended once: seven appends of itoa's strings cost
            // twice as much.
            let mut buf = [0u8; 15];
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            out.extend_from_slice(&buf[..n]);
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// A value of `$upstream_addr` / `$upstream_status`.
trait LogValue {
    fn push_to(&self, out: &mut Vec<u8>);
}

impl LogValue for u16 {
    fn push_to(&self, out: &mut Vec<u8>) {
        push_int(out, *self);
    }
}

impl LogValue for SocketAddr {
    fn push_to(&self, out: &mut Vec<u8>) {
        match self {
            SocketAddr::V4(a) => {
                push_ip(out, IpAddr::V4(*a.ip()));
                out.push(b':');
                push_int(out, a.port());
            }
            SocketAddr::V6(a) => {
                let _ = write!(out, "{a}");
            }
        }
    }
}

/// The values joined by `, `; `false` when there are none.
fn join<T: LogValue>(out: &mut Vec<u8>, items: &[T]) -> bool {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        item.push_to(out);
    }
    !items.is_empty()
}

/// When a line is written: the monotonic reading and its wall-clock time.
#[derive(Clone, Copy, Debug)]
struct LineTime {
    now: Instant,
    wall: SystemTime,
}

/// How long a worker's wall-clock anchor serves before it is read again.
const WALL_ANCHOR_FOR: Duration = Duration::from_secs(1);

struct WorkerBuffer {
    data: Vec<u8>,
    last_flush: Instant,
    /// A monotonic reading and the wall time read with it. A line's wall time is derived
    /// from its monotonic reading, so a request reads the wall clock no more (a clock read is
    /// a measurable share of a request's instructions: `benches/e2e/instructions.py` counts
    /// them); a wall-clock step shows within a second.
    wall_anchor: (Instant, SystemTime),
    /// The open file, its path and the reopen generation it was opened at.
    file: Option<(PathBuf, u64, File)>,
    sink: Option<Arc<AccessLog>>,
}

thread_local! {
    static WORKER_BUFFER: RefCell<WorkerBuffer> = RefCell::new(WorkerBuffer {
        data: Vec::with_capacity(FLUSH_BYTES * 2),
        last_flush: Instant::now(),
        wall_anchor: (Instant::now(), SystemTime::now()),
        file: None,
        sink: None,
    });
    static TIME: RefCell<TimeCache> = RefCell::new(TimeCache::default());
}

impl WorkerBuffer {
    /// Makes `log` the sink of what is buffered next.
    fn use_sink(&mut self, log: &Arc<AccessLog>) {
        if !self.sink.as_ref().is_some_and(|s| Arc::ptr_eq(s, log)) {
            // A new log (config.yaml re-read): what the old one buffered goes to its own sink.
            self.flush();
            self.sink = Some(log.clone());
        }
    }

    /// The wall time of the monotonic reading `now` (no later than a second after the
    /// anchor's, which is then read again).
    fn wall_at(&mut self, now: Instant) -> SystemTime {
        let (mono, wall) = self.wall_anchor;
        match now.checked_duration_since(mono) {
            Some(d) if d < WALL_ANCHOR_FOR => wall + d,
            _ => {
                let wall = SystemTime::now();
                self.wall_anchor = (now, wall);
                wall
            }
        }
    }

    /// After a line was buffered at `now` (the request's end: no clock read of its own).
    fn line_written(&mut self, now: Instant) {
        if self.data.len() >= FLUSH_BYTES
            || now.saturating_duration_since(self.last_flush) >= FLUSH_AFTER
        {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.last_flush = Instant::now();
        if self.data.is_empty() {
            return;
        }
        let Some(log) = self.sink.clone() else { return };
        let result = match &log.sink {
            LogSink::Off => Ok(()),
            LogSink::Stderr => std::io::stderr().lock().write_all(&self.data),
            LogSink::Stdout => std::io::stdout().lock().write_all(&self.data),
            LogSink::File(path) => {
                // Counted from before the generation is read until the bytes are written, so
                // that a rotation can wait for this write before it compresses the file it
                // moved away (see `LogReopen::settle`).
                let _writing = log.reopen.as_ref().map(LogReopen::writing);
                let generation = log.reopen_generation();
                if self
                    .file
                    .as_ref()
                    .is_none_or(|(p, g, _)| p != path || *g != generation)
                {
                    self.file = open_append(path).map(|f| (path.clone(), generation, f));
                }
                match &mut self.file {
                    Some((_, _, f)) => f.write_all(&self.data),
                    None => Ok(()),
                }
            }
        };
        if let Err(e) = result {
            if !log.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "access log write failed");
            }
        }
        self.data.clear();
    }
}

fn open_append(path: &PathBuf) -> Option<File> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot open access log");
            None
        }
    }
}

/// Writes out this worker's buffered lines; each worker calls it every second and at exit.
pub fn flush_worker() {
    WORKER_BUFFER.with(|b| b.borrow_mut().flush());
}

/// Formats `time_local` once per second per thread.
#[derive(Default)]
struct TimeCache {
    secs: u64,
    local: String,
    iso_secs: u64,
    iso: String,
}

impl TimeCache {
    fn local(&mut self, t: SystemTime) -> &str {
        let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if secs != self.secs || self.local.is_empty() {
            self.local.clear();
            let _ = write!(
                self.local,
                "{}",
                CivilTime::from_unix_secs(secs).time_local()
            );
            self.secs = secs;
        }
        &self.local
    }

    fn iso(&mut self, t: SystemTime) -> &str {
        let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if secs != self.iso_secs || self.iso.is_empty() {
            self.iso.clear();
            let _ = write!(self.iso, "{}", CivilTime::from_unix_secs(secs).iso8601());
            self.iso_secs = secs;
        }
        &self.iso
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// logrotate moves the file away and sends SIGUSR1: the next lines go to a new file at the
    /// configured path, none is lost.
    #[test]
    fn a_file_sink_is_reopened_when_the_signal_fires() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let reopen = LogReopen::new();
        let log = Arc::new(
            AccessLog::new(LogSink::File(path.clone()), "$status").with_reopen(reopen.clone()),
        );
        let write = |line: &[u8]| {
            WORKER_BUFFER.with(|b| {
                let mut b = b.borrow_mut();
                b.use_sink(&log);
                b.data.extend_from_slice(line);
                b.flush();
            })
        };
        write(b"first\n");
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        write(b"second\n");
        reopen.trigger();
        write(b"third\n");
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap(),
            "first\nsecond\n"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "third\n");
    }

    /// A buffered line goes out once the request that wrote it ends FLUSH_AFTER after the
    /// last flush (the request's own end time: the buffer reads no clock per line).
    #[test]
    fn lines_are_flushed_by_size_or_by_the_end_time_of_a_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = Arc::new(AccessLog::new(LogSink::File(path.clone()), "$status"));
        let written = || std::fs::read_to_string(&path).unwrap_or_default();
        WORKER_BUFFER.with(|b| {
            let mut b = b.borrow_mut();
            b.use_sink(&log);
            b.flush();
            let last = b.last_flush;
            b.data.extend_from_slice(b"200\n");
            b.line_written(last + FLUSH_AFTER / 2);
            assert_eq!(written(), "");
            b.data.extend_from_slice(b"404\n");
            b.line_written(last + FLUSH_AFTER);
            assert_eq!(written(), "200\n404\n");
            let full = b.data.len() + FLUSH_BYTES;
            b.data.resize(full, b'x');
            let last = b.last_flush;
            b.line_written(last);
            assert_eq!(written().len(), 8 + FLUSH_BYTES);
        });
    }

    #[test]
    fn every_ipv4_octet_is_written_as_display_writes_it() {
        for o in 0..=255u8 {
            for ip in [
                [o, 0, 0, 1],
                [255, o, 9, 10],
                [1, 22, o, 255],
                [100, 99, 10, o],
            ] {
                let ip = IpAddr::from(ip);
                let mut out = b"x".to_vec();
                push_ip(&mut out, ip);
                assert_eq!(String::from_utf8(out).unwrap(), format!("x{ip}"));
            }
        }
    }

    #[test]
    fn numbers_and_addresses_are_written_as_nginx_does() {
        let mut out = Vec::new();
        push_secs_ms(&mut out, Duration::from_micros(1_234_567));
        out.push(b' ');
        push_secs_ms(&mut out, Duration::from_micros(999));
        out.push(b' ');
        push_secs_ms(&mut out, Duration::from_millis(60_050));
        out.push(b' ');
        push_ip(&mut out, "10.0.200.7".parse().unwrap());
        out.push(b' ');
        push_ip(&mut out, "::1".parse().unwrap());
        out.push(b' ');
        let addrs: [SocketAddr; 2] = [
            "127.0.0.1:1980".parse().unwrap(),
            "[::1]:80".parse().unwrap(),
        ];
        join(&mut out, &addrs);
        out.push(b' ');
        join::<u16>(&mut out, &[502, 200]);
        out.push(b' ');
        out.extend_from_slice(protocol(Version::HTTP_10).as_bytes());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1.234 0.000 60.050 10.0.200.7 ::1 127.0.0.1:1980, [::1]:80 502, 200 HTTP/1.0"
        );
    }

    #[test]
    fn only_a_format_with_request_length_asks_for_it() {
        let file = LogSink::File(PathBuf::from("/dev/null"));
        assert!(AccessLog::new(file.clone(), "$status ${request_length}").wants_request_length());
        assert!(!AccessLog::new(file, "$status $request_time").wants_request_length());
        assert!(!AccessLog::new(LogSink::Off, "$request_length").wants_request_length());
    }

    /// `value` appended to a literal and escaped from the value's start.
    fn escaped(escape: LogEscape, value: &[u8]) -> Vec<u8> {
        let mut out = b"lit\"".to_vec();
        out.extend_from_slice(value);
        escape_from(escape, &mut out, 4);
        out
    }

    #[test]
    fn values_are_escaped_as_nginx_escapes_them() {
        let raw = b"a\"b\\c\td\x01e\x7ff\x80g\xffh\ni\rj\x08k\x0cl";
        assert_eq!(
            escaped(LogEscape::Default, raw),
            b"lit\"a\\x22b\\x5Cc\\x09d\\x01e\\x7Ff\\x80g\\xFFh\\x0Ai\\x0Dj\\x08k\\x0Cl"
        );
        // JSON: quotes, backslashes and control bytes; DEL and bytes above 127 as they are.
        assert_eq!(
            escaped(LogEscape::Json, raw),
            b"lit\"a\\\"b\\\\c\\td\\u0001e\x7ff\x80g\xffh\\ni\\rj\\bk\\fl"
        );
        assert_eq!(escaped(LogEscape::Json, b"\x1f"), b"lit\"\\u001F");
        let mut none = b"lit\"".to_vec();
        none.extend_from_slice(raw);
        assert_eq!(escaped(LogEscape::NoEscape, raw), none);
        assert_eq!(
            escaped(LogEscape::Default, b"plain/text 1.0"),
            b"lit\"plain/text 1.0"
        );
    }

    /// A GET / from 127.0.0.1 answered 200, whose captured header `name` (if `log` reads it)
    /// is `value`.
    fn record(log: &AccessLog, name: &str, value: Option<HeaderValue>) -> LogRecord {
        LogRecord {
            start: Instant::now(),
            remote_addr: "127.0.0.1".parse().unwrap(),
            server_port: 9080,
            proxy_protocol: None,
            method: Method::GET,
            uri: "/".parse().unwrap(),
            version: Version::HTTP_11,
            headers: log
                .captured_headers()
                .iter()
                .map(|h| {
                    if h.as_str() == name {
                        value.clone()
                    } else {
                        None
                    }
                })
                .collect(),
            status: 200,
            request_length: 0,
            body_bytes_sent: 0,
            route_id: None,
            consumer_name: None,
            values: None,
        }
    }

    /// A variable without a value is `-` by default and empty with `json` or `none`; a header
    /// that is present but empty is empty in every mode; the format's own text is never
    /// escaped.
    #[test]
    fn missing_values_and_the_escape_modes() {
        let line = |escape: LogEscape, referer: Option<&'static [u8]>| {
            let log = AccessLog::new(
                LogSink::Off,
                "\"$http_referer\" \"$http_user_agent\" $remote_user $route_id",
            )
            .with_escape(escape);
            let mut r = record(
                &log,
                "referer",
                referer.map(|r| HeaderValue::from_bytes(r).unwrap()),
            );
            r.route_id = Some(Arc::from("r\"1"));
            let mut out = Vec::new();
            let at = LineTime {
                now: Instant::now(),
                wall: UNIX_EPOCH,
            };
            log.format(&r, &UpstreamRecord::default(), &at, &mut out);
            out
        };
        assert_eq!(
            line(LogEscape::Default, Some(b"x\"y\x80")),
            b"\"x\\x22y\\x80\" \"-\" - r\\x221\n"
        );
        assert_eq!(
            line(LogEscape::Json, Some(b"x\"y")),
            b"\"x\\\"y\" \"\"  r\\\"1\n"
        );
        assert_eq!(line(LogEscape::NoEscape, None), b"\"\" \"\"  r\"1\n");
        assert_eq!(
            line(LogEscape::Default, Some(b"")),
            b"\"\" \"-\" - r\\x221\n"
        );
    }

    #[test]
    fn llm_variables_come_from_the_ai_plugin_or_nginx_presets() {
        #[derive(Debug)]
        struct Ai;
        impl ferrisix_plugin_api::LateVars for Ai {
            fn late_var(&self, name: &str) -> Option<String> {
                match name {
                    "request_type" => Some("ai_chat".into()),
                    "llm_model" => Some("gpt \"4\"".into()),
                    "llm_prompt_tokens" => Some("12".into()),
                    _ => None,
                }
            }
        }
        let log = AccessLog::new(
            LogSink::Off,
            "$request_type $llm_model $llm_prompt_tokens $llm_completion_tokens $llm_stream $no_such_var $apisix_upstream_response_time",
        );
        let at = LineTime {
            now: Instant::now(),
            wall: UNIX_EPOCH,
        };
        let mut out = Vec::new();
        let plain = record(&log, "", None);
        log.format(&plain, &UpstreamRecord::default(), &at, &mut out);
        // A request no AI plugin served: nginx.conf's `set` values (an empty one stays empty,
        // as a set variable is found).
        assert_eq!(
            String::from_utf8(std::mem::take(&mut out)).unwrap(),
            "traditional_http  0 0 false - -\n"
        );
        let mut ai = record(&log, "", None);
        let mut values = RequestValues::default();
        values.insert(LateVarSource(Arc::new(Ai)));
        ai.values = Some(Arc::new(values));
        log.format(&ai, &UpstreamRecord::default(), &at, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ai_chat gpt \\x224\\x22 12 0 false - -\n"
        );
    }

    #[test]
    fn formats_a_combined_line() {
        let log = Arc::new(AccessLog::new(
            LogSink::Off,
            "$remote_addr - $remote_user [$time_local] $http_host \"$request_line\" $status $body_bytes_sent \"$http_user_agent\" $upstream_addr $upstream_status",
        ));
        let mut r = record(&log, "host", Some(HeaderValue::from_static("a.com")));
        r.uri = "/hello?a=1".parse().unwrap();
        r.body_bytes_sent = 12;
        let up = UpstreamRecord {
            addrs: smallvec::smallvec!["127.0.0.1:1980".parse().unwrap()],
            statuses: smallvec::smallvec![200],
            ..Default::default()
        };
        let mut out = Vec::new();
        let at = LineTime {
            now: Instant::now(),
            wall: UNIX_EPOCH + Duration::from_secs(1_796_001_828),
        };
        log.format(&r, &up, &at, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [30/Nov/2026:01:23:48 +0000] a.com \"GET /hello?a=1 HTTP/1.1\" 200 12 \"-\" 127.0.0.1:1980 200\n"
        );
    }

    /// A line's wall time comes from the worker's anchor for a second after it was read (the
    /// anchor here is a day off the real clock, so a fresh read would show), then from the
    /// wall clock again.
    #[test]
    fn wall_time_from_the_anchor_for_a_second() {
        let day = Duration::from_secs(86_400);
        let base = Instant::now();
        let mut b = WorkerBuffer {
            data: Vec::new(),
            last_flush: base,
            wall_anchor: (base, SystemTime::now() - day),
            file: None,
            sink: None,
        };
        let anchored = b.wall_anchor.1;
        let later = base + Duration::from_millis(999);
        assert_eq!(b.wall_at(base), anchored);
        assert_eq!(b.wall_at(later), anchored + Duration::from_millis(999));
        let before = SystemTime::now();
        let reread = b.wall_at(base + Duration::from_secs(1));
        assert!(
            reread >= before,
            "a second on, the wall clock is read again"
        );
        assert_eq!(b.wall_anchor, (base + Duration::from_secs(1), reread));
        assert_eq!(
            b.wall_at(base + Duration::from_millis(1500)),
            reread + Duration::from_millis(500)
        );
    }
}
