//! ua-restriction (`apisix/plugins/ua-restriction.lua`): refuses requests whose `User-Agent`
//! matches none of `allowlist` or one of `denylist` (regexes, searched anywhere in the
//! stripped value; with several `User-Agent` headers one allowed value lets the request
//! through, one denied value stops it), with 403 and `{"message": message}`. A request without
//! the header is refused unless `bypass_missing`.

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use regex::Regex;
use serde_json::{json, Value};

use crate::support::pcre;

pub const NAME: &str = "ua-restriction";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 2999, schema, compile)
};

fn schema() -> Value {
    let list = json!({"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}});
    json!({
        "type": "object",
        "properties": {
            "bypass_missing": {"type": "boolean", "default": false},
            "allowlist": list.clone(),
            "denylist": list,
            "message": {"type": "string", "minLength": 1, "maxLength": 1024, "default": "Not allowed"}
        },
        "oneOf": [{"required": ["allowlist"]}, {"required": ["denylist"]}]
    })
}

fn rules(v: Option<&Value>) -> Result<Option<Vec<Regex>>, String> {
    let Some(list) = v.and_then(Value::as_array) else {
        return Ok(None);
    };
    list.iter()
        .filter_map(Value::as_str)
        .map(|r| pcre::compile(r, false))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    rules(cx.conf.get("allowlist"))?;
    rules(cx.conf.get("denylist"))?;
    Ok(())
}

#[derive(Debug)]
enum Rules {
    Allow(Vec<Regex>),
    Deny(Vec<Regex>),
}

#[derive(Debug)]
struct UaRestriction {
    rules: Rules,
    bypass_missing: bool,
    exit: Exit,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let rules = match rules(conf.get("allowlist"))? {
        Some(a) => Rules::Allow(a),
        None => Rules::Deny(rules(conf.get("denylist"))?.unwrap_or_default()),
    };
    Ok(Arc::new(UaRestriction {
        rules,
        bypass_missing: conf["bypass_missing"].as_bool().unwrap_or(false),
        exit: super::message_exit(
            StatusCode::FORBIDDEN,
            conf["message"].as_str().unwrap_or("Not allowed"),
        ),
    }))
}

impl UaRestriction {
    fn passes(&self, agents: &[String]) -> bool {
        let hit = |rules: &[Regex], ua: &str| rules.iter().any(|r| r.is_match(ua.trim()));
        match &self.rules {
            Rules::Allow(rules) => agents.iter().any(|ua| hit(rules, ua)),
            Rules::Deny(rules) => !agents.iter().any(|ua| hit(rules, ua)),
        }
    }
}

impl Plugin for UaRestriction {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let agents: Vec<String> = ctx
            .headers()
            .get_all(http::header::USER_AGENT)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        if agents.is_empty() {
            return if self.bypass_missing {
                Step::CONTINUE
            } else {
                Step::exit(self.exit.clone())
            };
        }
        if self.passes(&agents) {
            Step::CONTINUE
        } else {
            Step::exit(self.exit.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::Flow;

    use super::*;
    use crate::testing::Compiler;

    fn refused(conf: &Value, agents: &[&str]) -> Option<Exit> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, conf, "ua", None)).unwrap();
        let mut req = TestRequest::get("/");
        for a in agents {
            req = req.header("user-agent", a);
        }
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        out
    }

    #[test]
    fn deny_and_allow() {
        let deny = json!({"denylist": ["(Baiduspider)/(\\d+)\\.(\\d+)", "bad-bot"]});
        let e = refused(&deny, &["Baiduspider/3.0"]).unwrap();
        assert_eq!(
            (e.status.as_u16(), e.body.unwrap()),
            (403, "{\"message\":\"Not allowed\"}\n".into())
        );
        assert!(refused(&deny, &["Mozilla/5.0"]).is_none());
        assert!(refused(&deny, &["Mozilla/5.0", "  bad-bot  "]).is_some());
        // Missing header: refused unless bypassed.
        assert!(refused(&deny, &[]).is_some());
        let bypass = json!({"denylist": ["x"], "bypass_missing": true, "message": "no"});
        assert!(refused(&bypass, &[]).is_none());
        let allow = json!({"allowlist": ["^curl/"], "message": "curl only"});
        assert!(refused(&allow, &["curl/8.0"]).is_none());
        assert!(refused(&allow, &["wget/1", "curl/8.0"]).is_none());
        let e = refused(&allow, &["wget/1"]).unwrap();
        assert_eq!(e.body.unwrap(), "{\"message\":\"curl only\"}\n");
    }

    #[test]
    fn validation() {
        let r = crate::PluginRegistry::builtin();
        assert!(r
            .check(NAME, &json!({"allowlist": ["a"], "denylist": ["b"]}))
            .is_err());
        assert!(r.check(NAME, &json!({"denylist": []})).is_err());
        assert!(r
            .check(NAME, &json!({"denylist": ["("]}))
            .unwrap_err()
            .ends_with("err: pcre_compile() failed: missing ) in \"(\""));
        assert!(r
            .check(NAME, &json!({"denylist": ["(?!x)"]}))
            .unwrap_err()
            .contains("not supported"));
        assert!(r
            .check(NAME, &json!({"denylist": ["a"], "message": ""}))
            .is_err());
    }
}
