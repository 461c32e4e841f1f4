//! Message-level tests: every text here was checked against APISIX's test suite, the Admin API
//! reference (§6.6/§6.7) or the api7 library's code.

use super::*;
use serde_json::json;

fn err(schema: &Value, value: Value) -> String {
    validate(schema, &value).unwrap_err()
}

fn ok(schema: &Value, value: Value) {
    if let Err(e) = validate(schema, &value) {
        panic!("expected {value} to pass, got: {e}");
    }
}

fn route_err(value: Value) -> String {
    err(resource_schema(ResourceKind::Routes), value)
}

fn upstream_err(value: Value) -> String {
    err(resource_schema(ResourceKind::Upstreams), value)
}

// ---- engine: one keyword at a time ----

#[test]
fn type_names_are_lua_names() {
    let s = |t: &str| json!({"type": t});
    assert_eq!(
        err(&s("string"), json!(123)),
        "wrong type: expected string, got number"
    );
    assert_eq!(
        err(&s("string"), json!(1.5)),
        "wrong type: expected string, got number"
    );
    assert_eq!(
        err(&s("object"), json!("x")),
        "wrong type: expected object, got string"
    );
    assert_eq!(
        err(&s("array"), json!("GET")),
        "wrong type: expected array, got string"
    );
    assert_eq!(
        err(&s("array"), json!({"a": 1})),
        "wrong type: expected array, got table"
    );
    assert_eq!(
        err(&s("object"), json!([1])),
        "wrong type: expected object, got table"
    );
    assert_eq!(
        err(&s("boolean"), json!("yes")),
        "wrong type: expected boolean, got string"
    );
    assert_eq!(
        err(&s("boolean"), json!(null)),
        "wrong type: expected boolean, got userdata"
    );
    assert_eq!(
        err(&s("number"), json!(true)),
        "wrong type: expected number, got boolean"
    );
    // An integer-typed field reports the Lua type of what it got.
    assert_eq!(
        err(&s("integer"), json!(1.5)),
        "wrong type: expected integer, got number"
    );
    assert_eq!(
        err(&s("integer"), json!("1")),
        "wrong type: expected integer, got string"
    );
    ok(&s("integer"), json!(2.0));
    ok(&s("integer"), json!(-3));
    assert_eq!(
        err(&json!({"type": ["string", "integer"]}), json!(true)),
        "wrong type: expected one of string, integer, got boolean"
    );
}

#[test]
fn empty_object_and_empty_array_are_one_table() {
    ok(&json!({"type": "object"}), json!([]));
    ok(&json!({"type": "array"}), json!({}));
    assert_eq!(
        err(&json!({"type": "array", "minItems": 1}), json!({})),
        "expect array to have at least 1 items"
    );
}

#[test]
fn enum_and_items() {
    let s = json!({"type": "array", "items": {"type": "string", "enum": ["GET", "POST"]}, "uniqueItems": true});
    assert_eq!(
        err(&s, json!(["GET", "PUT"])),
        "failed to validate item 2: matches none of the enum values"
    );
    assert_eq!(
        err(&s, json!(["GET", "GET"])),
        "expected unique items but items 1 and 2 are equal"
    );
    assert_eq!(
        err(&json!({"enum": [1, 0]}), json!("1")),
        "matches none of the enum values"
    );
    ok(&json!({"enum": [1, 0]}), json!(1.0));
    ok(&json!({"enum": [{"a": [1]}]}), json!({"a": [1]}));
}

#[test]
fn unique_items_order() {
    let s = json!({"uniqueItems": true});
    assert_eq!(
        err(&s, json!([1, 2, 3, 2])),
        "expected unique items but items 2 and 4 are equal"
    );
    // Scalars are found while scanning, tables afterwards.
    assert_eq!(
        err(&s, json!([{"a": 1}, {"a": 1}, 5, 5])),
        "expected unique items but items 3 and 4 are equal"
    );
    assert_eq!(
        err(&s, json!([{"a": 1}, 7, {"a": 1}])),
        "expected unique items but items 1 and 3 are equal"
    );
    assert_eq!(
        err(&s, json!([1, 1.0])),
        "expected unique items but items 1 and 2 are equal"
    );
    ok(&s, json!([1, "1", true, null]));
}

#[test]
fn array_sizes() {
    let s = json!({"type": "array", "minItems": 1, "maxItems": 2});
    assert_eq!(err(&s, json!([])), "expect array to have at least 1 items");
    assert_eq!(
        err(&s, json!([1, 2, 3])),
        "expect array to have at most 2 items"
    );
}

