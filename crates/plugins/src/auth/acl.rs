//! acl (`apisix/plugins/acl.lua`): once an auth plugin found the consumer, lets the request
//! through or refuses it by the consumer's `labels`. `deny_labels` refuses a consumer having
//! one of the listed values under one of the listed label names; `allow_labels` refuses a
//! consumer having none. A refusal answers `rejected_code` (403) with `{"message":
//! rejected_msg}` or "The consumer is forbidden."; a request without a consumer (nor an
//! external user) gets 401 "Missing authentication.".
//!
//! A label's value is read as APISIX reads it: a JSON array when it starts with `[`, a list
//! split on `,` (spaces around ignored) when it holds one, else the value itself. An external
//! user (the userinfo an SSO plugin put in [`ExternalUser`]) is read at
//! `external_user_label_field` (a JSON path, or `external_user_label_field_key` names the
//! label), its value parsed with `external_user_label_field_parser` when set.

use std::sync::Arc;

use ferrisix_plugin_api::{CheckCtx, CompileCtx, Exit, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::support::auth::{message_exit, ExternalUser, JsonPath};

pub const NAME: &str = "acl";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 2410, schema, compile)
};

fn labels_schema() -> Value {
    json!({
        "type": "object",
        "minProperties": 1,
        "patternProperties": {
            ".*": {"type": "array", "minItems": 1, "items": {"type": "string"}}
        }
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "external_user_label_field": {"type": "string", "default": "groups", "minLength": 1},
            "external_user_label_field_key": {"type": "string", "minLength": 1},
            "external_user_label_field_parser": {
                "type": "string",
                "enum": ["segmented_text", "json", "table"]
            },
            "external_user_label_field_separator": {"type": "string", "minLength": 1},
            "allow_labels": labels_schema(),
            "deny_labels": labels_schema(),
            "rejected_code": {"type": "integer", "minimum": 200, "default": 403},
            "rejected_msg": {"type": "string"}
        },
        "allOf": [{
            "if": {
                "required": ["external_user_label_field_parser"],
                "properties": {"external_user_label_field_parser": {"const": "segmented_text"}}
            },
            "then": {"required": ["external_user_label_field_separator"]}
        }],
        "anyOf": [
            {"required": ["allow_labels"]},
            {"required": ["deny_labels"]}
        ]
    })
}

/// The JSON path of `external_user_label_field` parses (APISIX's `check_schema`).
fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    let field = cx
        .conf
        .get("external_user_label_field")
        .and_then(Value::as_str)
        .unwrap_or("groups");
    JsonPath::parse(field)
        .map(|_| ())
        .map_err(|e| format!("invalid external_user_label_field: {e}"))
}

/// How a label's value is split into values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Parser {
    /// Split on the separator regex, spaces around it ignored.
    Segmented,
    Json,
    Table,
}

#[derive(Debug)]
struct Acl {
    allow: Vec<(String, Vec<String>)>,
    deny: Vec<(String, Vec<String>)>,
    field: JsonPath,
    field_key: String,
    parser: Option<Parser>,
    separator: Option<regex::Regex>,
    rejection: Exit,
    missing: Exit,
}

fn label_lists(v: Option<&Value>) -> Vec<(String, Vec<String>)> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, vals)| {
            let vals = vals
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect();
            (k.clone(), vals)
        })
        .collect()
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let code = conf
        .get("rejected_code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or("invalid rejected_code")?;
    let msg = conf
        .get("rejected_msg")
        .and_then(Value::as_str)
        .unwrap_or("The consumer is forbidden.");
    let field_text = conf
        .get("external_user_label_field")
        .and_then(Value::as_str)
        .unwrap_or("groups");
    let field = JsonPath::parse(field_text)?;
    let field_key = conf
        .get("external_user_label_field_key")
        .and_then(Value::as_str)
        .unwrap_or(field_text)
        .to_owned();
    let parser = match conf
        .get("external_user_label_field_parser")
        .and_then(Value::as_str)
    {
        Some("segmented_text") => Some(Parser::Segmented),
        Some("json") => Some(Parser::Json),
        Some("table") => Some(Parser::Table),
        _ => None,
    };
    let separator = match conf
        .get("external_user_label_field_separator")
        .and_then(Value::as_str)
    {
        Some(sep) => Some(separator_regex(sep)?),
        None => None,
    };
    Ok(Arc::new(Acl {
        allow: label_lists(conf.get("allow_labels")),
        deny: label_lists(conf.get("deny_labels")),
        field,
        field_key,
        parser,
        separator,
        rejection: message_exit(code, msg),
        missing: message_exit(StatusCode::UNAUTHORIZED, "Missing authentication."),
    }))
}

