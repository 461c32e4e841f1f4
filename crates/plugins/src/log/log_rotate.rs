//! log-rotate (`apisix/plugins/log-rotate.lua`): the gateway's own access log
//! (`nginx_config.http.access_log`) and error log (`nginx_config.error_log`) are moved aside
//! every `interval` seconds, on the interval's boundaries, or as soon as one reaches `max_size`
//! bytes, as `<dir>/<YYYY-MM-DD_HH-MM-SS>__<name>`; the writers then reopen their path
//! ([`LogReopen`]), with `enable_compression` the moved file becomes
//! `<date>__<name>.tar.gz` (a tar archive of the one file, gzipped, as APISIX's `tar -zcf`),
//! and of the moved files of each log only the `max_kept` newest by name are kept. The
//! settings are config.yaml's `plugin_attr.log-rotate` (`interval`, `max_kept`, `max_size`,
//! `enable_compression`, `timeout`); the plugin's own conf is an empty object, and it runs only
//! from config.yaml's `plugins` list (APISIX's default list leaves it out).
//!
//! The rotation runs on a one-second timer off the request path ([`LogRotator::run`]); the
//! writers keep their own design: the access log's per-worker buffers and the error log's
//! writer reopen their path at their next write after the reopen generation moved. What the
//! rotation adds to them is one atomic count per buffer written ([`LogReopen::writing`]), so
//! that it can wait until nothing writes to the moved file before compressing it: every line
//! lands in exactly one file.
//!
//! The dates in the names are local time, as APISIX's `os.date` gives them: the zone `TZ`
//! names, else `/etc/localtime`. Not as APISIX: a log going to stderr or stdout (ferrisix's default error log) is not rotated; a
//! log file that does not exist yet (no request was logged) is not rotated; and a rotation
//! whose target name is taken (two in one second) waits for the next second instead of
//! stapling onto the file already there.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{LogReopen, PluginDef, Scope};
use serde_json::{json, Value};

use crate::support::inert;

pub const NAME: &str = "log-rotate";

/// The plugin does nothing per request: the rotation is the timer's.
pub static DEF: PluginDef = PluginDef {
    scope: Scope::Global,
    ..PluginDef::new(NAME, 100, schema, inert::compile)
};

fn schema() -> Value {
    json!({"type": "object", "properties": {}})
}

/// APISIX's suffix of a compressed log.
const COMPRESSED_SUFFIX: &str = ".tar.gz";

/// `plugin_attr.log-rotate`, with APISIX's defaults (`apisix/cli/config.lua`).
#[derive(Clone, Debug, PartialEq)]
pub struct RotateAttr {
    /// Seconds between rotations (on multiples of it since the epoch).
    pub interval: u64,
    /// Moved files kept per log.
    pub max_kept: u64,
    /// Bytes at which a log is rotated before its time; 0 or less: no size check.
    pub max_size: i64,
    pub enable_compression: bool,
    /// How long a rotation waits for the writers and its compression may take.
    pub timeout: Duration,
}

impl Default for RotateAttr {
    fn default() -> Self {
        RotateAttr {
            interval: 3600,
            max_kept: 168,
            max_size: -1,
            enable_compression: false,
            timeout: Duration::from_millis(10_000),
        }
    }
}

impl RotateAttr {
    /// Reads `plugin_attr.log-rotate` (`None`: absent). An error names the key and what it
    /// wants, as config.yaml's other errors do.
    pub fn from_attr(attr: Option<&Value>) -> Result<RotateAttr, String> {
        let mut out = RotateAttr::default();
        let Some(attr) = attr else {
            return Ok(out);
        };
        let Some(map) = attr.as_object() else {
            return Err(format!(
                "plugin_attr.log-rotate: invalid type: {attr}, expected a map"
            ));
        };
        let int = |key: &str| -> Result<Option<i64>, String> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                    format!("plugin_attr.log-rotate.{key}: invalid value: {v}, expected an integer")
                }),
            }
        };
        if let Some(i) = int("interval")? {
            out.interval = u64::try_from(i).ok().filter(|i| *i > 0).ok_or_else(|| {
                format!("plugin_attr.log-rotate.interval: invalid value: {i}, expected a number of seconds, 1 or more")
            })?;
        }
        if let Some(k) = int("max_kept")? {
            out.max_kept = u64::try_from(k).map_err(|_| {
                format!("plugin_attr.log-rotate.max_kept: invalid value: {k}, expected a count, 0 or more")
            })?;
        }
        if let Some(s) = int("max_size")? {
            out.max_size = s;
        }
        if let Some(t) = int("timeout")? {
            out.timeout = u64::try_from(t)
                .ok()
                .filter(|t| *t > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    format!("plugin_attr.log-rotate.timeout: invalid value: {t}, expected milliseconds, 1 or more")
                })?;
        }
        match map.get("enable_compression") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => out.enable_compression = *b,
            Some(v) => {
                return Err(format!(
                "plugin_attr.log-rotate.enable_compression: invalid value: {v}, expected a boolean"
            ))
            }
        }
        for key in map.keys() {
            if ![
                "interval",
                "max_kept",
                "max_size",
                "enable_compression",
                "timeout",
            ]
            .contains(&key.as_str())
            {
                tracing::warn!("unknown key `plugin_attr.log-rotate.{key}` ignored");
            }
        }
        Ok(out)
    }
}

