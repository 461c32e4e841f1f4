use std::io::Read;

use super::*;

/// 2026-12-07 06:00:00 UTC: a multiple of an hour.
const HOUR: u64 = 1_796_623_200;

fn log(dir: &Path, kind: &'static str, name: &str, reopen: &LogReopen) -> RotatedLog {
    RotatedLog {
        kind,
        path: dir.join(name),
        reopen: reopen.clone(),
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    n.sort();
    n
}

/// The single file of a `.tar.gz` as (name, content), read with flate2 and the header's
/// checksum checked.
fn untar(path: &Path) -> (String, Vec<u8>) {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(File::open(path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let h = &raw[..BLOCK];
    let field = |at: usize, w: usize| {
        let t = std::str::from_utf8(&h[at..at + w]).unwrap();
        u64::from_str_radix(t.trim_matches(|c| c == '\0' || c == ' '), 8).unwrap()
    };
    let mut sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    sum = sum - h[148..156].iter().map(|b| u64::from(*b)).sum::<u64>() + 8 * u64::from(b' ');
    assert_eq!(field(148, 8), sum, "header checksum");
    assert_eq!(&h[257..262], b"ustar");
    let name_end = h[..100].iter().position(|b| *b == 0).unwrap_or(100);
    let name = String::from_utf8(h[..name_end].to_vec()).unwrap();
    let size = field(124, 12) as usize;
    let body = raw[BLOCK..BLOCK + size].to_vec();
    let padded = size.div_ceil(BLOCK) * BLOCK;
    assert_eq!(raw.len(), BLOCK + padded + 2 * BLOCK, "two end blocks");
    assert!(raw[BLOCK + size..].iter().all(|b| *b == 0));
    (name, body)
}

#[test]
fn attr_defaults_are_apisix_and_bad_values_are_named() {
    assert_eq!(RotateAttr::from_attr(None).unwrap(), RotateAttr::default());
    let d = RotateAttr::default();
    assert_eq!(
        (
            d.interval,
            d.max_kept,
            d.max_size,
            d.enable_compression,
            d.timeout
        ),
        (3600, 168, -1, false, Duration::from_secs(10))
    );
    let a = RotateAttr::from_attr(Some(&json!({
        "interval": 10, "max_kept": 0, "max_size": 1024, "enable_compression": true, "timeout": 500
    })))
    .unwrap();
    assert_eq!(
        (
            a.interval,
            a.max_kept,
            a.max_size,
            a.enable_compression,
            a.timeout
        ),
        (10, 0, 1024, true, Duration::from_millis(500))
    );
    for (bad, msg) in [
        (
            json!({"interval": 0}),
            "plugin_attr.log-rotate.interval: invalid value: 0",
        ),
        (
            json!({"interval": "1h"}),
            "plugin_attr.log-rotate.interval: invalid value: \"1h\", expected an integer",
        ),
        (
            json!({"max_kept": -1}),
            "plugin_attr.log-rotate.max_kept: invalid value: -1",
        ),
        (
            json!({"enable_compression": "yes"}),
            "plugin_attr.log-rotate.enable_compression: invalid value: \"yes\", expected a boolean",
        ),
        (
            json!({"timeout": 0}),
            "plugin_attr.log-rotate.timeout: invalid value: 0",
        ),
        (json!([1]), "plugin_attr.log-rotate: invalid type"),
    ] {
        let e = RotateAttr::from_attr(Some(&bad)).unwrap_err();
        assert!(e.starts_with(msg), "{e}");
    }
}

impl LogRotator {
    /// As [`LogRotator::new`], naming in UTC whatever this machine's zone.
    fn new_utc(attr: RotateAttr, logs: Vec<RotatedLog>) -> LogRotator {
        LogRotator {
            zone: chrono::FixedOffset::east_opt(0),
            ..LogRotator::new(attr, logs)
        }
    }
}

#[test]
fn dates_are_apisix_s_format_in_the_zone() {
    assert_eq!(
        date_name(HOUR + 61, chrono::FixedOffset::east_opt(0)),
        "2026-12-07_06-01-01"
    );
    let india = chrono::FixedOffset::east_opt(5 * 3600 + 1800);
    assert_eq!(date_name(HOUR + 61, india), "2026-12-07_11-31-01");
    let west = chrono::FixedOffset::west_opt(8 * 3600);
    assert_eq!(date_name(HOUR + 61, west), "2026-12-06_22-01-01");
}

/// The first tick only sets the time (the next multiple of `interval`); at it both logs move
/// aside, the error log's and the access log's writers are told to reopen, and the next
/// rotation is an interval later.
#[test]
fn logs_move_aside_on_the_interval_s_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = LogReopen::new();
    std::fs::write(dir.path().join("error.log"), "e1\n").unwrap();
    std::fs::write(dir.path().join("access.log"), "a1\n").unwrap();
    let mut r = LogRotator::new_utc(
        RotateAttr {
            interval: 60,
            ..RotateAttr::default()
        },
        vec![
            log(dir.path(), "error.log", "error.log", &reopen),
            log(dir.path(), "access.log", "access.log", &reopen),
        ],
    );
    r.tick(HOUR + 30);
    assert_eq!(r.rotate_time, Some(HOUR + 60));
    r.tick(HOUR + 59);
    assert_eq!(names(dir.path()), ["access.log", "error.log"]);
    assert_eq!(reopen.generation(), 0);
    r.tick(HOUR + 61);
    assert_eq!(
        names(dir.path()),
        [
            "2026-12-07_06-01-01__access.log",
            "2026-12-07_06-01-01__error.log"
        ]
    );
    assert_eq!(reopen.generation(), 1, "one signal for both logs");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("2026-12-07_06-01-01__error.log")).unwrap(),
        "e1\n"
    );
    assert_eq!(r.rotate_time, Some(HOUR + 120));
    // A log not written since (no file): nothing to move, no signal.
    r.tick(HOUR + 120);
    assert_eq!(reopen.generation(), 1);
    assert_eq!(r.rotate_time, Some(HOUR + 180));
}

