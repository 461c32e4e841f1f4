//! Tests for the standalone provider: parsing rules (ids, order, `#END`, env, ignored kinds,
//! refusals) and the file watcher (reload, broken edit keeps the old state, revisions).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;

use super::standalone::carry_revisions;
use super::*;
use crate::model::ResourceKind;
use crate::state::{ConfigState, StoredValue};

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(text: &str, format: Format) -> Standalone {
    parse_standalone_with(text, format, 7, &no_env).unwrap()
}

fn ids(state: &ConfigState, kind: ResourceKind) -> Vec<String> {
    state
        .items_in_order(kind)
        .into_iter()
        .map(|i| i.id.clone())
        .collect()
}

const SAMPLE: &str = r#"
routes:
  - id: 1
    uri: /hello
    upstream_id: u1
  - uri: /no-id
    upstream: {nodes: {"127.0.0.1:1980": 1}, type: roundrobin}
  - id: r3
    uri: /svc
    service_id: s1
upstreams:
  - id: u1
    nodes: {"127.0.0.1:1980": 1}
services:
  - id: s1
    upstream_id: u1
consumers:
  - username: jack
    plugins: {key-auth: {key: k}}
  - id: c2
    username: ignored-for-id
global_rules:
  - id: 1
    plugins: {prometheus: {}}
plugin_configs:
  - id: pc1
    plugins: {}
plugin_metadata:
  - id: http-logger
    log_format: {host: $host}
ssls: []
#END
"#;

#[test]
fn ids_order_and_revisions() {
    let doc = parse(SAMPLE, Format::Yaml);
    assert!(doc.warnings.is_empty(), "{:?}", doc.warnings);
    let s = &doc.state;
    assert_eq!(s.revision, 7);
    assert_eq!(ids(s, ResourceKind::Routes), vec!["1", "arr_2", "r3"]);
    assert_eq!(ids(s, ResourceKind::Upstreams), vec!["u1"]);
    assert_eq!(ids(s, ResourceKind::Services), vec!["s1"]);
    assert_eq!(ids(s, ResourceKind::Consumers), vec!["jack", "c2"]);
    assert_eq!(ids(s, ResourceKind::GlobalRules), vec!["1"]);
    assert_eq!(ids(s, ResourceKind::PluginConfigs), vec!["pc1"]);
    assert_eq!(ids(s, ResourceKind::PluginMetadata), vec!["http-logger"]);
    assert!(!s.resources.contains_key(&ResourceKind::Ssls));

    let r = s.get(ResourceKind::Routes, "arr_2").unwrap();
    assert_eq!((r.seq, r.create_revision, r.mod_revision), (2, 7, 7));
    assert_eq!(
        r.value.parse(),
        json!({"uri": "/no-id", "upstream": {"nodes": {"127.0.0.1:1980": 1}, "type": "roundrobin"}})
    );
    // The value keeps the numeric id as written.
    assert_eq!(
        s.get(ResourceKind::Routes, "1").unwrap().value.parse()["id"],
        json!(1)
    );
}

#[test]
fn non_object_items_are_kept_for_the_compile_stage() {
    let doc = parse(
        "routes:\n  - just a string\n  - 42\n  - {id: ok, uri: /}\n#END\n",
        Format::Yaml,
    );
    let s = &doc.state;
    assert_eq!(ids(s, ResourceKind::Routes), vec!["arr_1", "arr_2", "ok"]);
    assert_eq!(
        s.get(ResourceKind::Routes, "arr_1").unwrap().value.parse(),
        json!("just a string")
    );
}

#[test]
fn odd_ids() {
    let doc = parse(
        r#"{"routes": [{"id": 2.0}, {"id": 1.5}, {"id": false}, {"id": null}, {"id": true}],
            "upstreams": [{"username": "u"}]}"#,
        Format::Json,
    );
    assert_eq!(
        ids(&doc.state, ResourceKind::Routes),
        vec!["2", "1.5", "arr_3", "arr_4", "true"]
    );
    // `username` only names consumers.
    assert_eq!(ids(&doc.state, ResourceKind::Upstreams), vec!["arr_1"]);
}

