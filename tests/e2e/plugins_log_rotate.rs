//! End-to-end, through the binary: log-rotate moves the gateway's access and error logs aside
//! while requests come, and every request's line ends up in exactly one file (the current log
//! or a moved one, compressed or not); `max_size` rotates by size and `max_kept` keeps only the
//! newest moved files.
use crate::support;

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// A gateway on `plugins: [log-rotate]` with `attr` as `plugin_attr.log-rotate` (YAML flow
/// map), its access log and error log files in its directory, two workers, one route to an
/// echo upstream.
fn start(attr: &str, upstream: &Upstream) -> Gateway {
    launch(attr, upstream).start()
}

/// [`start`]'s launch, to add to.
fn launch(attr: &str, upstream: &Upstream) -> Launch {
    let routes = format!(
        "routes:\n  - id: r\n    uri: /r/*\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1",
        upstream.node()
    );
    Launch::new(&routes)
        .workers(2)
        .nginx_keys("error_log: {dir}/logs/error.log")
        .http_keys("access_log: {dir}/logs/access.log\naccess_log_format: \"$request_uri $status\"")
        .extra_config(&format!(
            "plugins:\n  - log-rotate\nplugin_attr:\n  log-rotate: {attr}\n"
        ))
        .rust_log("info")
}

fn logs_dir(gw: &Gateway) -> std::path::PathBuf {
    gw.config_dir().join("logs")
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

/// The text of a log file, a `.tar.gz` read with Debian's tar.
fn read_log(path: &Path) -> String {
    if path.to_string_lossy().ends_with(".tar.gz") {
        let out = Command::new("tar")
            .arg("-xzOf")
            .arg(path)
            .output()
            .expect("tar (Debian package tar) must be installed");
        assert!(
            out.status.success(),
            "tar -xzOf {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    } else {
        read_plain(path).unwrap_or_else(|| panic!("{} vanished", path.display()))
    }
}

/// A plain log file's text; `None` when it is gone (a rotation compressed it meanwhile).
fn read_plain(path: &Path) -> Option<String> {
    let mut s = String::new();
    match std::fs::File::open(path) {
        Ok(mut f) => {
            f.read_to_string(&mut s).unwrap();
            Some(s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// How many times each `/r/<n>` line appears across the access log and its moved files, and
/// how many moved files hold at least one.
fn count_lines(dir: &Path) -> (HashMap<String, usize>, usize) {
    // A moved file can be compressed (and removed) between the listing and its read: then
    // the count starts over from a new listing.
    'listing: loop {
        let mut seen = HashMap::new();
        let mut files_with_lines = 0;
        let listed = names(dir);
        for name in &listed {
            // Between its archive's rename and its removal, a moved file is listed twice.
            if listed.contains(&format!("{name}.tar.gz")) {
                continue;
            }
            let is_access = name == "access.log"
                || name.ends_with("__access.log")
                || name.ends_with("__access.log.tar.gz");
            if !is_access {
                continue;
            }
            let path = dir.join(name);
            let text = if name.ends_with(".tar.gz") {
                read_log(&path)
            } else {
                match read_plain(&path) {
                    Some(text) => text,
                    None => continue 'listing,
                }
            };
            let mut any = false;
            for line in text.lines().filter(|l| l.starts_with("/r/")) {
                *seen.entry(line.to_owned()).or_insert(0) += 1;
                any = true;
            }
            if any && name != "access.log" {
                files_with_lines += 1;
            }
        }
        return (seen, files_with_lines);
    }
}

/// Sends `/r/<from>` .. `/r/<to - 1>` from four clients on kept-alive connections.
fn burst(addr: SocketAddr, from: usize, to: usize, pace: Duration) {
    let clients: Vec<_> = (0..4)
        .map(|c| {
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                for n in (from + c..to).step_by(4) {
                    assert_eq!(conn.get(&format!("/r/{n}")).status, 200);
                    std::thread::sleep(pace);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

/// A burst of requests across several rotations (every second), the moved files compressed:
/// every request's line is in exactly one file, current or archived, and the lines went to
/// more than one file; the error log is moved and compressed too.
#[test]
fn every_line_lands_in_exactly_one_file_across_rotations() {
    let upstream = Upstream::start("u", Behaviour::Echo);
    let gw = start(
        "{interval: 1, max_kept: 1000, enable_compression: true}",
        &upstream,
    );
    const N: usize = 1200;
    // About three seconds of requests: several rotations happen while they come.
    let started = Instant::now();
    burst(gw.addr(), 0, N, Duration::from_millis(10));
    let took = started.elapsed();
    let dir = logs_dir(&gw);
    // The workers write their buffers out within a second or so; wait for every line.
    let complete = poll_until(Duration::from_secs(30), || {
        let (seen, _) = count_lines(&dir);
        seen.len() == N
    });
    let (seen, files) = count_lines(&dir);
    assert!(
        complete.is_some(),
        "{} of {N} request lines found in {:?}",
        seen.len(),
        names(&dir)
    );
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "lines written more than once: {twice:?}");
    assert!(
        files >= 2 || took < Duration::from_secs(2),
        "the burst took {took:?} but its lines are in {files} moved files: {:?}",
        names(&dir)
    );
    // Rotations go on every second, each file compressed just after its move: wait for a
    // listing taken between two of them.
    let uncompressed = |all: &[String]| {
        all.iter()
            .any(|n| n.ends_with("__access.log") || n.ends_with("__error.log"))
    };
    poll_until(Duration::from_secs(10), || !uncompressed(&names(&dir)));
    let all = names(&dir);
    assert!(
        all.iter().any(|n| n.ends_with("__error.log.tar.gz")),
        "the error log was moved and compressed: {all:?}"
    );
    assert!(
        !uncompressed(&all),
        "every moved file is compressed: {all:?}"
    );
    // APISIX's message for the first rotation time is in one of the error logs (the archives
    // stay; the current file may be moved meanwhile).
    let error_text: String = all
        .iter()
        .filter(|n| n.contains("error.log"))
        .filter_map(|n| {
            let path = dir.join(n);
            if n.ends_with(".tar.gz") {
                Some(read_log(&path))
            } else {
                read_plain(&path)
            }
        })
        .collect();
    assert!(
        error_text.contains("first init rotate time is: "),
        "{error_text}"
    );
}

/// `max_size` moves the access log once it is that big, though the interval (an hour) is far
/// off; `max_kept: 2` keeps the two newest moved files.
#[test]
fn max_size_rotates_and_max_kept_keeps_the_newest() {
    let upstream = Upstream::start("u", Behaviour::Echo);
    let gw = start("{interval: 3600, max_kept: 2, max_size: 2000}", &upstream);
    let dir = logs_dir(&gw);
    let moved = |d: &Path| {
        names(d)
            .into_iter()
            .filter(|n| n.ends_with("__access.log"))
            .collect::<Vec<_>>()
    };
    let mut seen_moved = std::collections::BTreeSet::new();
    for round in 0..3 {
        // Well past 2000 bytes of lines (each `/r/<n> 200`).
        burst(gw.addr(), round * 1000, round * 1000 + 300, Duration::ZERO);
        let before = seen_moved.len();
        let rotated = poll_until(Duration::from_secs(30), || {
            seen_moved.extend(moved(&dir));
            seen_moved.len() > before
        });
        assert!(
            rotated.is_some(),
            "round {round}: the access log was not rotated by size: {:?}",
            names(&dir)
        );
    }
    assert!(seen_moved.len() >= 3, "{seen_moved:?}");
    let mut left = Vec::new();
    let two = poll_until(Duration::from_secs(10), || {
        left = moved(&dir);
        left.len() == 2
    });
    assert!(two.is_some(), "max_kept 2: {:?}", names(&dir));
    // Those deleted are older than those kept (the names start with the date).
    for gone in seen_moved.iter().filter(|n| !left.contains(n)) {
        assert!(gone < &left[0], "{gone} was deleted but {left:?} kept");
    }
}

/// The moved files are named in local time, as APISIX's `os.date` names them: here the zone is a
/// POSIX rule in `TZ` (five and a half hours east of UTC, no zone file needed).
#[test]
fn moved_files_are_named_in_local_time() {
    const EAST: u64 = 5 * 3600 + 30 * 60;
    let upstream = Upstream::start("u", Behaviour::Echo);
    let gw = launch("{interval: 3600, max_size: 500}", &upstream)
        .env("TZ", "XST-5:30")
        .start();
    let dir = logs_dir(&gw);
    let epoch = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = epoch();
    burst(gw.addr(), 0, 200, Duration::ZERO);
    let mut moved = Vec::new();
    let rotated = poll_until(Duration::from_secs(30), || {
        moved = names(&dir)
            .into_iter()
            .filter(|n| n.ends_with("__access.log"))
            .collect();
        !moved.is_empty()
    });
    assert!(rotated.is_some(), "not rotated by size: {:?}", names(&dir));
    let after = epoch();
    let local_names: Vec<String> = (before - 1..=after + 1)
        .map(|t| {
            let c = ferrisix_plugin_api::clock::CivilTime::from_unix_secs(t + EAST);
            format!(
                "{:04}-{:02}-{:02}_{:02}-{:02}-{:02}__access.log",
                c.year, c.month, c.day, c.hour, c.minute, c.second
            )
        })
        .collect();
    assert!(
        local_names.contains(&moved[0]),
        "{} is not a local time between {} and {}",
        moved[0],
        local_names[0],
        local_names[local_names.len() - 1]
    );
}

/// A bad `plugin_attr.log-rotate` is refused with the key named, by `ferrisix -t` and at the
/// start; without log-rotate in `plugins` the attribute is not read.
#[test]
fn a_bad_attribute_is_named_by_the_check_and_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let write = |plugins: &str| {
        std::fs::write(
            dir.path().join("config.yaml"),
            format!(
                "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {}\n  enable_admin: false\n  ssl:\n    enable: false\n\
                 deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
                 {plugins}plugin_attr:\n  log-rotate: {{interval: 0, max_kept: 2}}\n",
                free_port()
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("apisix.yaml"), "routes: []\n#END\n").unwrap();
    };
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrisix"))
            .arg("-c")
            .arg(dir.path().join("config.yaml"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    write("plugins:\n  - log-rotate\n");
    let want = "plugin_attr.log-rotate.interval: invalid value: 0, expected a number of seconds, 1 or more";
    let checked = run(&["-t"]);
    let text = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success() && text.contains(want), "{text}");
    let started = run(&[]);
    let text = String::from_utf8_lossy(&started.stderr);
    assert!(!started.status.success() && text.contains(want), "{text}");
    write("plugins:\n  - prometheus\n");
    let checked = run(&["-t"]);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Across a reload (SIGHUP, config.yaml read again, and a rewritten apisix.yaml) the rotation
/// goes on: requests after the reload land in files moved after it, every line in exactly one
/// file, and the access log is written again after each move.
#[test]
fn rotation_keeps_going_across_a_reload() {
    let upstream = Upstream::start("u", Behaviour::Echo);
    let gw = start("{interval: 1, max_kept: 1000}", &upstream);
    let dir = logs_dir(&gw);
    const HALF: usize = 300;
    burst(gw.addr(), 0, HALF, Duration::from_millis(5));
    gw.signal("HUP");
    gw.rewrite_routes(&format!(
        "routes:\n  - id: r\n    uri: /r/*\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n  - id: other\n    uri: /other\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1",
        upstream.node(),
        upstream.node()
    ));
    // The new apisix.yaml is in force: its second route answers.
    let reloaded = poll_until(Duration::from_secs(10), || {
        get(gw.addr(), "/other").status == 200
    });
    assert!(reloaded.is_some(), "the rewritten routes never applied");
    let moved_before: Vec<String> = names(&dir)
        .into_iter()
        .filter(|n| n.ends_with("__access.log"))
        .collect();
    burst(gw.addr(), HALF, 2 * HALF, Duration::from_millis(10));
    let complete = poll_until(Duration::from_secs(30), || {
        count_lines(&dir).0.len() == 2 * HALF
    });
    let (seen, _) = count_lines(&dir);
    assert!(
        complete.is_some(),
        "{} of {} request lines found in {:?}",
        seen.len(),
        2 * HALF,
        names(&dir)
    );
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "lines written more than once: {twice:?}");
    // Files moved after the reload hold lines of requests made after it.
    let after_reload = |name: &str| {
        read_plain(&dir.join(name)).is_some_and(|text| {
            text.lines().any(|l| {
                l.strip_prefix("/r/")
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n >= HALF)
            })
        })
    };
    let moved_after = poll_until(Duration::from_secs(10), || {
        names(&dir)
            .iter()
            .filter(|n| n.ends_with("__access.log") && !moved_before.contains(n))
            .any(|n| after_reload(n))
    });
    assert!(
        moved_after.is_some(),
        "no file moved after the reload holds its requests: {:?}",
        names(&dir)
    );
    // The access log is written again after the moves.
    let before = count_lines(&dir).0.len();
    burst(gw.addr(), 2 * HALF, 2 * HALF + 8, Duration::ZERO);
    let more = poll_until(Duration::from_secs(30), || {
        count_lines(&dir).0.len() == before + 8
    });
    assert!(more.is_some(), "{:?}", names(&dir));
}