#[test]
fn max_size_rotates_only_the_log_that_reached_it() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = LogReopen::new();
    std::fs::write(dir.path().join("error.log"), "0123456789").unwrap();
    std::fs::write(dir.path().join("acc.log"), "short").unwrap();
    let mut r = LogRotator::new_utc(
        RotateAttr {
            max_size: 10,
            ..RotateAttr::default()
        },
        vec![
            log(dir.path(), "error.log", "error.log", &reopen),
            log(dir.path(), "access.log", "acc.log", &reopen),
        ],
    );
    r.tick(HOUR + 1);
    assert_eq!(
        names(dir.path()),
        ["acc.log", "error.log"],
        "the first tick sets the time only"
    );
    r.tick(HOUR + 2);
    assert_eq!(
        names(dir.path()),
        ["2026-12-07_06-00-02__error.log", "acc.log"]
    );
    // The same second again: the name is taken, so the log waits for the next second.
    std::fs::write(dir.path().join("error.log"), "0123456789").unwrap();
    r.tick(HOUR + 2);
    assert!(dir.path().join("error.log").exists());
    r.tick(HOUR + 3);
    assert!(!dir.path().join("error.log").exists());
    assert_eq!(reopen.generation(), 2);
}

/// Only the `max_kept` newest moved files of each log stay, compressed or not; files of
/// other logs are left alone.
#[test]
fn the_oldest_moved_files_beyond_max_kept_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = LogReopen::new();
    for f in [
        "2026-12-07_05-00-00__access.log",
        "2026-12-07_04-00-00__access.log.tar.gz",
        "2026-12-07_03-00-00__access.log",
        "2026-12-07_03-00-00__error.log",
        "2026-12-07_03-00-00__other.log",
        "access.log",
    ] {
        std::fs::write(dir.path().join(f), "x\n").unwrap();
    }
    let mut r = LogRotator::new_utc(
        RotateAttr {
            interval: 3600,
            max_kept: 2,
            ..RotateAttr::default()
        },
        vec![log(dir.path(), "access.log", "access.log", &reopen)],
    );
    r.tick(HOUR - 10);
    r.tick(HOUR);
    assert_eq!(
        names(dir.path()),
        [
            "2026-12-07_03-00-00__error.log",
            "2026-12-07_03-00-00__other.log",
            "2026-12-07_05-00-00__access.log",
            "2026-12-07_06-00-00__access.log",
        ]
    );
    // max_kept 0: none stays.
    let mut r = LogRotator::new_utc(
        RotateAttr {
            interval: 3600,
            max_kept: 0,
            ..RotateAttr::default()
        },
        vec![log(dir.path(), "access.log", "access.log", &reopen)],
    );
    std::fs::write(dir.path().join("access.log"), "y\n").unwrap();
    r.tick(HOUR + 10);
    r.tick(HOUR + 3600);
    assert_eq!(
        names(dir.path()),
        [
            "2026-12-07_03-00-00__error.log",
            "2026-12-07_03-00-00__other.log"
        ]
    );
}

