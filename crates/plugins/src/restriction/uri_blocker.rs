//! uri-blocker (`apisix/plugins/uri-blocker.lua`): refuses requests whose raw request URI
//! (`$request_uri`, query included) matches one of `block_rules` (regexes, joined with `|`
//! and, with `case_insensitive`, matched caselessly), with `rejected_code` and, when
//! `rejected_msg` is set, `{"error_msg": rejected_msg}`.

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use regex::Regex;
use serde_json::{json, Value};

use crate::support::pcre;

pub const NAME: &str = "uri-blocker";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 2900, schema, compile)
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "block_rules": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "uniqueItems": true
            },
            "rejected_code": {"type": "integer", "minimum": 200, "default": 403},
            "rejected_msg": {"type": "string", "minLength": 1},
            "case_insensitive": {"type": "boolean", "default": false}
        },
        "required": ["block_rules"]
    })
}

fn rules(conf: &Value) -> Vec<&str> {
    conf.get("block_rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// Every rule compiles, as APISIX's `check_schema` has it: a bad regex is refused when the
/// route is written, not met at its first request.
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    for r in rules(cx.conf) {
        pcre::compile(r, false)?;
    }
    Ok(())
}

#[derive(Debug)]
struct UriBlocker {
    /// `None` for an empty rule list, which blocks nothing.
    rules: Option<Regex>,
    exit: Exit,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let list = rules(&conf);
    let rules = if list.is_empty() {
        None
    } else {
        let caseless = conf["case_insensitive"].as_bool().unwrap_or(false);
        Some(pcre::compile(&list.join("|"), caseless)?)
    };
    let code = conf["rejected_code"].as_u64().unwrap_or(403);
    let status = u16::try_from(code)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| format!("invalid rejected_code {code}"))?;
    let exit = match conf.get("rejected_msg").and_then(Value::as_str) {
        Some(msg) => Exit::error_msg(status, msg),
        None => Exit::status(status),
    };
    Ok(Arc::new(UriBlocker { rules, exit }))
}

impl Plugin for UriBlocker {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match &self.rules {
            Some(r) if r.is_match(ctx.request_uri()) => Step::exit(self.exit.clone()),
            _ => Step::CONTINUE,
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

    fn verdict(conf: &Value, uri: &str) -> Option<Exit> {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, conf, "ub", None)).unwrap();
        let mut req = TestRequest::get(uri);
        let out = match p.rewrite(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        out
    }

    #[test]
    fn rules_code_message_and_case() {
        let conf = json!({"block_rules": ["root.exe", "root.m+"]});
        let e = verdict(&conf, "/root.exe").unwrap();
        assert_eq!((e.status.as_u16(), e.body), (403, None));
        assert!(
            verdict(&conf, "/x?f=root.mmm").is_some(),
            "the query counts"
        );
        assert!(verdict(&conf, "/ROOT.exe").is_none());
        let conf = json!({"block_rules": ["root.exe"], "rejected_code": 410,
            "rejected_msg": "access is not allowed", "case_insensitive": true});
        let e = verdict(&conf, "/ROOT.EXE").unwrap();
        assert_eq!(e.status, 410);
        assert_eq!(
            e.body.unwrap(),
            "{\"error_msg\":\"access is not allowed\"}\n"
        );
        assert!(verdict(&json!({"block_rules": []}), "/x").is_none());
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"block_rules": ["a", "a"]})).is_err());
        // APISIX's answer to an invalid rule (`t/plugin/uri-blocker.t` TEST 2 and 4).
        for rule in [".+(", "^b("] {
            assert_eq!(
                r.check(NAME, &json!({"block_rules": ["x", rule]})).unwrap_err(),
                format!("failed to check the configuration of plugin uri-blocker err: pcre_compile() failed: missing ) in \"{rule}\"")
            );
        }
        assert!(r.check(NAME, &json!({})).is_err());
        assert!(r
            .check(NAME, &json!({"block_rules": ["a"], "rejected_code": 199}))
            .is_err());
    }
}
