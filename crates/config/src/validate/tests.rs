//! Resource checks end to end, with the messages of the Admin API reference (§6.5–§6.7) and
//! the conformance cases (`cases/admin/validate-*.json`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use super::addr::parse_addr;
use super::*;
use crate::model::{KeepalivePool, LbType, PassHost, ResourceKind, Scheme, Timeout};
use crate::schema;
use crate::state::ConfigState;
use crate::state::StoredItem;

/// A plugin registry with real schemas for a few plugins, shaped like APISIX's (`_meta`
/// injected into every schema).
struct TestPlugins(HashMap<&'static str, Value>);

impl TestPlugins {
    fn new() -> Self {
        let with_meta = |mut s: Value| {
            s["properties"]["_meta"] = schema::plugin_meta_schema().clone();
            s
        };
        let mut m = HashMap::new();
        m.insert(
            "prometheus",
            with_meta(json!({"type": "object", "properties": {"prefer_name": {"type": "boolean", "default": false}}})),
        );
        m.insert(
            "limit-count",
            with_meta(json!({
                "type": "object",
                "properties": {
                    "count": {"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]},
                    "time_window": {"oneOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "string"}]},
                    "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
                    "key": {"type": "string", "default": "remote_addr"}
                },
                "oneOf": [{"required": ["count", "time_window"]}, {"required": ["rules"]}]
            })),
        );
        TestPlugins(m)
    }
}

impl PluginCheck for TestPlugins {
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        let schema = self
            .0
            .get(name)
            .ok_or_else(|| format!("unknown plugin [{name}]"))?;
        schema::validate(schema, conf)
            .map_err(|e| format!("failed to check the configuration of plugin {name} err: {e}"))
    }

    fn check_metadata(&self, name: &str, _conf: &Value) -> Result<(), String> {
        if self.0.contains_key(name) {
            Ok(())
        } else {
            Err("invalid plugin name".to_string())
        }
    }
}

fn check(kind: ResourceKind, v: Value) -> Result<(), String> {
    check_resource(kind, &v, &TestPlugins::new()).map_err(|e| e.message)
}

fn route_msg(v: Value) -> String {
    check(ResourceKind::Routes, v).unwrap_err()
}

fn upstream_msg(v: Value) -> String {
    check(ResourceKind::Upstreams, v).unwrap_err()
}

fn up() -> Value {
    json!({"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}})
}

// ---- conformance cases ----

#[test]
fn conformance_route_missing_uri() {
    assert_eq!(
        route_msg(json!({"methods": ["GET"], "upstream": up()})),
        "invalid configuration: allOf 1 failed: value should match only one schema, but matches none"
    );
}

#[test]
fn conformance_route_bad_method() {
    assert_eq!(
        route_msg(json!({"methods": ["invalid_method"], "uri": "/index.html"})),
        "invalid configuration: property \"methods\" validation failed: failed to validate item 1: matches none of the enum values"
    );
}

#[test]
fn conformance_route_wrong_field_type() {
    assert_eq!(
        route_msg(json!({"uri": 123, "upstream": up()})),
        "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"
    );
    assert_eq!(
        route_msg(json!({"uri": "/adm-c23", "upstream": up(), "plugins": "limit-count"})),
        "invalid configuration: property \"plugins\" validation failed: wrong type: expected object, got string"
    );
}

#[test]
fn conformance_unknown_plugin() {
    assert_eq!(
        route_msg(json!({"uri": "/adm-c19", "plugins": {"no-such-plugin": {}}, "upstream": up()})),
        "unknown plugin [no-such-plugin]"
    );
    assert_eq!(
        check(
            ResourceKind::Services,
            json!({"plugins": {"no-such-plugin": {}}})
        )
        .unwrap_err(),
        "unknown plugin [no-such-plugin]"
    );
}

#[test]
fn conformance_upstream_bad_node() {
    let msg = "invalid configuration: property \"nodes\" validation failed: object matches none of the required";
    assert_eq!(
        upstream_msg(json!({"nodes": {"127.0.0.1:8080": "1"}, "type": "roundrobin"})),
        msg
    );
    assert_eq!(
        upstream_msg(
            json!({"nodes": [{"host": "127.0.0.1", "port": 0, "weight": 1}], "type": "roundrobin"})
        ),
        msg
    );
    assert_eq!(
        route_msg(json!({"uri": "/adm-c18", "upstream": {"nodes": {"127.0.0.1:8080": -100}, "type": "roundrobin"}})),
        "invalid configuration: property \"upstream\" validation failed: property \"nodes\" validation failed: object matches none of the required"
    );
}

#[test]
fn conformance_limit_count_negative_count() {
    let conf =
        json!({"count": -100, "time_window": 60, "rejected_code": 503, "key": "remote_addr"});
    assert_eq!(
        route_msg(json!({"uri": "/adm-c20", "upstream": up(), "plugins": {"limit-count": conf}})),
        "failed to check the configuration of plugin limit-count err: property \"count\" validation failed: value should match only one schema, but matches none"
    );
    assert_eq!(
        route_msg(json!({"uri": "/x", "upstream": up(), "plugins": {"limit-count": {"time_window": 60}}})),
        "failed to check the configuration of plugin limit-count err: value should match only one schema, but matches none"
    );
    assert_eq!(
        route_msg(json!({"uri": "/x", "upstream": up(), "plugins": {"limit-count": {"count": 1, "time_window": 60, "rejected_code": 600}}})),
        "failed to check the configuration of plugin limit-count err: property \"rejected_code\" validation failed: expected 600 to be at most 599"
    );
}

#[test]
fn conformance_prometheus_conf() {
    assert_eq!(
        route_msg(json!({"uri": "/adm-c21", "upstream": up(), "plugins": {"prometheus": {"prefer_name": "yes"}}})),
        "failed to check the configuration of plugin prometheus err: property \"prefer_name\" validation failed: wrong type: expected boolean, got string"
    );
    check(
        ResourceKind::Routes,
        json!({"uri": "/adm-c21", "upstream": up(), "plugins": {"prometheus": {}}}),
    )
    .unwrap();
}

// ---- §6.7 catalogue ----

#[test]
fn route_pre_schema_checks() {
    assert_eq!(
        route_msg(json!({"uri": "/a", "host": "a.com", "hosts": ["b.com"], "upstream": up()})),
        "only one of host or hosts is allowed"
    );
    assert_eq!(
        route_msg(
            json!({"uri": "/a", "remote_addr": "127.0.0.1", "remote_addrs": ["127.0.0.1"], "upstream": up()})
        ),
        "only one of remote_addr or remote_addrs is allowed"
    );
    // Both checks run before the schema, so they win over any schema error.
    assert_eq!(
        route_msg(json!({"host": "a.com", "hosts": ["b.com"]})),
        "only one of host or hosts is allowed"
    );
}

#[test]
fn route_catalogue() {
    assert_eq!(
        route_msg(json!({"uri": "/a", "uris": ["/b"], "upstream": up()})),
        "invalid configuration: allOf 1 failed: value should match only one schema, but matches both schemas 1 and 2"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a"})),
        r#"invalid configuration: object matches none of the required: ["plugins","uri"] or ["upstream","uri"] or ["upstream_id","uri"] or ["service_id","uri"] or ["plugins","uris"] or ["upstream","uris"] or ["upstream_id","uris"] or ["service_id","uris"] or ["script","uri"] or ["script","uris"]"#
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "methods": "GET", "upstream": up()})),
        "invalid configuration: property \"methods\" validation failed: wrong type: expected array, got string"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "remote_addr": "127.0.0.33333", "upstream": up()})),
        "invalid configuration: property \"remote_addr\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "foo": 1, "upstream": up()})),
        "invalid configuration: additional properties forbidden, found foo"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "upstream": up(), "vars": [["arg_x", "=", "1"]]})),
        "failed to validate the 'vars' expression: invalid operator '='"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "upstream": up(), "vars": ["arg_x", "==", "1"]})),
        "failed to validate the 'vars' expression: rule should be wrapped inside brackets"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "upstream": up(), "vars": [["post_arg.messages[.content[*].type", "has", "x"]]})),
        "failed to validate the 'vars' expression: invalid expression \"$.essages[.content[*].type\" near \"[.content[*].type\""
    );
}

