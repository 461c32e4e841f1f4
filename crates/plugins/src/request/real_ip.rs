//! real-ip (`apisix/plugins/real-ip.lua`): takes the client's address from `source` (a
//! variable: `http_x_forwarded_for` is read from its last value, `arg_*`, `http_*`, ...) and
//! makes it `$remote_addr` for every later plugin and the upstream's `X-Real-IP`, when the
//! connection comes from `trusted_addresses` (any, without them). With `recursive`, the last
//! `X-Forwarded-For` entry that is not trusted is taken. A value with a port
//! (`1.2.3.4:80`, `[::1]:80`) gives its address; a malformed one, or a port out of range,
//! leaves the address as it was. A port given with it becomes `$remote_port` (without one the
//! connection's port stays, as apisix-nginx-module's `set_real_ip` keeps it);
//! `$realip_remote_port` is the connection's.

use std::net::IpAddr;
use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use ferrisix_router::VarSource;
use serde_json::{json, Value};

use crate::support::ip::IpMatcher;

pub const NAME: &str = "real-ip";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 23000, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "trusted_addresses": {
                "type": "array",
                "items": {"anyOf": ferrisix_config::schema::defs::ip_alternatives()},
                "minItems": 1
            },
            "source": {"type": "string", "minLength": 1},
            "recursive": {"type": "boolean", "default": false}
        },
        "required": ["source"]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    IpMatcher::from_conf(cx.conf.get("trusted_addresses")).map(|_| ())
}

#[derive(Debug)]
struct RealIp {
    source: String,
    trusted: Option<IpMatcher>,
    recursive: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    Ok(Arc::new(RealIp {
        source: conf["source"].as_str().unwrap_or_default().to_owned(),
        trusted: IpMatcher::from_conf(conf.get("trusted_addresses"))?,
        recursive: conf["recursive"].as_bool().unwrap_or(false),
    }))
}

/// `core.utils.parse_addr` and the checks after it: the address of `a.b.c.d`, `a.b.c.d:port`,
/// an IPv6 address or `[v6]:port`; `None` when malformed or the port is out of range.
fn parse_addr(addr: &str) -> Option<(IpAddr, Option<u16>)> {
    let addr = addr.trim();
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Some((ip, None));
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        match tail {
            "" => (h, None),
            t => (h, Some(t.strip_prefix(':')?)),
        }
    } else {
        let (h, p) = addr.rsplit_once(':')?;
        (h, Some(p))
    };
    let port = match port {
        Some(p) => {
            let p: u32 = p.parse().ok()?;
            if !(1..=65535).contains(&p) {
                return None;
            }
            Some(p as u16)
        }
        None => None,
    };
    Some((host.parse().ok()?, port))
}

impl RealIp {
    fn address(&self, ctx: &PluginCtx<'_>) -> Option<String> {
        if self.source != "http_x_forwarded_for" {
            return ctx.var(&self.source).map(|v| v.into_owned());
        }
        // The last X-Forwarded-For header line.
        let line = ctx
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .next_back()?;
        let line = String::from_utf8_lossy(line.as_bytes());
        let Some(idx) = line.rfind(',') else {
            return Some(line.into_owned());
        };
        if let (true, Some(trusted)) = (self.recursive, &self.trusted) {
            let parts: Vec<&str> = line.split(',').map(str::trim_start).collect();
            for p in parts.iter().skip(1).rev() {
                if !trusted.matches_text(p) {
                    return Some((*p).to_owned());
                }
            }
            return parts.first().map(|p| (*p).to_owned());
        }
        Some(line[idx + 1..].trim_start_matches(' ').to_owned())
    }
}

impl Plugin for RealIp {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if let Some(trusted) = &self.trusted {
            if !trusted.matches(ctx.remote_addr()) {
                return Step::CONTINUE;
            }
        }
        let Some(addr) = self.address(ctx) else {
            tracing::debug!("real-ip: missing real address");
            return Step::CONTINUE;
        };
        match parse_addr(&addr) {
            Some((ip, port)) => {
                ctx.set_remote_addr(ip);
                if let Some(port) = port {
                    ctx.set_remote_port(port);
                }
            }
            None => tracing::warn!(addr, "real-ip: bad address"),
        }
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    fn addr_after(conf: Value, req: TestRequest) -> String {
        let mut req = req;
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ri", None)).unwrap();
        let _ = p.rewrite(&mut req.ctx());
        req.state.remote_addr().to_string()
    }

