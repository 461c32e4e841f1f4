//! The programs the tests run (etcd, Redis, nginx, Prometheus, wrk, protoc, openssl, curl, slapd,
//! mosquitto ...), as the Debian packages that hold them. `scripts/test.sh` installs every one
//! of them once, before the tests; the tests themselves install nothing. A test that finds one
//! missing fails at once ([`require`]), naming the program and the command that installs it: a
//! skipped test would pass without having checked anything.

use std::ffi::OsString;
use std::path::PathBuf;

/// Each program a test runs and the Debian packages that install it. `scripts/test.sh`'s
/// `packages` line must name every package here (a unit test below checks it).
pub const PROGRAMS: &[(&str, &str)] = &[
    ("etcd", "etcd-server"),
    ("redis-server", "redis-server"),
    ("redis-cli", "redis-tools"),
    ("nginx", "nginx"),
    ("prometheus", "prometheus"),
    ("wrk", "wrk"),
    // The well-known .proto files etcd's import are in libprotobuf-dev.
    ("protoc", "protobuf-compiler libprotobuf-dev"),
    ("openssl", "openssl"),
    ("curl", "curl"),
    // The ldap-auth plugins' directory: slapd, with slapadd to load its test tree.
    ("slapd", "slapd"),
    ("slapadd", "slapd"),
    // openid-connect's login-flow test runs npm's oidc-provider on Debian's Node.js.
    ("node", "nodejs"),
    // mqtt-proxy's stream test: two brokers, and MQTT 3.1.1 and 5 clients.
    ("mosquitto", "mosquitto"),
    ("mosquitto_pub", "mosquitto-clients"),
    ("mosquitto_sub", "mosquitto-clients"),
];

/// The path of `program`, which a test is about to run; panics, saying what installs it, when
/// it is not on `PATH`.
pub fn require(program: &str) -> PathBuf {
    locate(program, std::env::var_os("PATH")).unwrap_or_else(|msg| panic!("{msg}"))
}

/// `program` in the directories of `path`, or the message that says how to install it.
fn locate(program: &str, path: Option<OsString>) -> Result<PathBuf, String> {
    let Some((_, packages)) = PROGRAMS.iter().find(|(p, _)| *p == program) else {
        return Err(format!(
            "`{program}` is not in debian::PROGRAMS: add it there and to scripts/test.sh"
        ));
    };
    path.and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
    .ok_or_else(|| {
        format!(
            "`{program}` is not on PATH: install it with `sudo apt-get install {packages}`, or \
             run scripts/test.sh, which installs every program the tests need"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packages `scripts/test.sh` installs, from its `packages="..."` line.
    fn installed_by_test_sh() -> Vec<String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/test.sh");
        let text = std::fs::read_to_string(script).expect("read scripts/test.sh");
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("packages=\""))
            .expect("scripts/test.sh has a packages=\"...\" line");
        let list = line.split('"').next().unwrap();
        list.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn test_sh_installs_every_package_the_tests_require() {
        let installed = installed_by_test_sh();
        for (program, packages) in PROGRAMS {
            for package in packages.split_whitespace() {
                assert!(
                    installed.iter().any(|p| p == package),
                    "`{program}` needs Debian's {package}, which scripts/test.sh does not install"
                );
            }
        }
    }

    #[test]
    fn a_missing_program_is_named_with_the_command_that_installs_it() {
        let msg = locate("etcd", Some(OsString::new())).unwrap_err();
        assert!(msg.contains("`etcd` is not on PATH"), "{msg}");
        assert!(msg.contains("sudo apt-get install etcd-server"), "{msg}");
        assert!(msg.contains("scripts/test.sh"), "{msg}");
        let msg = locate("protoc", None).unwrap_err();
        assert!(
            msg.contains("apt-get install protobuf-compiler libprotobuf-dev"),
            "{msg}"
        );
    }

    #[test]
    fn a_program_outside_the_list_is_refused() {
        let msg = locate("no-such-program", std::env::var_os("PATH")).unwrap_err();
        assert!(msg.contains("debian::PROGRAMS"), "{msg}");
    }

    #[test]
    fn a_program_on_the_path_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wrk"), "").unwrap();
        let found = locate("wrk", Some(dir.path().as_os_str().to_owned())).unwrap();
        assert_eq!(found, dir.path().join("wrk"));
    }
}