#[test]
fn duplicate_ids_keep_the_later_item_and_warn() {
    let doc = parse(
        "routes:\n  - {id: a, uri: /1}\n  - {id: a, uri: /2}\n#END",
        Format::Yaml,
    );
    let r = doc.state.get(ResourceKind::Routes, "a").unwrap();
    assert_eq!((r.value.parse()["uri"].as_str(), r.seq), (Some("/2"), 2));
    assert_eq!(
        doc.warnings,
        vec!["routes: items 1 and 2 have the same id `a`; the later one is used"]
    );
}

#[test]
fn end_flag() {
    let err = parse_standalone_with("routes: []\n", Format::Yaml, 1, &no_env).unwrap_err();
    assert_eq!(
        err,
        "missing valid end flag: the file must end with a line `#END`"
    );
    // Trailing whitespace is allowed, as long as `#END` is within the last 10 bytes.
    assert!(parse_standalone_with("routes: []\n#END  \n\n", Format::Yaml, 1, &no_env).is_ok());
    assert!(
        parse_standalone_with("routes: []\n#END\n\n\n\n\n\n\n\n", Format::Yaml, 1, &no_env)
            .is_err()
    );
    assert!(parse_standalone_with("#END", Format::Yaml, 1, &no_env)
        .unwrap()
        .state
        .is_empty());
    // JSON needs none.
    assert!(parse_standalone_with(r#"{"routes": []}"#, Format::Json, 1, &no_env).is_ok());
}

#[test]
fn syntax_errors_refuse_the_file_with_a_position() {
    let err = parse_standalone_with(
        "routes:\n  - {id: 1, uri: /a\n#END\n",
        Format::Yaml,
        1,
        &no_env,
    )
    .unwrap_err();
    assert!(
        err.starts_with("invalid YAML: ") && err.contains("line"),
        "{err}"
    );
    let err = parse_standalone_with("{\"routes\": [}", Format::Json, 1, &no_env).unwrap_err();
    assert!(
        err.starts_with("invalid JSON: ") && err.contains("line 1 column"),
        "{err}"
    );
}

#[test]
fn wrong_shapes_refuse_the_file() {
    let err =
        parse_standalone_with("routes: {id: 1}\n#END\n", Format::Yaml, 1, &no_env).unwrap_err();
    assert_eq!(err, "routes: expected a list, found a mapping");
    let err = parse_standalone_with("- 1\n#END\n", Format::Yaml, 1, &no_env).unwrap_err();
    assert_eq!(
        err,
        "the top level must be a mapping of resource lists, found a list"
    );
    // An empty kind is fine.
    assert!(
        parse_standalone_with("routes:\n#END\n", Format::Yaml, 1, &no_env)
            .unwrap()
            .state
            .is_empty()
    );
}

#[test]
fn unknown_keys_warn() {
    let doc = parse(
        "stream_routes: [{id: 1}]\nprotos: []\nsecrets: [{id: vault/1, uri: \"http://v\", prefix: kv, token: t}]\nconsumer_groups: [{id: g}]\nroutes_conf_version: 3\nroutez: []\n#END\n",
        Format::Yaml,
    );
    // Consumer groups, stream routes, protos (none here) and secret managers are served.
    assert_eq!(doc.state.len(), 3);
    assert!(doc.state.get(ResourceKind::Secrets, "vault/1").is_some());
    assert!(doc.state.get(ResourceKind::ConsumerGroups, "g").is_some());
    assert!(doc.state.get(ResourceKind::StreamRoutes, "1").is_some());
    assert_eq!(
        doc.warnings,
        vec!["unknown top-level key `routez` ignored",]
    );
}

#[test]
fn plugins_list() {
    let doc = parse("plugins:\n  - name: limit-count\n  - name: ip-restriction\n    stream: true\n  - prometheus\n#END\n", Format::Yaml);
    assert_eq!(
        doc.plugins,
        Some(vec!["limit-count".to_string(), "prometheus".to_string()])
    );
    assert_eq!(parse("routes: []\n#END\n", Format::Yaml).plugins, None);
}

#[test]
fn env_substitution_yaml_and_json() {
    let env = |name: &str| match name {
        "UP_PORT" => Some("1980".to_string()),
        "ROUTE_URI" => Some("/hello".to_string()),
        _ => None,
    };
    let yaml = "routes:\n  - id: 1\n    uri: ${{ROUTE_URI}}\n    desc: \"${{UP_PORT}}\"\n    priority: ${{UP_PORT}}\n    name: ${{NAME:=dflt}}\n# ${{ONLY_IN_A_COMMENT}}\n#END\n";
    let doc = parse_standalone_with(yaml, Format::Yaml, 1, &env).unwrap();
    let v = &doc.state.get(ResourceKind::Routes, "1").unwrap().value;
    assert_eq!(
        v.parse(),
        json!({"id": 1, "uri": "/hello", "desc": "1980", "priority": 1980, "name": "dflt"})
    );

    let json_text =
        r#"{"routes": [{"id": "1", "uri": "${{ROUTE_URI}}", "priority": "${{UP_PORT}}"}]}"#;
    let doc = parse_standalone_with(json_text, Format::Json, 1, &env).unwrap();
    let v = &doc.state.get(ResourceKind::Routes, "1").unwrap().value;
    assert_eq!(
        v.parse(),
        json!({"id": "1", "uri": "/hello", "priority": 1980})
    );

    let err = parse_standalone_with(
        "routes: [{uri: \"${{MISSING}}\"}]\n#END\n",
        Format::Yaml,
        1,
        &env,
    )
    .unwrap_err();
    assert_eq!(
        err,
        "failed to handle configuration: can't find environment variable MISSING"
    );
}

#[test]
fn yaml_numeric_keys_become_strings() {
    let doc = parse("routes:\n  - id: 1\n    plugins:\n      fault-injection:\n        abort: {http_status: 200}\n    x: {200: ok}\n#END\n", Format::Yaml);
    let v = &doc.state.get(ResourceKind::Routes, "1").unwrap().value;
    assert_eq!(v.parse()["x"], json!({"200": "ok"}));
}

#[test]
fn carry_revisions_keeps_unchanged_items() {
    let old = parse_standalone_with(
        "routes: [{id: a, uri: /a}, {id: b, uri: /b}]\n#END\n",
        Format::Yaml,
        1,
        &no_env,
    )
    .unwrap()
    .state;
    let mut new = parse_standalone_with(
        "routes: [{id: a, uri: /a}, {id: b, uri: /b2}, {id: c, uri: /c}]\n#END\n",
        Format::Yaml,
        2,
        &no_env,
    )
    .unwrap()
    .state;
    carry_revisions(&old, &mut new);
    let rev = |id: &str| {
        let i = new.get(ResourceKind::Routes, id).unwrap();
        (i.create_revision, i.mod_revision)
    };
    assert_eq!((rev("a"), rev("b"), rev("c")), ((1, 1), (1, 2), (2, 2)));
    assert!(StoredValue::ptr_eq(
        &old.get(ResourceKind::Routes, "a").unwrap().value,
        &new.get(ResourceKind::Routes, "a").unwrap().value
    ));
}

#[test]
fn format_from_path() {
    assert_eq!(
        Format::from_path(Path::new("conf/apisix.yaml")),
        Some(Format::Yaml)
    );
    assert_eq!(Format::from_path(Path::new("a.yml")), Some(Format::Yaml));
    assert_eq!(Format::from_path(Path::new("a.json")), Some(Format::Json));
    assert_eq!(Format::from_path(Path::new("a.txt")), None);
}

#[test]
fn shipped_example_apisix_yaml_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/apisix.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let doc = parse_standalone_with(&text, Format::Yaml, 1, &no_env).unwrap();
    assert!(doc.warnings.is_empty(), "{:?}", doc.warnings);
    assert!(doc.state.get(ResourceKind::Routes, "hello").is_some());
    assert!(doc.state.items(ResourceKind::Upstreams).count() >= 1);
    assert!(doc.state.items(ResourceKind::Services).count() >= 1);
}

/// Replaces the file in one step, as editors and config tools do, so the watcher never sees a
/// half-written file.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn next_state(rx: &mut watch::Receiver<Arc<ConfigState>>) -> Arc<ConfigState> {
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("no reload within 5s")
        .unwrap();
    Arc::clone(&rx.borrow_and_update())
}