/// With compression the moved file becomes `<name>.tar.gz` holding it under its name, and the
/// archive has what a writer that was still writing (it had read the old generation) wrote
/// after the move: the compression waits for it.
#[test]
fn compression_waits_for_the_write_in_flight_and_keeps_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = LogReopen::new();
    let path = dir.path().join("access.log");
    std::fs::write(&path, "one\n").unwrap();
    let mut r = LogRotator::new_utc(
        RotateAttr {
            interval: 60,
            enable_compression: true,
            ..RotateAttr::default()
        },
        vec![log(dir.path(), "access.log", "access.log", &reopen)],
    );
    r.tick(HOUR - 1);
    // A writer holds the file it opened, as a worker does, and is in the middle of a write.
    let mut held = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let writer = {
        let reopen = reopen.clone();
        std::thread::spawn(move || {
            let _writing = reopen.writing();
            let generation = reopen.generation();
            started_tx.send(()).unwrap();
            // The rotation moves the file and signals meanwhile.
            while reopen.generation() == generation {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            held.write_all(b"two\n").unwrap();
        })
    };
    started_rx.recv().unwrap();
    r.tick(HOUR);
    writer.join().unwrap();
    assert_eq!(
        names(dir.path()),
        ["2026-12-07_06-00-00__access.log.tar.gz"]
    );
    let (name, body) = untar(&dir.path().join("2026-12-07_06-00-00__access.log.tar.gz"));
    assert_eq!(name, "2026-12-07_06-00-00__access.log");
    assert_eq!(body, b"one\ntwo\n");
}

/// The archive is one `tar` reads (Debian's tar, as APISIX's `tar -zcf` makes them).
#[test]
fn tar_reads_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("2026-12-07_06-00-00__error.log");
    let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&file, &text).unwrap();
    compress(&file, Instant::now() + Duration::from_secs(10));
    assert!(!file.exists());
    let archive = with_suffix(&file, COMPRESSED_SUFFIX);
    let out = std::process::Command::new("tar")
        .arg("-xzOf")
        .arg(&archive)
        .output()
        .expect("tar (Debian package tar) must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    let list = std::process::Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(list.stdout).unwrap(),
        "2026-12-07_06-00-00__error.log\n"
    );
}

#[test]
fn the_plugin_has_apisix_s_priority_scope_and_an_empty_schema() {
    assert_eq!(
        (DEF.name, DEF.priority, DEF.scope),
        ("log-rotate", 100, Scope::Global)
    );
    assert_eq!((DEF.schema)(), json!({"type": "object", "properties": {}}));
}