#[test]
fn upstream_catalogue() {
    assert_eq!(
        upstream_msg(json!({"type": "roundrobin"})),
        "invalid configuration: value should match only one schema, but matches none"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {"127.0.0.1:65536": 1}})),
        "invalid port 65536"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {"127.0.0.1:0": 1}})),
        "invalid port 0"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {"[::1]:70000": 1}})),
        "invalid port 70000"
    );
    assert_eq!(
        route_msg(json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:65536": 1}}})),
        "invalid port 65536"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {"127.0.0.1:80": 1}, "type": "chash"})),
        "missing key"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {}, "retries": -1})),
        "invalid configuration: property \"retries\" validation failed: expected -1 to be at least 0"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {}, "pass_host": "rewrite"})),
        "`upstream_host` can't be empty when `pass_host` is `rewrite`"
    );
    assert_eq!(
        upstream_msg(json!({"nodes": {}, "pass_host": "rewrite", "upstream_host": ""})),
        r#"invalid configuration: property "upstream_host" validation failed: failed to match pattern "^\\*$|^\\*?[0-9a-zA-Z-._\\[\\]:]+$" with """#
    );
    check(
        ResourceKind::Upstreams,
        json!({"nodes": {}, "pass_host": "rewrite", "upstream_host": "a.com"}),
    )
    .unwrap();
}