#[test]
fn string_lengths_count_characters() {
    let s = json!({"type": "string", "minLength": 1, "maxLength": 3});
    assert_eq!(
        err(&s, json!("")),
        "string too short, expected at least 1, got 0"
    );
    assert_eq!(
        err(&s, json!("abcd")),
        "string too long, expected at most 3, got 4"
    );
    ok(&s, json!("ééé"));
}

#[test]
fn pattern_message_quotes_like_lua() {
    let s = json!({"type": "string", "pattern": r"^\S+$"});
    assert_eq!(
        err(&s, json!("a b")),
        r#"failed to match pattern "^\\S+$" with "a b""#
    );
    assert_eq!(
        err(&s, json!("a\"b c")),
        r#"failed to match pattern "^\\S+$" with "a\"b c""#
    );
    // The search is unanchored, like ngx.re.find.
    ok(&json!({"pattern": "b"}), json!("abc"));
    // Non-strings are not checked against a pattern.
    ok(&json!({"pattern": "^a$"}), json!(5));
}

#[test]
fn number_bounds() {
    assert_eq!(
        err(&json!({"minimum": 0}), json!(-1)),
        "expected -1 to be at least 0"
    );
    assert_eq!(
        err(&json!({"exclusiveMinimum": 0}), json!(0)),
        "expected 0 to be greater than 0"
    );
    assert_eq!(
        err(&json!({"maximum": 599}), json!(600)),
        "expected 600 to be at most 599"
    );
    assert_eq!(
        err(&json!({"exclusiveMaximum": 10}), json!(10.5)),
        "expected 10.5 to be smaller than 10"
    );
    assert_eq!(
        err(&json!({"minimum": 0.5}), json!(0.25)),
        "expected 0.25 to be at least 0.5"
    );
    assert_eq!(
        err(&json!({"multipleOf": 2}), json!(3)),
        "expected 3 to be a multiple of 2"
    );
    ok(&json!({"multipleOf": 0.01}), json!(1.13));
    assert_eq!(
        err(&json!({"multipleOf": 0.01}), json!(1.131)),
        "expected 1.131 to be a multiple of 0.01"
    );
}

#[test]
fn object_keywords() {
    let s = json!({
        "type": "object",
        "properties": {"username": {"type": "string"}, "age": {"type": "integer"}, "other": {}},
        "required": ["username", "other"],
        "additionalProperties": false
    });
    assert_eq!(err(&s, json!({})), "property \"username\" is required");
    assert_eq!(
        err(&s, json!({"username": "a"})),
        "property \"other\" is required"
    );
    assert_eq!(
        err(&json!({"required": ["x"]}), json!({"y": 1})),
        "property \"x\" is required"
    );
    assert_eq!(
        err(&s, json!({"username": 1, "other": 1})),
        "property \"username\" validation failed: wrong type: expected string, got number"
    );
    assert_eq!(
        err(&s, json!({"username": "a", "other": 1, "foo": 1})),
        "additional properties forbidden, found foo"
    );
    assert_eq!(
        err(&json!({"minProperties": 2}), json!({"a": 1})),
        "expect object to have at least 2 properties"
    );
    assert_eq!(
        err(
            &json!({"type": "object", "maxProperties": 1}),
            json!({"a": 1, "b": 2})
        ),
        "expect object to have at most 1 properties"
    );
    assert_eq!(
        err(&json!({"required": []}), json!({"a": 1})),
        "the input data should be an empty table"
    );
    ok(&json!({"required": []}), json!({}));
    // `required` only applies to objects.
    ok(&json!({"required": ["a"]}), json!("x"));
    ok(&json!({"required": ["a"]}), json!([1]));
}

#[test]
fn additional_property_schema_and_patterns() {
    let s = json!({
        "type": "object",
        "properties": {"a": {}},
        "patternProperties": {"^x_": {"type": "integer"}},
        "additionalProperties": {"type": "string"}
    });
    ok(&s, json!({"a": 1, "x_1": 2, "other": "s"}));
    assert_eq!(
        err(&s, json!({"x_1": "no"})),
        "failed to validate x_1 (matching \"^x_\"): wrong type: expected integer, got string"
    );
    assert_eq!(
        err(&s, json!({"other": 1})),
        "failed to validate additional property other: wrong type: expected string, got number"
    );
}