fn separator_regex(sep: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(&format!("\\s*(?:{sep})\\s*")).map_err(|e| e.to_string())
}

/// `extra_values_with_parser`: the values `value` holds under `parser`.
fn values_with_parser(value: &Value, parser: Parser, sep: Option<&regex::Regex>) -> Vec<Value> {
    match parser {
        Parser::Segmented => match (value.as_str(), sep) {
            (Some(s), Some(sep)) => sep.split(s).map(|p| Value::String(p.into())).collect(),
            _ => Vec::new(),
        },
        Parser::Table => value.as_array().cloned().unwrap_or_default(),
        Parser::Json => match value.as_str() {
            Some(s) if s.starts_with('[') => match serde_json::from_str::<Value>(s) {
                Ok(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
    }
}

/// `extra_values_without_parser`: a list is its items, a string starting with `[` a JSON
/// array, one holding `,` a comma-separated list, any other string itself.
fn values_without_parser(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::String(s) if s.starts_with('[') => values_with_parser(value, Parser::Json, None),
        Value::String(s) if s.contains(',') => s
            .split(',')
            .map(|p| Value::String(p.trim_matches(char::is_whitespace).into()))
            .collect(),
        Value::String(_) => vec![value.clone()],
        _ => Vec::new(),
    }
}

impl Acl {
    fn contains_label(
        &self,
        want: &[(String, Vec<String>)],
        labels: &Map<String, Value>,
        parser: Option<Parser>,
    ) -> bool {
        want.iter().any(|(key, wanted)| {
            let Some(value) = labels.get(key) else {
                return false;
            };
            let values = match parser {
                Some(p) => values_with_parser(value, p, self.separator.as_ref()),
                None => values_without_parser(value),
            };
            wanted
                .iter()
                .any(|w| values.iter().any(|v| v.as_str() == Some(w.as_str())))
        })
    }

    /// The labels of an external user: `{field_key: value}`, the value parsed already when
    /// the path matched several values.
    fn external_labels(&self, user: &Value) -> (Map<String, Value>, bool) {
        let found = self.field.query(user);
        let mut labels = Map::new();
        if found.len() <= 1 {
            if let Some(v) = found.into_iter().next() {
                labels.insert(self.field_key.clone(), v.clone());
            }
            return (labels, true);
        }
        let mut merged = Vec::new();
        for v in found {
            match (self.parser, v) {
                (Some(p), Value::String(_)) => {
                    merged.extend(values_with_parser(v, p, self.separator.as_ref()))
                }
                _ => merged.extend(values_without_parser(v)),
            }
        }
        labels.insert(self.field_key.clone(), Value::Array(merged));
        (labels, false)
    }

    fn decide(&self, labels: &Map<String, Value>, parser: Option<Parser>) -> Step<'static> {
        if !self.deny.is_empty() && self.contains_label(&self.deny, labels, parser) {
            return Step::exit(self.rejection.clone());
        }
        if !self.allow.is_empty() && !self.contains_label(&self.allow, labels, parser) {
            return Step::exit(self.rejection.clone());
        }
        Step::CONTINUE
    }
}

impl Plugin for Acl {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        if let Some(consumer) = ctx.consumer() {
            // A consumer's labels are read without a parser.
            return self.decide(&consumer.labels, None);
        }
        let Some(user) = ctx.get::<ExternalUser>() else {
            return Step::exit(self.missing.clone());
        };
        let (labels, parse) = self.external_labels(&user.0);
        // Several matches were parsed already: their values are matched as they are.
        self.decide(&labels, if parse { self.parser } else { None })
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Consumer, Flow};

    use super::*;
    use crate::testing::Compiler;

    fn run(conf: Value, labels: Option<Value>) -> (u16, String) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "acl", None)).unwrap();
        let mut req = TestRequest::get("/");
        let mut ctx = req.ctx();
        if let Some(l) = labels {
            ctx.attach_consumer(Arc::new(Consumer {
                username: "jack".into(),
                labels: l.as_object().cloned().unwrap(),
                ..Default::default()
            }));
        }
        let out = match p.access(&mut ctx) {
            Step::Done(Flow::Continue) => (200, String::new()),
            Step::Done(Flow::Exit(e)) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Step::Wait(_) => panic!("acl does not wait"),
        };
        out
    }

    #[test]
    fn allow_and_deny_by_label_values() {
        let allow = json!({"allow_labels": {"project": ["apisix"]}});
        assert_eq!(
            run(allow.clone(), Some(json!({"project": "gw, apisix"}))).0,
            200
        );
        assert_eq!(
            run(
                allow.clone(),
                Some(json!({"project": "[\"a,b\",\"apisix\"]"}))
            )
            .0,
            200
        );
        assert_eq!(
            run(allow.clone(), Some(json!({"project": "apisix2"}))),
            (403, "{\"message\":\"The consumer is forbidden.\"}\n".into())
        );
        assert_eq!(run(allow.clone(), Some(json!({}))).0, 403);
        assert_eq!(
            run(allow, None),
            (401, "{\"message\":\"Missing authentication.\"}\n".into())
        );
        let web = json!({"allow_labels": {"p": ["web,server"]}});
        assert_eq!(
            run(web.clone(), Some(json!({"p": "[\"web,server\"]"}))).0,
            200
        );
        assert_eq!(run(web, Some(json!({"p": "web,server"}))).0, 403);
        let deny = json!({"deny_labels": {"team": ["red"]}, "rejected_msg": "no",
            "rejected_code": 451});
        assert_eq!(
            run(deny.clone(), Some(json!({"team": "blue,red"}))),
            (451, "{\"message\":\"no\"}\n".into())
        );
        assert_eq!(run(deny, Some(json!({"team": "blue"}))).0, 200);
    }

    #[test]
    fn external_users() {
        let c = Compiler::new();
        let conf = json!({"allow_labels": {"groups": ["ops"]},
            "external_user_label_field_parser": "segmented_text",
            "external_user_label_field_separator": "\\|"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "acl", None)).unwrap();
        for (user, want) in [
            (json!({"groups": "dev | ops"}), true),
            (json!({"groups": "dev"}), false),
            (json!({"other": "ops"}), false),
        ] {
            let mut req = TestRequest::get("/");
            let mut ctx = req.ctx();
            ctx.insert(ExternalUser(user.clone()));
            let passed = matches!(p.access(&mut ctx), Step::Done(Flow::Continue));
            assert_eq!(passed, want, "{user}");
        }
    }

    #[test]
    fn schema_messages() {
        let c = Compiler::new();
        let r = &c.registry;
        let err = |conf: Value| r.check(NAME, &conf).unwrap_err();
        assert_eq!(
            err(json!({})),
            "failed to check the configuration of plugin acl err: object matches none of the required: [\"allow_labels\"] or [\"deny_labels\"]"
        );
        assert_eq!(
            err(json!({"allow_labels": {"org": []}})),
            "failed to check the configuration of plugin acl err: property \"allow_labels\" validation failed: failed to validate org (matching \".*\"): expect array to have at least 1 items"
        );
        assert_eq!(
            err(json!({"allow_labels": {"o": ["x"]},
                "external_user_label_field_parser": "segmented_text"})),
            "failed to check the configuration of plugin acl err: allOf 1 failed: then clause did not match"
        );
        assert_eq!(
            err(json!({"deny_labels": {"o": ["x"]}, "rejected_code": 199})),
            "failed to check the configuration of plugin acl err: property \"rejected_code\" validation failed: expected 199 to be at least 200"
        );
        assert!(err(json!({"deny_labels": {"o": ["x"]},
            "external_user_label_field": "$[["}))
        .contains("invalid external_user_label_field"));
        assert_eq!(r.get(NAME).unwrap().priority, 2410);
    }
}
