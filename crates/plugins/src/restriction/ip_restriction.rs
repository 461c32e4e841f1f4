//! ip-restriction (`apisix/plugins/ip-restriction.lua`): refuses clients whose `$remote_addr`
//! (after real-ip) is outside `whitelist` or inside `blacklist` (IPv4/IPv6 addresses and CIDR
//! blocks), with `response_code` (403 or 404) and `{"message": message}`.

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Value};

use crate::support::ip::IpMatcher;

pub const NAME: &str = "ip-restriction";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 3000, schema, compile)
};

fn schema() -> Value {
    let list = json!({
        "type": "array",
        "items": {"anyOf": ferrisix_config::schema::defs::ip_alternatives()},
        "minItems": 1
    });
    json!({
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "default": "Your IP address is not allowed"
            },
            "response_code": {"type": "integer", "minimum": 403, "maximum": 404, "default": 403},
            "whitelist": list.clone(),
            "blacklist": list
        },
        "oneOf": [{"required": ["whitelist"]}, {"required": ["blacklist"]}]
    })
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    IpMatcher::from_conf(cx.conf.get("whitelist"))?;
    IpMatcher::from_conf(cx.conf.get("blacklist"))?;
    Ok(())
}

#[derive(Debug)]
struct IpRestriction {
    whitelist: Option<IpMatcher>,
    blacklist: Option<IpMatcher>,
    exit: Exit,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let code = conf["response_code"].as_u64().unwrap_or(403) as u16;
    let status = StatusCode::from_u16(code).map_err(|e| e.to_string())?;
    Ok(Arc::new(IpRestriction {
        whitelist: IpMatcher::from_conf(conf.get("whitelist"))?,
        blacklist: IpMatcher::from_conf(conf.get("blacklist"))?,
        exit: super::message_exit(
            status,
            conf["message"]
                .as_str()
                .unwrap_or("Your IP address is not allowed"),
        ),
    }))
}

impl Plugin for IpRestriction {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let ip = ctx.remote_addr();
        let mut block = self.blacklist.as_ref().is_some_and(|b| b.matches(ip));
        if let Some(w) = &self.whitelist {
            block = !w.matches(ip);
        }
        if block {
            Step::exit(self.exit.clone())
        } else {
            Step::CONTINUE
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::{request, Compiler};

    fn verdict(conf: Value, ip: &str) -> Option<Exit> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ipr", None)).unwrap();
        let mut req = request(ip, &[]);
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        out
    }

    #[test]
    fn lists() {
        let w = json!({"whitelist": ["127.0.0.1", "113.74.26.106/24", "::1", "fe80::/32"]});
        for ok in ["127.0.0.1", "113.74.26.1", "::1", "fe80::1"] {
            assert!(verdict(w.clone(), ok).is_none(), "{ok}");
        }
        let e = verdict(w, "10.0.0.1").unwrap();
        assert_eq!(e.status, 403);
        assert_eq!(
            e.body.unwrap(),
            "{\"message\":\"Your IP address is not allowed\"}\n"
        );
        let b = json!({"blacklist": ["10.0.0.0/8"], "message": "go away", "response_code": 404});
        assert!(verdict(b.clone(), "127.0.0.1").is_none());
        let e = verdict(b, "10.9.9.9").unwrap();
        assert_eq!(e.status, 404);
        assert_eq!(e.body.unwrap(), "{\"message\":\"go away\"}\n");
    }

    #[test]
    fn validation() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert!(
            err(json!({"whitelist": ["127.0.0.1"], "blacklist": ["1.1.1.1"]})).contains("oneOf")
                || err(json!({"whitelist": ["127.0.0.1"], "blacklist": ["1.1.1.1"]}))
                    .contains("matches")
        );
        assert!(err(json!({"whitelist": ["not-an-ip"]})).contains("whitelist"));
        assert!(err(json!({"whitelist": []})).contains("whitelist"));
        assert!(
            err(json!({"blacklist": ["1.1.1.1"], "response_code": 405})).contains("response_code")
        );
        assert!(err(json!({"whitelist": ["::1/129"]})).ends_with("invalid ip address: ::1/129"));
        assert!(r
            .check(NAME, &json!({"whitelist": ["10.0.0.0/8", "::/0"]}))
            .is_ok());
    }
}
