//! A throwaway OpenLDAP directory for the ldap-auth plugins' tests: Debian's `slapd` (which
//! `scripts/test.sh` installs) on a random port, its tree (`dc=example,dc=org`, users under
//! `ou=users`) loaded with `slapadd` from an LDIF the test gives, the rootdn
//! `cn=admin,dc=example,dc=org` with password `adminpw`.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::debian::require;
use super::{free_port, poll_until};

/// The directory's suffix.
pub const SUFFIX: &str = "dc=example,dc=org";
/// The rootdn, allowed to search.
pub const ADMIN_DN: &str = "cn=admin,dc=example,dc=org";
pub const ADMIN_PASSWORD: &str = "adminpw";

/// A slapd child process in the foreground, killed on drop.
pub struct Slapd {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Slapd {
    /// A directory holding the suffix, `ou=users` and the entries of `ldif`.
    pub fn start(ldif: &str) -> Slapd {
        require("slapd");
        require("slapadd");
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::create_dir(&db).unwrap();
        let conf = dir.path().join("slapd.conf");
        std::fs::write(
            &conf,
            format!(
                "include /etc/ldap/schema/core.schema\n\
                 include /etc/ldap/schema/cosine.schema\n\
                 include /etc/ldap/schema/inetorgperson.schema\n\
                 modulepath /usr/lib/ldap\n\
                 moduleload back_mdb\n\
                 pidfile {pid}\n\
                 database mdb\n\
                 suffix \"{SUFFIX}\"\n\
                 rootdn \"{ADMIN_DN}\"\n\
                 rootpw {ADMIN_PASSWORD}\n\
                 directory {db}\n",
                pid = dir.path().join("slapd.pid").display(),
                db = db.display()
            ),
        )
        .unwrap();
        let data = dir.path().join("data.ldif");
        std::fs::write(
            &data,
            format!(
                "dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: example\n\
                 dc: example\n\ndn: ou=users,{SUFFIX}\nobjectClass: organizationalUnit\nou: users\n\n{ldif}"
            ),
        )
        .unwrap();
        let out = Command::new("slapadd")
            .arg("-f")
            .arg(&conf)
            .arg("-l")
            .arg(&data)
            .output()
            .expect("slapadd");
        assert!(
            out.status.success(),
            "slapadd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let child = Command::new("slapd")
            .arg("-f")
            .arg(&conf)
            .args(["-h", &format!("ldap://127.0.0.1:{port}/"), "-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("slapd");
        let s = Slapd {
            child,
            port,
            _dir: dir,
        };
        poll_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .unwrap_or_else(|| panic!("slapd on port {port} did not start"));
        s
    }

    /// `127.0.0.1:<port>`, as the plugins' `ldap_uri`.
    pub fn uri(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// An `inetOrgPerson` under `ou=users` with its password.
pub fn user(cn: &str, password: &str) -> String {
    format!(
        "dn: cn={cn},ou=users,{SUFFIX}\nobjectClass: inetOrgPerson\ncn: {cn}\nsn: {cn}\n\
         userPassword: {password}\n\n"
    )
}
