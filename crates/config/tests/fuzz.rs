//! Fuzz harness (stable, proptest): config.yaml, the standalone file (YAML and JSON) and
//! lua-resty-expr `vars` never panic or hang, whatever the input: random text, random JSON,
//! and byte-level mutations of real documents. Bounded: `PROPTEST_CASES` overrides the counts.

use std::borrow::Cow;

use ferrisix_config::provider::{parse_standalone_with, Format};
use ferrisix_config::settings::Settings;
use ferrisix_config::vars::compile_vars;
use ferrisix_router::VarSource;
use ferrisix_testkit::cases;
use proptest::prelude::*;
use serde_json::Value;

fn no_env(name: &str) -> Option<String> {
    (name == "SET").then(|| "1".to_owned())
}

const CONFIG: &str = include_str!("../../../config/config.yaml");
const STANDALONE: &str = "routes:\n  - id: r1\n    uri: /a/*\n    hosts: [a.com, \"*.b.com\"]\n    vars: [[\"arg_x\", \"==\", \"1\"], [\"http_y\", \"~~\", \"^z\"]]\n    plugins:\n      limit-count: {count: 2, time_window: 60}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"127.0.0.1:1980\": 1\nupstreams:\n  - id: u1\n    nodes: [{host: 127.0.0.1, port: 1980, weight: 1}]\n#END\n";

/// A document with a few bytes replaced, inserted or removed.
fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    prop::collection::vec((0..base.len(), any::<u8>(), 0..3u8), 1..8).prop_map(move |edits| {
        let mut bytes = base.as_bytes().to_vec();
        for (at, byte, how) in edits {
            let at = at.min(bytes.len().saturating_sub(1));
            match how {
                0 => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn yaml_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "([a-z_]{1,8}: ?|  |- |\\[|\\]|\\{|\\}|, |\\n|'|\"|#|\\||>|&a|\\*a|!!str |\\$\\{\\{SET\\}\\}|[0-9]{1,3}|~){0,60}",
        any::<String>(),
    ]
}

/// Arbitrary JSON, a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "(AND|OR|!|==|~=|>|<|>=|<=|~~|~\\*|in|has|ipmatch|arg_x|http_y|[a-z]{0,3}|\\^.|\\(|\\[|10\\.0\\.0\\.0/8|::1)".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

struct Vars(Vec<(String, String)>);

impl VarSource for Vars {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| Cow::Borrowed(v.as_str()))
    }
}

proptest! {
    #![proptest_config(cases(1000))]

    #[test]
    fn config_yaml_never_panics(text in prop_oneof![mutated(CONFIG), yaml_text()]) {
        let _ = Settings::from_yaml_str_with_env(&text, &no_env);
    }

    #[test]
    fn standalone_files_never_panic(text in prop_oneof![mutated(STANDALONE), yaml_text()], json_doc in json()) {
        let _ = parse_standalone_with(&text, Format::Yaml, 1, &no_env);
        let _ = parse_standalone_with(&format!("{text}\n#END\n"), Format::Yaml, 1, &no_env);
        let _ = parse_standalone_with(&json_doc.to_string(), Format::Json, 1, &no_env);
    }

    #[test]
    fn vars_compile_and_evaluate(
        expr in json(),
        vars in prop::collection::vec(("(arg_x|http_y|[a-z]{1,3})", "[ -~]{0,8}"), 0..4),
    ) {
        if let Ok(compiled) = compile_vars(&expr) {
            let _ = compiled.eval(&Vars(vars));
        }
    }
}

/// The whole run stays within a bounded amount of memory.
#[test]
fn memory_stays_bounded() {
    let peak_kib: u64 = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    assert!(peak_kib < 1024 * 1024, "peak RSS {peak_kib} KiB");
}