#[test]
fn ports_and_addresses_that_pass() {
    // No port, a domain, bracketed IPv6, an unparsable port: APISIX only checks numeric ports.
    check(
        ResourceKind::Upstreams,
        json!({"nodes": {"a.com": 1, "[::1]:80": 1, "[::1]": 1, "::1": 1, "127.0.0.1:abc": 1, "127.0.0.1:65535": 1}}),
    )
    .unwrap();
}

#[test]
fn ipv6_hosts_in_array_nodes_need_brackets() {
    let msg = "invalid configuration: IPv6 address must be enclosed with '[' and ']'";
    assert_eq!(
        upstream_msg(json!({"nodes": [{"host": "::1", "port": 80, "weight": 1}]})),
        msg
    );
    // Checked before the upstream schema, so it wins over a missing weight...
    assert_eq!(
        upstream_msg(json!({"nodes": [{"host": "::1", "port": 80}]})),
        msg
    );
    // ...but inline in a route the route schema runs first.
    assert_eq!(
        route_msg(json!({"uri": "/a", "upstream": {"nodes": [{"host": "::1", "port": 80}]}})),
        "invalid configuration: property \"upstream\" validation failed: property \"nodes\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_msg(
            json!({"uri": "/a", "upstream": {"nodes": [{"host": "::1", "port": 80, "weight": 1}]}})
        ),
        msg
    );
    check(
        ResourceKind::Upstreams,
        json!({"nodes": [{"host": "[::1]", "port": 80, "weight": 1}]}),
    )
    .unwrap();
}