    #[test]
    fn sources() {
        let conf = json!({"source": "http_x_real"});
        let req = || TestRequest::get("/?ip=3.3.3.3");
        assert_eq!(
            addr_after(conf.clone(), req().header("x-real", "1.1.1.1")),
            "1.1.1.1"
        );
        assert_eq!(
            addr_after(conf.clone(), req().header("x-real", "1.1.1.1:80")),
            "1.1.1.1"
        );
        assert_eq!(
            addr_after(conf.clone(), req().header("x-real", "[::2]:80")),
            "::2"
        );
        assert_eq!(
            addr_after(conf.clone(), req().header("x-real", "::2")),
            "::2"
        );
        for bad in ["1.1.1.1.1", "1.1.1.1:65536", "1.1.1.1:0", "x"] {
            assert_eq!(
                addr_after(conf.clone(), req().header("x-real", bad)),
                "127.0.0.1",
                "{bad}"
            );
        }
        assert_eq!(addr_after(conf, req()), "127.0.0.1");
        assert_eq!(addr_after(json!({"source": "arg_ip"}), req()), "3.3.3.3");
    }

    /// A port in the source becomes `$remote_port` (APISIX's `set_real_ip(ip, port)`); without
    /// one, or with a bad address, the connection's stays. `$realip_remote_port` is the
    /// connection's.
    #[test]
    fn a_port_in_the_source_becomes_remote_port() {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &json!({"source": "http_x_real"}), "ri", None)).unwrap();
        let ports = |v: &str| {
            let mut req = TestRequest::get("/").header("x-real", v);
            let mut ctx = req.ctx();
            let _ = p.rewrite(&mut ctx);
            let var = |n: &str| ctx.var(n).map(|v| v.into_owned()).unwrap_or_default();
            (var("remote_port"), var("realip_remote_port"))
        };
        let (port, conn) = ports("1.1.1.1:8080");
        assert_eq!(port, "8080");
        assert_ne!(conn, "8080");
        assert_eq!(ports("[::2]:81").0, "81");
        for keeps in ["1.1.1.1", "::2", "1.1.1.1:65536", "x"] {
            let (port, conn) = ports(keeps);
            assert_eq!(port, conn, "{keeps}");
        }
    }

    #[test]
    fn forwarded_for_trust_and_recursion() {
        let xff = |v: &str| TestRequest::get("/").header("x-forwarded-for", v);
        let conf = json!({"source": "http_x_forwarded_for"});
        assert_eq!(addr_after(conf.clone(), xff("1.1.1.1, 2.2.2.2")), "2.2.2.2");
        assert_eq!(addr_after(conf, xff("1.1.1.1")), "1.1.1.1");
        let conf = json!({"source": "http_x_forwarded_for", "recursive": true,
            "trusted_addresses": ["127.0.0.0/24", "2.2.2.2"]});
        assert_eq!(
            addr_after(conf.clone(), xff("1.1.1.1, 3.3.3.3, 2.2.2.2")),
            "3.3.3.3"
        );
        assert_eq!(addr_after(conf, xff("1.1.1.1, 2.2.2.2")), "1.1.1.1");
        // An untrusted connection keeps its own address.
        let conf = json!({"source": "http_x_forwarded_for", "trusted_addresses": ["10.0.0.1"]});
        assert_eq!(addr_after(conf, xff("1.1.1.1")), "127.0.0.1");
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({})).is_err());
        assert_eq!(
            r.check(NAME, &json!({"source": "x", "trusted_addresses": ["::1/129"]})),
            Err("failed to check the configuration of plugin real-ip err: invalid ip address: ::1/129".into())
        );
    }
}