#[tokio::test]
async fn file_provider_reloads_and_keeps_the_last_good_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("apisix.yaml");
    write_atomic(&path, "routes:\n  - {id: r1, uri: /a, upstream_id: u1}\nupstreams:\n  - {id: u1, nodes: {\"127.0.0.1:1980\": 1}}\n#END\n");

    let (mut rx, task) = FileProvider::new(&path, Format::Yaml)
        .poll_interval(Duration::from_millis(20))
        .spawn()
        .unwrap();
    let first = Arc::clone(&rx.borrow_and_update());
    assert_eq!(first.revision, 1);
    assert_eq!(ids(&first, ResourceKind::Routes), vec!["r1"]);

    // A good edit is published with the next revision; the untouched upstream keeps its own.
    write_atomic(&path, "routes:\n  - {id: r1, uri: /b, upstream_id: u1}\nupstreams:\n  - {id: u1, nodes: {\"127.0.0.1:1980\": 1}}\n#END\n");
    let second = next_state(&mut rx).await;
    assert_eq!(second.revision, 2);
    assert_eq!(
        second
            .get(ResourceKind::Routes, "r1")
            .unwrap()
            .value
            .parse()["uri"],
        json!("/b")
    );
    assert_eq!(
        second.get(ResourceKind::Routes, "r1").unwrap().mod_revision,
        2
    );
    assert_eq!(
        second
            .get(ResourceKind::Upstreams, "u1")
            .unwrap()
            .mod_revision,
        1
    );

    // A broken edit (no #END, then bad YAML) publishes nothing.
    write_atomic(&path, "routes:\n  - {id: r1, uri: /c}\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    write_atomic(&path, "routes:\n  - {id: r1, uri: /c\n#END\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().unwrap());
    assert_eq!(rx.borrow().revision, 2);

    // Fixing it publishes again.
    write_atomic(&path, "routes:\n  - {id: r1, uri: /c}\n#END\n");
    let third = next_state(&mut rx).await;
    assert_eq!(third.revision, 3);
    assert_eq!(
        third.get(ResourceKind::Routes, "r1").unwrap().value.parse()["uri"],
        json!("/c")
    );
    assert!(third.get(ResourceKind::Upstreams, "u1").is_none());

    // Same-length rewrite within the same second is still noticed (content hash).
    write_atomic(&path, "routes:\n  - {id: r1, uri: /d}\n#END\n");
    assert_eq!(
        next_state(&mut rx)
            .await
            .get(ResourceKind::Routes, "r1")
            .unwrap()
            .value
            .parse()["uri"],
        json!("/d")
    );

    // Deleting the file keeps the state; the task ends once nobody listens.
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!rx.has_changed().unwrap());
    drop(rx);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("watcher did not stop")
        .unwrap();
}