#[test]
fn dependencies() {
    let s = json!({
        "type": "object",
        "properties": {"a": {}, "b": {}},
        "dependencies": {"a": ["b"], "c": {"required": ["d"]}}
    });
    assert_eq!(
        err(&s, json!({"a": 1})),
        "property \"b\" is required when \"a\" is set"
    );
    assert_eq!(
        err(&s, json!({"c": 1})),
        "failed to validate dependent schema for \"c\": property \"d\" is required"
    );
    ok(&s, json!({"a": 1, "b": 2, "c": 1, "d": 1}));
}

#[test]
fn combinators() {
    let any_plain = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
    assert_eq!(
        err(&any_plain, json!(true)),
        "object matches none of the required"
    );
    let any_required =
        json!({"anyOf": [{"required": ["active"]}, {"required": ["active", "passive"]}]});
    assert_eq!(
        err(&any_required, json!({"passive": {}})),
        r#"object matches none of the required: ["active"] or ["active","passive"]"#
    );
    let one = json!({"oneOf": [{"type": "integer"}, {"type": "number"}, {"type": "string"}]});
    assert_eq!(
        err(&one, json!(true)),
        "value should match only one schema, but matches none"
    );
    assert_eq!(
        err(&one, json!(1)),
        "value should match only one schema, but matches both schemas 1 and 2"
    );
    ok(&one, json!(1.5));
    let all = json!({"allOf": [{"type": "integer"}, {"minimum": 3}]});
    assert_eq!(
        err(&all, json!(2)),
        "allOf 2 failed: expected 2 to be at least 3"
    );
    assert_eq!(
        err(&json!({"not": {"type": "string"}}), json!("x")),
        "value wasn't supposed to match schema"
    );
    let cond = json!({"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"minimum": 5}});
    assert_eq!(err(&cond, json!("a")), "then clause did not match");
    assert_eq!(err(&cond, json!(1)), "else clause did not match");
    ok(&cond, json!(6));
    assert_eq!(
        err(&json!({"const": [1]}), json!([2])),
        "failed to check const value"
    );
    assert_eq!(err(&json!(false), json!(1)), "expect false always");
}

#[test]
fn formats_and_refs() {
    assert_eq!(
        err(
            &json!({"type": "string", "format": "ipv4"}),
            json!("127.0.0.33333")
        ),
        "expect valid ipv4 format but got: 127.0.0.33333"
    );
    ok(&json!({"format": "ipv6"}), json!("::1"));
    let s = json!({
        "definitions": {"port": {"type": "integer", "maximum": 65535}},
        "properties": {"p": {"$ref": "#/definitions/port"}}
    });
    assert_eq!(
        err(&s, json!({"p": 70000})),
        "property \"p\" validation failed: expected 70000 to be at most 65535"
    );
}

#[test]
fn defaults_are_filled_like_the_lua_validator() {
    let s = json!({
        "type": "object",
        "properties": {
            "a": {"type": "integer", "default": 3},
            "b": {"type": "object", "properties": {"c": {"default": [1, 2]}}}
        }
    });
    let mut v = json!({"b": {}});
    validate_and_fill(&s, &mut v).unwrap();
    assert_eq!(v, json!({"b": {"c": [1, 2]}, "a": 3}));
    // An empty array is the same empty table and takes defaults too.
    let mut v = json!({"b": []});
    validate_and_fill(&s, &mut v).unwrap();
    assert_eq!(v["b"], json!({"c": [1, 2]}));
    // `validate` leaves its input alone.
    let v = json!({});
    validate(&s, &v).unwrap();
    assert_eq!(v, json!({}));
}

#[test]
fn secret_references_skip_string_fields() {
    let s = json!({"type": "object", "properties": {
        "password": {"type": "string", "minLength": 100},
        "count": {"type": "integer"}
    }});
    ok(&s, json!({"password": "$secret://vault/1/pw"}));
    ok(&s, json!({"password": "$ENV://PW"}));
    assert_eq!(
        err(&s, json!({"count": "$secret://vault/1/n"})),
        "property \"count\" validation failed: wrong type: expected integer, got string"
    );
}

// ---- resource schemas: Admin API reference §6.6/§6.7 and APISIX's tests ----

#[test]
fn route_needs_exactly_one_of_uri_and_uris() {
    let up = json!({"type": "roundrobin", "nodes": {"127.0.0.1:8080": 1}});
    assert_eq!(
        route_err(json!({"methods": ["GET"], "upstream": up})),
        "allOf 1 failed: value should match only one schema, but matches none"
    );
    assert_eq!(
        route_err(json!({"uri": "/a", "uris": ["/b"], "upstream": up})),
        "allOf 1 failed: value should match only one schema, but matches both schemas 1 and 2"
    );
}

#[test]
fn route_needs_something_to_do() {
    assert_eq!(
        route_err(json!({"uri": "/a"})),
        r#"object matches none of the required: ["plugins","uri"] or ["upstream","uri"] or ["upstream_id","uri"] or ["service_id","uri"] or ["plugins","uris"] or ["upstream","uris"] or ["upstream_id","uris"] or ["service_id","uris"] or ["script","uri"] or ["script","uris"]"#
    );
}

#[test]
fn route_field_errors() {
    let base = |extra: Value| {
        let mut v = json!({"uri": "/a", "upstream_id": "1"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    assert_eq!(
        route_err(json!({"uri": 123, "upstream_id": 1})),
        "property \"uri\" validation failed: wrong type: expected string, got number"
    );
    assert_eq!(
        route_err(base(json!({"methods": ["invalid_method"]}))),
        "property \"methods\" validation failed: failed to validate item 1: matches none of the enum values"
    );
    assert_eq!(
        route_err(base(json!({"methods": "GET"}))),
        "property \"methods\" validation failed: wrong type: expected array, got string"
    );
    assert_eq!(
        route_err(base(json!({"remote_addr": "127.0.0.33333"}))),
        "property \"remote_addr\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_err(base(json!({"foo": 1}))),
        "additional properties forbidden, found foo"
    );
    assert_eq!(
        route_err(base(json!({"plugins": "limit-count"}))),
        "property \"plugins\" validation failed: wrong type: expected object, got string"
    );
    assert_eq!(
        route_err(base(json!({"host": "a b"}))),
        r#"property "host" validation failed: failed to match pattern "^\\*$|^\\*?[0-9a-zA-Z-._\\[\\]:]+$" with "a b""#
    );
    assert_eq!(
        route_err(base(json!({"hosts": ["a.com", "a.com"]}))),
        "property \"hosts\" validation failed: expected unique items but items 1 and 2 are equal"
    );
    assert_eq!(
        route_err(base(json!({"timeout": {"connect": 0, "send": 1, "read": 1}}))),
        "property \"timeout\" validation failed: property \"connect\" validation failed: expected 0 to be greater than 0"
    );
    assert_eq!(
        route_err(base(json!({"timeout": {"connect": 1, "send": 1}}))),
        "property \"timeout\" validation failed: property \"read\" is required"
    );
    assert_eq!(
        route_err(base(json!({"status": 2}))),
        "property \"status\" validation failed: matches none of the enum values"
    );
    assert_eq!(
        route_err(base(json!({"priority": 1.5}))),
        "property \"priority\" validation failed: wrong type: expected integer, got number"
    );
    assert_eq!(
        route_err(base(json!({"labels": {"env": ["a"]}}))),
        "property \"labels\" validation failed: failed to validate env (matching \".*\"): wrong type: expected string, got table"
    );
    assert_eq!(
        route_err(base(json!({"labels": "x"}))),
        "property \"labels\" validation failed: wrong type: expected object, got string"
    );
    assert_eq!(
        route_err(base(json!({"id": "a b"}))),
        "property \"id\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_err(json!({"uri": "/a", "upstream_id": 0})),
        "property \"upstream_id\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_err(base(json!({"service_id": "x".repeat(65)}))),
        "property \"service_id\" validation failed: object matches none of the required"
    );
    assert_eq!(
        route_err(json!({"uri": "/a", "script": "local _M = {} return _M", "plugins": {}})),
        "value wasn't supposed to match schema"
    );
    assert_eq!(
        route_err(base(json!({"filter_func": "func(vars) end"}))),
        r#"property "filter_func" validation failed: failed to match pattern "^function" with "func(vars) end""#
    );
}

#[test]
fn route_accepts_reference_examples() {
    let schema = resource_schema(ResourceKind::Routes);
    ok(
        schema,
        json!({"uri": "/hello", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}),
    );
    ok(
        schema,
        json!({"uris": ["/a", "/b"], "hosts": ["*.foo.com", "foo.com:8080"], "methods": ["GET", "PURGE"], "service_id": 1}),
    );
    ok(
        schema,
        json!({"uri": "/a", "remote_addrs": ["10.0.0.0/8", "::1", "fe80::/10", "127.0.0.1"], "plugins": {}}),
    );
    ok(
        schema,
        json!({"uri": "/a", "host": "*", "upstream_id": "u-1.x", "status": 0, "priority": -3, "vars": [["arg_a", "==", "1"]]}),
    );
    ok(
        schema,
        json!({"id": 1, "uri": "/a", "plugins": {}, "create_time": 1700000000, "update_time": 1700000000}),
    );
}

#[test]
fn upstream_node_errors_use_the_bare_anyof_message() {
    let nodes_msg = "property \"nodes\" validation failed: object matches none of the required";
    assert_eq!(
        upstream_err(json!({"nodes": {"127.0.0.1:8080": "1"}, "type": "roundrobin"})),
        nodes_msg
    );
    assert_eq!(
        upstream_err(json!({"nodes": {"127.0.0.1:8080": -100}})),
        nodes_msg
    );
    assert_eq!(
        upstream_err(json!({"nodes": [{"host": "127.0.0.1", "port": 0, "weight": 1}]})),
        nodes_msg
    );
    assert_eq!(
        upstream_err(json!({"nodes": [{"host": "a b", "port": 80, "weight": 1}]})),
        nodes_msg
    );
    assert_eq!(
        upstream_err(json!({"nodes": [{"host": "127.0.0.1", "port": 80}]})),
        nodes_msg
    );
    assert_eq!(
        route_err(
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:8080": -100}, "type": "roundrobin"}})
        ),
        format!("property \"upstream\" validation failed: {nodes_msg}")
    );
}

#[test]
fn upstream_field_errors() {
    assert_eq!(
        upstream_err(json!({"type": "roundrobin"})),
        "value should match only one schema, but matches none"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "retries": -1})),
        "property \"retries\" validation failed: expected -1 to be at least 0"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "retry_timeout": -1})),
        "property \"retry_timeout\" validation failed: expected -1 to be at least 0"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "hash_on": "bad"})),
        "property \"hash_on\" validation failed: matches none of the enum values"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "scheme": "ftp"})),
        "property \"scheme\" validation failed: matches none of the enum values"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "foo": 1})),
        "additional properties forbidden, found foo"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"passive": {}}})),
        r#"property "checks" validation failed: object matches none of the required: ["active"] or ["active","passive"]"#
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"active": {"healthy": {"successes": 255}}}})),
        "property \"checks\" validation failed: property \"active\" validation failed: property \"healthy\" validation failed: property \"successes\" validation failed: expected 255 to be at most 254"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"active": {"healthy": {"http_statuses": [200, 200]}}}})),
        "property \"checks\" validation failed: property \"active\" validation failed: property \"healthy\" validation failed: property \"http_statuses\" validation failed: expected unique items but items 1 and 2 are equal"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"active": {"req_headers": ["a", 1]}}})),
        "property \"checks\" validation failed: property \"active\" validation failed: property \"req_headers\" validation failed: failed to validate item 2: wrong type: expected string, got number"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"active": {"unhealthy": {"http_failures": 1.5}}}})),
        "property \"checks\" validation failed: property \"active\" validation failed: property \"unhealthy\" validation failed: property \"http_failures\" validation failed: wrong type: expected integer, got number"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "checks": {"active": {}, "passive": {"unhealthy": {"http_statuses": [500, 600]}}}})),
        "property \"checks\" validation failed: property \"passive\" validation failed: property \"unhealthy\" validation failed: property \"http_statuses\" validation failed: failed to validate item 2: expected 600 to be at most 599"
    );
    let cert = "c".repeat(128);
    let key = "k".repeat(64);
    assert_eq!(
        upstream_err(json!({"nodes": {}, "tls": {"client_cert_id": 1, "client_cert": cert, "client_key": key}})),
        "property \"tls\" validation failed: failed to validate dependent schema for \"client_cert_id\": value wasn't supposed to match schema"
    );
    assert_eq!(
        upstream_err(json!({"nodes": {}, "tls": {"client_cert": cert}})),
        "property \"tls\" validation failed: failed to validate dependent schema for \"client_cert\": property \"client_key\" is required"
    );
}