#[test]
fn chash_keys() {
    let base = |extra: Value| {
        let mut v = json!({"nodes": {"127.0.0.1:80": 1}, "type": "chash"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    check(ResourceKind::Upstreams, base(json!({"key": "remote_addr"}))).unwrap();
    check(
        ResourceKind::Upstreams,
        base(json!({"key": "arg_device_id"})),
    )
    .unwrap();
    check(
        ResourceKind::Upstreams,
        base(json!({"hash_on": "consumer"})),
    )
    .unwrap();
    check(
        ResourceKind::Upstreams,
        base(json!({"hash_on": "vars_combinations", "key": "$a$b"})),
    )
    .unwrap();
    assert_eq!(
        upstream_msg(base(json!({"key": "not_support"}))),
        r#"invalid configuration: failed to match pattern "^((uri|server_name|server_addr|request_uri|remote_port|remote_addr|query_string|host|hostname|mqtt_client_id)|arg_[0-9a-zA-z_-]+)$" with "not_support""#
    );
    assert_eq!(
        upstream_msg(base(json!({"hash_on": "header", "key": "$#^@"}))),
        r#"invalid configuration: failed to match pattern "^[a-zA-Z0-9-_]+$" with "$#^@""#
    );
    assert_eq!(
        upstream_msg(base(json!({"hash_on": "cookie"}))),
        "missing key"
    );
}

#[test]
fn plugin_conf_must_be_a_table() {
    let route =
        |conf: Value| json!({"uri": "/a", "upstream": up(), "plugins": {"prometheus": conf}});
    assert_eq!(
        route_msg(route(json!(true))),
        "invalid plugin conf true for plugin [prometheus]"
    );
    assert_eq!(
        route_msg(route(json!(1.0))),
        "invalid plugin conf 1 for plugin [prometheus]"
    );
    assert_eq!(
        route_msg(route(json!("a/b"))),
        r#"invalid plugin conf "a/b" for plugin [prometheus]"#
    );
    assert_eq!(
        route_msg(route(Value::Null)),
        r#"invalid plugin conf "userdata: NULL" for plugin [prometheus]"#
    );
    // An empty array is an empty table to Lua.
    check(ResourceKind::Routes, route(json!([]))).unwrap();
}

#[test]
fn plugin_meta_handling() {
    let route =
        |conf: Value| json!({"uri": "/a", "upstream": up(), "plugins": {"prometheus": conf}});
    // 3.18: a disabled plugin whose schema fails is accepted.
    check(
        ResourceKind::Routes,
        route(json!({"prefer_name": "yes", "_meta": {"disable": true}})),
    )
    .unwrap();
    assert!(route_msg(route(
        json!({"prefer_name": "yes", "_meta": {"disable": false}})
    ))
    .starts_with("failed to check the configuration of plugin prometheus err:"));
    // An unknown plugin is not rescued by `_meta.disable`.
    assert_eq!(
        route_msg(
            json!({"uri": "/a", "upstream": up(), "plugins": {"nope": {"_meta": {"disable": true}}}})
        ),
        "unknown plugin [nope]"
    );
    assert_eq!(
        route_msg(route(json!({"_meta": {"filter": [["arg_x", "=", "1"]]}}))),
        "failed to validate the 'vars' expression: invalid operator '='"
    );
    assert_eq!(
        route_msg(route(json!({"_meta": {"foo": 1}}))),
        "failed to check the configuration of plugin prometheus err: property \"_meta\" validation failed: additional properties forbidden, found foo"
    );
    check(
        ResourceKind::Routes,
        route(json!({"_meta": {"filter": [["arg_x", "==", "1"]], "priority": 3}})),
    )
    .unwrap();
}

#[test]
fn accept_any_plugin() {
    let p = AcceptAnyPlugin;
    let v = json!({"uri": "/a", "plugins": {"anything": {"x": 1}, "other": {}}});
    check_resource(ResourceKind::Routes, &v, &p).unwrap();
    let v = json!({"uri": "/a", "plugins": {"anything": [1]}});
    assert_eq!(
        check_resource(ResourceKind::Routes, &v, &p).unwrap_err().message,
        "failed to check the configuration of plugin anything err: wrong type: expected object, got table"
    );
    let v = json!({"uri": "/a", "plugins": {"anything": 5}});
    assert_eq!(
        check_resource(ResourceKind::Routes, &v, &p)
            .unwrap_err()
            .to_string(),
        "invalid plugin conf 5 for plugin [anything]"
    );
}

#[test]
fn other_resources() {
    assert_eq!(
        check(ResourceKind::Services, json!({"name": "x".repeat(257)})).unwrap_err(),
        "invalid configuration: property \"name\" validation failed: string too long, expected at most 256, got 257"
    );
    check(ResourceKind::Services, json!({})).unwrap();
    assert_eq!(
        check(
            ResourceKind::Services,
            json!({"upstream": {"nodes": {"a:99999": 1}}})
        )
        .unwrap_err(),
        "invalid port 99999"
    );
    check(
        ResourceKind::PluginConfigs,
        json!({"id": "1", "plugins": {"prometheus": {}}}),
    )
    .unwrap();
    assert_eq!(
        check(
            ResourceKind::PluginConfigs,
            json!({"id": "1", "plugins": {"x": {}}})
        )
        .unwrap_err(),
        "unknown plugin [x]"
    );
    assert_eq!(
        check(ResourceKind::GlobalRules, json!({"id": "1"})).unwrap_err(),
        "invalid configuration: property \"plugins\" is required"
    );
    assert_eq!(
        check(
            ResourceKind::Consumers,
            json!({"username": "jack", "plugins": {"x": {}}})
        )
        .unwrap_err(),
        "invalid plugins configuration: unknown plugin [x]"
    );
    assert_eq!(
        check(ResourceKind::Consumers, json!({"plugins": {}})).unwrap_err(),
        "invalid configuration: property \"username\" is required"
    );
    let cert = include_str!("../../../../tests/data/tls/server.crt");
    let key = include_str!("../../../../tests/data/tls/server.key");
    check(
        ResourceKind::Ssls,
        json!({"cert": cert, "key": key, "sni": "a.com"}),
    )
    .unwrap();
    // A key of another certificate is stored (APISIX checks the pair at handshake time).
    let other_key = include_str!("../../../../tests/data/tls/other.key");
    check(
        ResourceKind::Ssls,
        json!({"cert": cert, "key": other_key, "sni": "a.com"}),
    )
    .unwrap();
    let bad_cert = cert.replace("MII", "XXX");
    assert_eq!(
        check(
            ResourceKind::Ssls,
            json!({"cert": bad_cert, "key": key, "sni": "a.com"})
        )
        .unwrap_err(),
        "failed to parse cert: PEM_read_bio_X509_AUX() failed"
    );
    assert_eq!(
        check(
            ResourceKind::Ssls,
            json!({"cert": cert, "key": key, "sni": "a.com", "certs": [cert], "keys": [cert]})
        )
        .unwrap_err(),
        "failed to handle cert-key pair[1]: failed to parse key: PEM_read_bio_PrivateKey() failed"
    );
    assert_eq!(
        check(
            ResourceKind::Ssls,
            json!({"cert": cert, "key": key, "sni": "a.com", "client": {"ca": key}})
        )
        .unwrap_err(),
        "failed to validate client_cert: failed to parse cert: PEM_read_bio_X509_AUX() failed"
    );
    assert_eq!(
        check(
            ResourceKind::Ssls,
            json!({"cert": cert, "key": key, "sni": "a.com", "certs": [cert]})
        )
        .unwrap_err(),
        "mismatched number of certs and keys"
    );
    assert_eq!(
        check(ResourceKind::PluginMetadata, json!({})).unwrap_err(),
        "missing plugin name"
    );
    assert_eq!(
        check(ResourceKind::PluginMetadata, json!({"id": "nope"})).unwrap_err(),
        "invalid plugin name"
    );
    check(ResourceKind::PluginMetadata, json!({"id": "prometheus"})).unwrap();
}

// ---- references ----

struct Store(BTreeMap<(ResourceKind, String), Value>);

impl ReferenceLookup for Store {
    fn lookup(&self, kind: ResourceKind, id: &str) -> Option<Arc<Value>> {
        self.0.get(&(kind, id.to_string())).cloned().map(Arc::new)
    }
}

#[test]
fn references_are_listed_in_check_order() {
    let v = json!({
        "uri": "/a",
        "upstream": {"nodes": {}, "tls": {"client_cert_id": 7}},
        "upstream_id": 1,
        "service_id": "s",
        "plugin_config_id": "p"
    });
    assert_eq!(
        references(ResourceKind::Routes, &v),
        vec![
            (ResourceKind::Ssls, "7".to_string()),
            (ResourceKind::Upstreams, "1".to_string()),
            (ResourceKind::Services, "s".to_string()),
            (ResourceKind::PluginConfigs, "p".to_string()),
        ]
    );
    assert_eq!(
        references(
            ResourceKind::Services,
            &json!({"upstream_id": "u", "service_id": "x"})
        ),
        vec![(ResourceKind::Upstreams, "u".to_string())]
    );
    assert_eq!(
        references(
            ResourceKind::Upstreams,
            &json!({"nodes": {}, "tls": {"client_cert_id": "c"}})
        ),
        vec![(ResourceKind::Ssls, "c".to_string())]
    );
    assert!(references(ResourceKind::GlobalRules, &json!({"id": 1, "plugins": {}})).is_empty());
}

#[test]
fn reference_checks_run_in_apisix_order() {
    let mut store = Store(BTreeMap::new());
    let p = TestPlugins::new();
    let route = json!({"uri": "/a", "upstream_id": 1, "service_id": "s", "plugins": {"nope": {}}});
    assert_eq!(
        check_resource_with_refs(ResourceKind::Routes, &route, &p, &store)
            .unwrap_err()
            .message,
        "failed to fetch upstream info by upstream id [1], response code: 404"
    );
    store.0.insert(
        (ResourceKind::Upstreams, "1".to_string()),
        json!({"nodes": {}}),
    );
    assert_eq!(
        check_resource_with_refs(ResourceKind::Routes, &route, &p, &store)
            .unwrap_err()
            .message,
        "failed to fetch service info by service id [s], response code: 404"
    );
    store
        .0
        .insert((ResourceKind::Services, "s".to_string()), json!({}));
    assert_eq!(
        check_resource_with_refs(ResourceKind::Routes, &route, &p, &store)
            .unwrap_err()
            .message,
        "unknown plugin [nope]"
    );
    let route = json!({"uri": "/a", "plugin_config_id": "pc", "plugins": {}});
    assert_eq!(
        check_resource_with_refs(ResourceKind::Routes, &route, &p, &store)
            .unwrap_err()
            .message,
        "failed to fetch plugin config info by plugin config id [pc], response code: 404"
    );
    let up = json!({"nodes": {}, "tls": {"client_cert_id": "c1"}});
    assert_eq!(
        check_resource_with_refs(ResourceKind::Upstreams, &up, &p, &store)
            .unwrap_err()
            .message,
        "failed to fetch ssl info by ssl id [c1], response code: 404"
    );
    store.0.insert(
        (ResourceKind::Ssls, "c1".to_string()),
        json!({"type": "server"}),
    );
    assert_eq!(
        check_resource_with_refs(ResourceKind::Upstreams, &up, &p, &store)
            .unwrap_err()
            .message,
        "failed to fetch ssl info by ssl id [c1], wrong ssl type"
    );
    store.0.insert(
        (ResourceKind::Ssls, "c1".to_string()),
        json!({"type": "client"}),
    );
    check_resource_with_refs(ResourceKind::Upstreams, &up, &p, &store).unwrap();
    // Without a lookup the references are left to the caller.
    check_resource(
        ResourceKind::Routes,
        &json!({"uri": "/a", "upstream_id": "zzz"}),
        &p,
    )
    .unwrap();
}

#[test]
fn config_state_is_a_reference_lookup() {
    let mut state = ConfigState::default();
    let item = StoredItem {
        id: "1".into(),
        value: (&json!({"nodes": {}})).into(),
        create_revision: 1,
        mod_revision: 1,
        seq: 0,
    };
    state
        .resources
        .entry(ResourceKind::Upstreams)
        .or_default()
        .insert("1".into(), item);
    assert!(state.lookup(ResourceKind::Upstreams, "1").is_some());
    assert!(state.lookup(ResourceKind::Upstreams, "2").is_none());
    assert_eq!(
        missing_reference_message(ResourceKind::Services, "9"),
        "failed to fetch service info by service id [9], response code: 404"
    );
}

#[test]
fn forbidden_bookkeeping_fields() {
    assert_eq!(
        check_forbidden_properties(&json!({"uri": "/a", "create_time": 1}))
            .unwrap_err()
            .message,
        "the property is forbidden:  create_time"
    );
    assert_eq!(
        check_forbidden_properties(&json!({"upstream": {"update_time": 1}}))
            .unwrap_err()
            .message,
        "the property is forbidden:  upstream.update_time"
    );
    assert_eq!(
        check_forbidden_properties(&json!({"plugins": {"create_time": {}}}))
            .unwrap_err()
            .message,
        "the property is forbidden:  plugins.create_time"
    );
    check_forbidden_properties(&json!({"uri": "/a", "create_time": false})).unwrap();
}

#[test]
fn global_rule_conflicts() {
    let others = [
        json!({"id": "1", "plugins": {"prometheus": {}}}),
        json!({"id": 2, "plugins": {"limit-count": {}}}),
    ];
    let new = json!({"plugins": {"a": {}, "limit-count": {}}});
    assert_eq!(
        check_global_rule_conflicts("3", &new, &others)
            .unwrap_err()
            .message,
        "plugin 'limit-count' already exists in global rule with id '2'"
    );
    check_global_rule_conflicts("2", &new, &others).unwrap();
}

// ---- converters ----

#[test]
fn route_conversion_normalises() {
    let v = json!({
        "uri": "/hello",
        "host": "Foo.COM",
        "remote_addr": "10.0.0.0/8",
        "methods": ["GET"],
        "status": 0,
        "name": "r",
        "labels": {"env": "prod"},
        "timeout": {"connect": 1, "send": 2, "read": 3.5},
        "enable_websocket": true,
        "plugin_config_id": 5,
        "vars": [["arg_a", "==", "1"]],
        "plugins": {"prometheus": {}},
        "upstream": {
            "scheme": "https",
            "nodes": {"b.com": 2, "127.0.0.1:8080": 1, "[::1]:81": 3, "::2": 4, "[::3]": 5}
        }
    });
    let r = route_from_value("r1", &v, &TestPlugins::new()).unwrap();
    assert_eq!(r.id, "r1");
    assert_eq!(r.uris, vec!["/hello"]);
    assert_eq!(r.hosts, vec!["foo.com"]);
    assert_eq!(r.remote_addrs, vec!["10.0.0.0/8"]);
    assert_eq!(r.methods, Some(vec!["GET".to_string()]));
    assert!(!r.enabled);
    assert_eq!(r.priority, 0);
    assert_eq!(r.name.as_deref(), Some("r"));
    assert_eq!(
        r.timeout.as_deref(),
        Some(&Timeout {
            connect: 1.0,
            send: 2.0,
            read: 3.5
        })
    );
    assert_eq!(r.enable_websocket, Some(true));
    assert_eq!(r.plugin_config_id.as_deref(), Some("5"));
    assert_eq!(r.vars.as_deref(), Some(&json!([["arg_a", "==", "1"]])));
    assert!(r.plugins.contains_key("prometheus"));
    let up = r.upstream.unwrap();
    assert_eq!(up.scheme, Scheme::Https);
    assert_eq!(up.lb_type, LbType::RoundRobin);
    assert_eq!(up.pass_host, PassHost::Pass);
    assert_eq!(up.hash_on.as_deref(), Some("vars"));
    let nodes: Vec<(&str, u16, u32)> = up
        .nodes
        .iter()
        .map(|n| (n.host.as_str(), n.port, n.weight))
        .collect();
    assert_eq!(
        nodes,
        vec![
            ("b.com", 443, 2),
            ("127.0.0.1", 8080, 1),
            ("[::1]", 81, 3),
            ("[::2]", 443, 4),
            ("[::3]", 443, 5)
        ]
    );
}

#[test]
fn route_conversion_lists_and_defaults() {
    let v = json!({"uris": ["/a", "/b"], "hosts": ["A.com", "*.B.com"], "remote_addrs": ["::1"], "methods": [], "priority": 7, "upstream_id": "u"});
    let r = route_from_value("2", &v, &AcceptAnyPlugin).unwrap();
    assert_eq!(r.uris, vec!["/a", "/b"]);
    assert_eq!(r.hosts, vec!["a.com", "*.b.com"]);
    assert_eq!(r.remote_addrs, vec!["::1"]);
    assert_eq!(r.methods, None);
    assert_eq!(r.priority, 7);
    assert!(r.enabled);
    assert_eq!(r.upstream_id.as_deref(), Some("u"));
    assert!(r.upstream.is_none());
    assert!(r.vars.is_none());
}

#[test]
fn route_conversion_refuses_invalid_routes() {
    let e = route_from_value("1", json!({"uri": "/a"}), &AcceptAnyPlugin).unwrap_err();
    assert!(
        e.message
            .starts_with("invalid configuration: object matches none of the required"),
        "{e}"
    );
    let e = route_from_value(
        "1",
        json!({"uri": "/a", "upstream_id": 1, "vars": [["a", "=", "b"]]}),
        &AcceptAnyPlugin,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "failed to validate the 'vars' expression: invalid operator '='"
    );
}

#[test]
fn upstream_conversion() {
    let v = json!({
        "type": "chash",
        "key": "remote_addr",
        "retries": 2,
        "retry_timeout": 1.5,
        "pass_host": "rewrite",
        "upstream_host": "up.com",
        "keepalive_pool": {"size": 10},
        "checks": {"active": {"http_path": "/status", "healthy": {}}},
        "nodes": [
            {"host": "127.0.0.1", "port": 1980, "weight": 3, "priority": 1, "metadata": {"a": 1}},
            {"host": "a.com", "weight": 0}
        ]
    });
    let u = upstream_from_value(Some("u1"), &v).unwrap();
    assert_eq!(u.id.as_deref(), Some("u1"));
    assert_eq!(u.lb_type, LbType::Chash);
    assert_eq!(u.key.as_deref(), Some("remote_addr"));
    assert_eq!(u.retries, Some(2));
    assert_eq!(u.retry_timeout, 1.5);
    assert_eq!(u.pass_host, PassHost::Rewrite);
    assert_eq!(u.upstream_host.as_deref(), Some("up.com"));
    assert_eq!(
        u.keepalive_pool,
        KeepalivePool {
            size: 10,
            idle_timeout: 60.0,
            requests: 1000
        }
    );
    // Health-check defaults are filled in by the schema.
    assert_eq!(
        u.checks.as_ref().unwrap()["active"]["healthy"]["http_statuses"],
        json!([200, 302])
    );
    assert_eq!(u.nodes.len(), 2);
    assert_eq!(u.nodes[0].priority, 1);
    assert_eq!(u.nodes[0].metadata.as_deref(), Some(&json!({"a": 1})));
    assert_eq!(
        (
            u.nodes[1].host.as_str(),
            u.nodes[1].port,
            u.nodes[1].weight,
            u.nodes[1].priority
        ),
        ("a.com", 80, 0, 0)
    );

    let u = upstream_from_value(
        None,
        json!({"nodes": {"127.0.0.1:80": 1}, "type": "least_conn"}),
    )
    .unwrap();
    assert_eq!(u.id, None);
    assert_eq!(u.lb_type, LbType::LeastConn);
    assert_eq!(u.retries, None);
    assert_eq!(u.keepalive_pool, KeepalivePool::default());
    let u = upstream_from_value(None, json!({"nodes": {}, "type": "maglev"})).unwrap();
    assert_eq!(u.lb_type, LbType::Other("maglev".to_string()));
    assert_eq!(
        upstream_from_value(None, json!({"nodes": {"a:0": 1}}))
            .unwrap_err()
            .message,
        "invalid port 0"
    );
}

#[test]
fn http_version_label() {
    let up = |v: Value| upstream_from_value(None, v);
    let nodes = json!({"127.0.0.1:80": 1});
    assert!(!up(json!({"nodes": nodes})).unwrap().http2);
    for scheme in ["http", "https", "grpc", "grpcs"] {
        let u = up(json!({"nodes": nodes, "scheme": scheme,
            "labels": {"ferrisix.http_version": "2"}}))
        .unwrap();
        assert!(u.http2, "{scheme}");
    }
    let u =
        up(json!({"nodes": nodes, "labels": {"ferrisix.http_version": "1.1", "x": "y"}})).unwrap();
    assert!(!u.http2);
    assert_eq!(
        up(json!({"nodes": nodes, "labels": {"ferrisix.http_version": "3"}}))
            .unwrap_err()
            .message,
        r#"invalid configuration: label "ferrisix.http_version" must be one of "1.1", "2" with scheme "http""#
    );
    assert_eq!(
        up(json!({"nodes": nodes, "scheme": "grpc", "labels": {"ferrisix.http_version": "1.1"}}))
            .unwrap_err()
            .message,
        r#"invalid configuration: label "ferrisix.http_version" must be one of "2" with scheme "grpc""#
    );
    assert_eq!(
        up(json!({"nodes": nodes, "scheme": "tcp", "labels": {"ferrisix.http_version": "2"}}))
            .unwrap_err()
            .message,
        r#"invalid configuration: label "ferrisix.http_version" is not supported with scheme "tcp""#
    );
}

#[test]
fn service_plugin_config_and_global_rule_conversion() {
    let s = service_from_value(
        "s1",
        json!({"hosts": ["Api.COM"], "upstream_id": 3, "plugins": {"prometheus": {}}, "enable_websocket": false}),
        &TestPlugins::new(),
    )
    .unwrap();
    assert_eq!(s.id, "s1");
    assert_eq!(s.hosts, vec!["api.com"]);
    assert_eq!(s.upstream_id.as_deref(), Some("3"));
    assert_eq!(s.enable_websocket, Some(false));
    assert!(s.plugins.contains_key("prometheus"));

    // The id may be missing from the stored document; the key's id is used.
    let pc = plugin_config_from_value(
        "pc1",
        json!({"plugins": {"prometheus": {}}}),
        &TestPlugins::new(),
    )
    .unwrap();
    assert_eq!(pc.id, "pc1");
    assert_eq!(pc.plugins.len(), 1);
    let gr = global_rule_from_value(
        "g1",
        json!({"id": "g1", "plugins": {"prometheus": {}}}),
        &TestPlugins::new(),
    )
    .unwrap();
    assert_eq!(gr.id, "g1");
    assert_eq!(
        global_rule_from_value("g1", json!({"plugins": {"nope": {}}}), &TestPlugins::new())
            .unwrap_err()
            .message,
        "unknown plugin [nope]"
    );
}

#[test]
fn addresses_split_like_apisix() {
    assert_eq!(parse_addr("127.0.0.1:80"), ("127.0.0.1", Some(80.0)));
    assert_eq!(parse_addr("127.0.0.1"), ("127.0.0.1", None));
    assert_eq!(parse_addr("a.com:8080"), ("a.com", Some(8080.0)));
    assert_eq!(parse_addr("localhost:1"), ("localhost", Some(1.0)));
    assert_eq!(parse_addr("[::1]:80"), ("[::1]", Some(80.0)));
    assert_eq!(parse_addr("[::1]"), ("[::1]", None));
    assert_eq!(parse_addr("::1"), ("::1", None));
    assert_eq!(parse_addr("::1:80"), ("::1:80", None));
    assert_eq!(parse_addr("127.0.0.1:abc"), ("127.0.0.1", None));
    // A trailing colon stays in the host.
    assert_eq!(parse_addr("host:"), ("host:", None));
}

/// A synced route's inline upstream is checked by the route's schema once (as APISIX's config
/// loader does), and its other upstream checks still run.
#[test]
fn a_synced_inline_upstream_is_checked_by_its_route_schema_and_the_upstream_checks() {
    let synced = |up: Value| {
        route_from_value("r", json!({"uri": "/a", "upstream": up}), &AcceptAnyPlugin)
            .map(|_| ())
            .map_err(|e| e.message)
    };
    let admin = |up: Value| check(ResourceKind::Routes, json!({"uri": "/a", "upstream": up}));
    let cases = [
        json!({"nodes": {"127.0.0.1:80": 1}, "retries": -1}),
        json!({"nodes": {"127.0.0.1:70000": 1}}),
        json!({"nodes": {"127.0.0.1:80": 1}, "pass_host": "rewrite"}),
        json!({"nodes": [{"host": "::1", "port": 80, "weight": 1}]}),
        json!({"nodes": {"127.0.0.1:80": 1}, "type": "chash", "hash_on": "header"}),
    ];
    for up in cases {
        let (a, b) = (synced(up.clone()), admin(up.clone()));
        assert!(a.is_err(), "{up}");
        // The same refusal as through the Admin API.
        assert_eq!(a, b, "{up}");
    }
    assert_eq!(synced(json!({"nodes": {"127.0.0.1:80": 1}})), Ok(()));
    let route = route_from_value(
        "r",
        json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 1}}}),
        &AcceptAnyPlugin,
    )
    .unwrap();
    // The route schema wrote the upstream's defaults.
    let up = route.upstream.unwrap();
    assert_eq!((up.scheme, up.pass_host), (Scheme::Http, PassHost::Pass));
}