#[tokio::test]
async fn file_provider_json_and_start_failures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("apisix.json");
    std::fs::write(&path, r#"{"routes": [{"id": "j", "uri": "/j"}]}"#).unwrap();
    let (rx, _task) = FileProvider::start(&path, Format::Json).unwrap();
    assert_eq!(ids(&rx.borrow(), ResourceKind::Routes), vec!["j"]);

    let err = FileProvider::start(dir.path().join("missing.yaml"), Format::Yaml).unwrap_err();
    assert!(err.starts_with("failed to read "), "{err}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "routes: []\n").unwrap();
    let err = FileProvider::start(&bad, Format::Yaml).unwrap_err();
    assert_eq!(
        err,
        format!(
            "failed to parse {}: missing valid end flag: the file must end with a line `#END`",
            bad.display()
        )
    );
}

#[test]
fn file_provider_needs_a_runtime() {
    let err = FileProvider::start("/nonexistent/apisix.yaml", Format::Yaml).unwrap_err();
    assert_eq!(err, "FileProvider must be started inside a Tokio runtime");
}

/// Issue 8, finding 9: a standalone file nested 100k deep is refused at once.
#[test]
fn deeply_nested_standalone_file_is_refused_quickly() {
    let started = std::time::Instant::now();
    let text = format!("routes: {}\n#END\n", "[".repeat(100_000));
    let err = parse_standalone_with(&text, Format::Yaml, 1, &no_env).unwrap_err();
    assert!(err.contains("nested deeper than 256 levels"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