#[test]
fn upstream_accepts_reference_examples() {
    let schema = resource_schema(ResourceKind::Upstreams);
    ok(schema, json!({"nodes": {}}));
    ok(schema, json!({"nodes": []}));
    ok(schema, json!({"nodes": {"[::1]:80": 1, "a.com": 0}}));
    ok(
        schema,
        json!({"service_name": "svc", "discovery_type": "dns"}),
    );
    ok(
        schema,
        json!({"nodes": [{"host": "127.0.0.1", "port": 80, "weight": 1, "priority": -1, "metadata": {}}], "type": "chash", "key": "remote_addr"}),
    );
    let mut v = json!({"nodes": {"127.0.0.1:80": 1}, "keepalive_pool": {}});
    validate_and_fill(schema, &mut v).unwrap();
    assert_eq!(v["type"], "roundrobin");
    assert_eq!(v["pass_host"], "pass");
    assert_eq!(v["scheme"], "http");
    assert_eq!(v["hash_on"], "vars");
    assert_eq!(
        v["keepalive_pool"],
        json!({"size": 320, "idle_timeout": 60, "requests": 1000})
    );
}

#[test]
fn other_resource_schemas() {
    assert_eq!(
        err(
            resource_schema(ResourceKind::Services),
            json!({"name": "x".repeat(257)})
        ),
        "property \"name\" validation failed: string too long, expected at most 256, got 257"
    );
    ok(resource_schema(ResourceKind::Services), json!({}));
    assert_eq!(
        err(
            resource_schema(ResourceKind::Consumers),
            json!({"plugins": {}})
        ),
        "property \"username\" is required"
    );
    assert_eq!(
        err(
            resource_schema(ResourceKind::Consumers),
            json!({"username": "a b"})
        ),
        r#"property "username" validation failed: failed to match pattern "^[a-zA-Z0-9_\\-]+$" with "a b""#
    );
    assert_eq!(
        err(
            resource_schema(ResourceKind::GlobalRules),
            json!({"id": "1"})
        ),
        "property \"plugins\" is required"
    );
    assert_eq!(
        err(
            resource_schema(ResourceKind::PluginConfigs),
            json!({"plugins": {}})
        ),
        "property \"id\" is required"
    );
    assert_eq!(
        err(
            schema_by_name("credential").unwrap(),
            json!({"plugins": {"a": {}, "b": {}}})
        ),
        "property \"plugins\" validation failed: expect object to have at most 1 properties"
    );
}