/// One log the rotation moves: `path` as its writer opens it, and the writers' reopen signal.
#[derive(Clone, Debug)]
pub struct RotatedLog {
    /// APISIX's name for it in messages: `access.log` or `error.log`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub reopen: LogReopen,
}

impl RotatedLog {
    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.kind.to_owned())
    }

    /// Where the rotation at `date` moves it.
    fn moved_to(&self, date: &str) -> PathBuf {
        self.dir().join(format!("{date}__{}", self.file_name()))
    }
}

/// The timer's state: when the next rotation is due, and what it moves.
#[derive(Debug)]
pub struct LogRotator {
    attr: RotateAttr,
    /// The error log first, then the access log, as APISIX orders them.
    logs: Vec<RotatedLog>,
    /// The next rotation's time (seconds since the epoch); `None` before the first tick.
    rotate_time: Option<u64>,
    /// The zone of the moved files' names: the local one (`None`), or a fixed offset.
    zone: Option<chrono::FixedOffset>,
}

/// APISIX's `os.date("%Y-%m-%d_%H-%M-%S")` of `secs`: the local time, in the zone that `TZ`
/// names (a zone file or a POSIX rule such as `CST-8`) or else `/etc/localtime`, as the C
/// library reads them for `os.date`.
fn date_name(secs: u64, zone: Option<chrono::FixedOffset>) -> String {
    match zone {
        Some(fixed) => date_name_in(secs, &fixed),
        None => date_name_in(secs, &chrono::Local),
    }
}

/// [`date_name`] in the zone `tz`; in UTC where `secs` is beyond what the calendar can hold.
fn date_name_in<Tz: chrono::TimeZone>(secs: u64, tz: &Tz) -> String
where
    Tz::Offset: std::fmt::Display,
{
    match i64::try_from(secs)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
    {
        Some(utc) => utc
            .with_timezone(tz)
            .format("%Y-%m-%d_%H-%M-%S")
            .to_string(),
        None => {
            let t = CivilTime::from_unix_secs(secs);
            format!(
                "{:04}-{:02}-{:02}_{:02}-{:02}-{:02}",
                t.year, t.month, t.day, t.hour, t.minute, t.second
            )
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl LogRotator {
    pub fn new(attr: RotateAttr, logs: Vec<RotatedLog>) -> LogRotator {
        LogRotator {
            attr,
            logs,
            rotate_time: None,
            zone: None,
        }
    }

    /// Ticks once a second until the runtime ends, each tick off the runtime's threads (file
    /// moves and compression block).
    pub async fn run(mut self) {
        tracing::info!(
            interval = self.attr.interval,
            max_kept = self.attr.max_kept,
            max_size = self.attr.max_size,
            enable_compression = self.attr.enable_compression,
            logs = ?self.logs.iter().map(|l| l.path.display().to_string()).collect::<Vec<_>>(),
            "log-rotate: rotating"
        );
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let ticked = tokio::task::spawn_blocking(move || {
                self.tick(now_secs());
                self
            })
            .await;
            match ticked {
                Ok(me) => self = me,
                Err(e) => {
                    tracing::error!(error = %e, "log-rotate: the rotation failed; no more rotations");
                    return;
                }
            }
        }
    }

    /// One tick at `now` (seconds since the epoch): the first sets the first rotation time
    /// (the next multiple of `interval`); later ones rotate every log when it is due, else
    /// those at `max_size` or more.
    pub fn tick(&mut self, now: u64) {
        let interval = self.attr.interval.max(1);
        let Some(due) = self.rotate_time else {
            let first = now + interval - now % interval;
            tracing::info!("first init rotate time is: {first}");
            self.rotate_time = Some(first);
            return;
        };
        if now >= due {
            let all: Vec<RotatedLog> = self.logs.clone();
            self.rotate(&all, now);
            self.rotate_time = Some(due + interval);
        } else if self.attr.max_size > 0 {
            let max = self.attr.max_size as u64;
            let big: Vec<RotatedLog> = self
                .logs
                .iter()
                .filter(|l| std::fs::metadata(&l.path).is_ok_and(|m| m.len() >= max))
                .cloned()
                .collect();
            if !big.is_empty() {
                self.rotate(&big, now);
            }
        }
    }

    /// Moves `logs` aside under `now`'s date, has their writers reopen, compresses the moved
    /// files (when asked) once nothing writes to them, and deletes the oldest beyond
    /// `max_kept`.
    fn rotate(&self, logs: &[RotatedLog], now: u64) {
        let date = date_name(now, self.zone);
        let mut moved: Vec<(&RotatedLog, PathBuf)> = Vec::new();
        for log in logs {
            let to = log.moved_to(&date);
            let compressed = with_suffix(&to, COMPRESSED_SUFFIX);
            if to.exists() || compressed.exists() {
                tracing::info!("file exist: {}", to.display());
                continue;
            }
            match std::fs::rename(&log.path, &to) {
                Ok(()) => moved.push((log, to)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tracing::debug!(
                        "{} not rotated: {} does not exist yet",
                        log.kind,
                        log.path.display()
                    );
                }
                Err(e) => tracing::error!(
                    "move file from {} to {} res:false msg:{e}",
                    log.path.display(),
                    to.display()
                ),
            }
        }
        if moved.is_empty() {
            return;
        }
        // Each writer's signal once, though the two logs may share one.
        let mut signals: Vec<&LogReopen> = Vec::new();
        for (log, _) in &moved {
            if !signals.iter().any(|s| s.same_signal(&log.reopen)) {
                signals.push(&log.reopen);
            }
        }
        for s in &signals {
            s.trigger();
        }
        tracing::warn!("log-rotate: log files moved aside; the writers reopen their paths");
        if self.attr.enable_compression {
            let deadline = Instant::now() + self.attr.timeout;
            let settled = signals
                .iter()
                .all(|s| s.settle(deadline.saturating_duration_since(Instant::now())));
            if !settled {
                // A write still in flight would be lost with the uncompressed file.
                tracing::error!(
                    "log-rotate: writers still busy after {:?}; moved files left uncompressed",
                    self.attr.timeout
                );
            } else {
                for (_, file) in &moved {
                    compress(file, deadline);
                }
            }
        }
        for (log, _) in &moved {
            self.clean(log);
        }
    }

    /// Deletes the moved files of `log` beyond the `max_kept` newest (by name, which starts
    /// with the date): those named `<anything>__<name>` or `<anything>__<name>.tar.gz`.
    fn clean(&self, log: &RotatedLog) {
        let dir = log.dir();
        let name = log.file_name();
        let compressed = format!("{name}{COMPRESSED_SUFFIX}");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("log-rotate: cannot read {}: {e}", dir.display());
                return;
            }
        };
        let mut found: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|f| {
                f.rfind("__")
                    .map(|at| &f[at + 2..])
                    .is_some_and(|kind| kind == name || kind == compressed)
            })
            .collect();
        found.sort_by(|a, b| b.cmp(a));
        for old in found.iter().skip(self.attr.max_kept as usize) {
            let path = dir.join(old);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::error!("remove old log file: {} err: {e}", path.display());
            }
        }
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `file` becomes `file.tar.gz`, a tar archive holding it under its own name, gzipped; the
/// original is removed once the archive is whole and in place. On failure (or past `deadline`) the
/// original stays and the partial archive goes.
fn compress(file: &Path, deadline: Instant) {
    let archive = with_suffix(file, COMPRESSED_SUFFIX);
    // Written under a name of its own, then renamed: whoever reads the logs directory (a
    // shipper, `max_kept`'s count) never sees a partial archive under the final name.
    let partial = with_suffix(&archive, ".part");
    let written = write_tar_gz(file, &partial, deadline)
        .and_then(|()| std::fs::rename(&partial, &archive).map_err(|e| format!("rename: {e}")));
    match written {
        Ok(()) => {
            if let Err(e) = std::fs::remove_file(file) {
                tracing::error!(
                    "remove uncompressed log file: {} fail, err: {e}",
                    file.display()
                );
            }
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            tracing::error!(
                "compress log file from {} to {} fail: {e}",
                file.display(),
                archive.display()
            );
        }
    }
}