#[test]
fn ssl_schema() {
    let ssl = resource_schema(ResourceKind::Ssls);
    let cert = "c".repeat(128);
    let key = "k".repeat(64);
    ok(ssl, json!({"cert": cert, "key": key, "sni": "*.a.com"}));
    ok(ssl, json!({"type": "client", "cert": cert, "key": key}));
    assert_eq!(
        err(ssl, json!({"cert": cert, "key": key})),
        "then clause did not match"
    );
    assert_eq!(
        err(ssl, json!({"type": "client", "cert": cert})),
        "else clause did not match"
    );
    assert_eq!(
        err(ssl, json!({"cert": cert, "key": key, "snis": []})),
        "property \"snis\" validation failed: expect array to have at least 1 items"
    );
    assert_eq!(
        err(ssl, json!({"cert": cert, "key": key, "sni": "a", "certs": ["short"]})),
        "property \"certs\" validation failed: failed to validate item 1: string too short, expected at least 128, got 5"
    );
    assert_eq!(
        err(ssl, json!({"cert": cert, "key": key, "sni": "a", "ssl_protocols": ["TLSv1.0"]})),
        "property \"ssl_protocols\" validation failed: failed to validate item 1: matches none of the enum values"
    );
}

#[test]
fn schemas_by_name() {
    for name in [
        "route",
        "service",
        "upstream",
        "consumer",
        "ssl",
        "global_rule",
        "plugin_config",
        "plugins",
        "stream_route",
    ] {
        assert!(schema_by_name(name).is_some(), "{name}");
    }
    assert!(schema_by_name("nope").is_none());
    for kind in ResourceKind::ALL {
        assert_eq!(resource_schema(kind)["type"], "object");
    }
    assert_eq!(chash_key_schema("consumer"), Ok(None));
    assert_eq!(
        chash_key_schema("x"),
        Err("invalid hash_on type x".to_string())
    );
}

#[test]
fn plugin_meta_schema_refuses_unknown_keys() {
    assert_eq!(
        err(plugin_meta_schema(), json!({"disabled": true})),
        "additional properties forbidden, found disabled"
    );
    ok(
        plugin_meta_schema(),
        json!({"disable": true, "priority": 1, "filter": [], "error_response": {"a": 1}}),
    );
}