const BLOCK: usize = 512;

/// A ustar header for a regular file `name` of `size` bytes, mode 0644, modified at `mtime`.
fn tar_header(name: &str, size: u64, mtime: u64) -> Result<[u8; BLOCK], String> {
    let mut h = [0u8; BLOCK];
    if name.len() > 100 {
        return Err(format!("file name {name} longer than tar's 100 bytes"));
    }
    h[..name.len()].copy_from_slice(name.as_bytes());
    let mut field = |at: usize, width: usize, value: u64| {
        // Octal digits, zero-padded, then a NUL.
        let text = format!("{value:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(text.as_bytes());
    };
    field(100, 8, 0o644);
    field(108, 8, 0);
    field(116, 8, 0);
    if size >= 1 << 33 {
        return Err("file larger than tar's 8 GiB".into());
    }
    field(124, 12, size);
    field(136, 12, mtime);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum is the sum of the header's bytes with its own field as spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    Ok(h)
}

fn write_tar_gz(file: &Path, archive: &Path, deadline: Instant) -> Result<(), String> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("file name not UTF-8")?;
    let mut src = File::open(file).map_err(|e| e.to_string())?;
    let meta = src.metadata().map_err(|e| e.to_string())?;
    let size = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let out = File::create(archive).map_err(|e| e.to_string())?;
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&tar_header(name, size, mtime)?)
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = size;
    while left > 0 {
        if Instant::now() >= deadline {
            return Err("timeout".into());
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = src.read(&mut buf[..want]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the file shrank while it was read".into());
        }
        gz.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    // The last block padded, then two empty blocks: the archive's end.
    let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
    gz.write_all(&vec![0u8; pad + 2 * BLOCK])
        .map_err(|e| e.to_string())?;
    let out = gz.finish().map_err(|e| e.to_string())?;
    out.sync_all().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
