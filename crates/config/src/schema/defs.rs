//! The core resource schemas (route, upstream, service, ...), written from the Admin API
//! reference. Their shape decides the error texts: which keyword fails first and how the
//! failing path nests (`property "upstream" validation failed: property "nodes" ...`), so the
//! combinators (`anyOf` for ids and nodes, `oneOf` for uri/uris, `allOf` around them) follow
//! APISIX's layout even where a simpler schema would accept the same documents.

use serde_json::{json, Value};

/// Pattern for `host`, `hosts[]`, `upstream_host`, `sni`: `*` alone, or an optional leading `*`
/// followed by host characters (IPv6 brackets and a port allowed).
pub const HOST_PATTERN: &str = r"^\*$|^\*?[0-9a-zA-Z-._\[\]:]+$";

/// Methods a route may list.
pub const METHODS: [&str; 10] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "PURGE",
];

pub fn id() -> Value {
    // A string id or a positive integer; anything else reports the bare anyOf message.
    json!({"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[a-zA-Z0-9-_.]+$"},
        {"type": "integer", "minimum": 1}
    ]})
}

pub fn host() -> Value {
    json!({"type": "string", "pattern": HOST_PATTERN})
}

fn ipv4_cidr_pattern() -> String {
    let seg = "([0-9]|[1-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])";
    format!(r"^{seg}\.{seg}\.{seg}\.{seg}/([12]?[0-9]|3[0-2])$")
}

/// Loose on purpose (APISIX's own is loose too): the address part is checked by the format
/// alternatives, the CIDR form only by shape.
const IPV6_CIDR_PATTERN: &str =
    "^([a-fA-F0-9]{0,4}:){1,8}(:[a-fA-F0-9]{0,4}){0,8}([a-fA-F0-9]{0,4})?/[0-9]{1,3}$";

/// The four accepted spellings of a client address.
pub fn ip_alternatives() -> Value {
    json!([
        {"title": "IPv4", "type": "string", "format": "ipv4"},
        {"title": "IPv4/CIDR", "type": "string", "pattern": ipv4_cidr_pattern()},
        {"title": "IPv6", "type": "string", "format": "ipv6"},
        {"title": "IPv6/CIDR", "type": "string", "pattern": IPV6_CIDR_PATTERN}
    ])
}

fn remote_addr() -> Value {
    json!({"description": "client IP", "type": "string", "anyOf": ip_alternatives()})
}

pub fn label_value() -> Value {
    json!({"description": "value of label", "type": "string", "pattern": r"^\S+$", "maxLength": 256, "minLength": 1})
}

pub fn labels() -> Value {
    json!({
        "description": "key/value pairs to specify attributes",
        "type": "object",
        "patternProperties": {".*": label_value()}
    })
}

fn name() -> Value {
    json!({"type": "string", "maxLength": 256, "minLength": 1})
}

fn desc() -> Value {
    json!({"type": "string", "maxLength": 256})
}

fn timestamp() -> Value {
    json!({"type": "integer"})
}

/// The properties most resources open with (id, name, desc, labels, the two timestamps),
/// followed by the resource's `own`. The order shows in the schema the Admin API serves.
fn named_properties(own: Value) -> Value {
    let mut properties = json!({
        "id": id(),
        "name": name(),
        "desc": desc(),
        "labels": labels(),
        "create_time": timestamp(),
        "update_time": timestamp()
    });
    let (Value::Object(all), Value::Object(own)) = (&mut properties, own) else {
        unreachable!("both are JSON objects")
    };
    all.extend(own);
    properties
}

pub fn timeout() -> Value {
    let positive = json!({"type": "number", "exclusiveMinimum": 0});
    json!({
        "type": "object",
        "properties": {"connect": positive, "send": positive, "read": positive},
        "required": ["connect", "send", "read"]
    })
}

pub fn method() -> Value {
    json!({"description": "HTTP method", "type": "string", "enum": METHODS})
}

fn status_list(min_items_default: &[u16]) -> Value {
    json!({
        "type": "array",
        "minItems": 1,
        "items": {"type": "integer", "minimum": 200, "maximum": 599},
        "uniqueItems": true,
        "default": min_items_default
    })
}

fn counter(min: u32, default: u32) -> Value {
    json!({"type": "integer", "minimum": min, "maximum": 254, "default": default})
}

pub fn health_checker_active() -> Value {
    json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["http", "https", "tcp"], "default": "http"},
            "timeout": {"type": "number", "default": 1},
            "concurrency": {"type": "integer", "default": 10},
            "host": host(),
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "http_method": {"type": "string", "enum": METHODS, "default": "GET"},
            "http_path": {"type": "string", "default": "/"},
            "http_req_body": {"type": "string", "default": ""},
            "https_verify_certificate": {"type": "boolean", "default": true},
            "healthy": {
                "type": "object",
                "properties": {
                    "interval": {"type": "integer", "minimum": 1, "default": 1},
                    "http_statuses": status_list(&[200, 302]),
                    "successes": counter(1, 2)
                }
            },
            "unhealthy": {
                "type": "object",
                "properties": {
                    "interval": {"type": "integer", "minimum": 1, "default": 1},
                    "http_statuses": status_list(&[429, 404, 500, 501, 502, 503, 504, 505]),
                    "http_failures": counter(1, 5),
                    "tcp_failures": counter(1, 2),
                    "timeouts": counter(1, 3)
                }
            },
            "req_headers": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "uniqueItems": true}
            }
        }
    })
}

pub fn health_checker_passive() -> Value {
    json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["http", "https", "tcp"], "default": "http"},
            "healthy": {
                "type": "object",
                "properties": {
                    "http_statuses": status_list(&[
                        200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 306, 307, 308
                    ]),
                    "successes": counter(0, 5)
                }
            },
            "unhealthy": {
                "type": "object",
                "properties": {
                    "http_statuses": status_list(&[429, 500, 503]),
                    "tcp_failures": counter(0, 2),
                    "timeouts": counter(0, 7),
                    "http_failures": counter(0, 5)
                }
            }
        }
    })
}

pub fn health_checker() -> Value {
    json!({
        "type": "object",
        "properties": {"active": health_checker_active(), "passive": health_checker_passive()},
        "anyOf": [{"required": ["active"]}, {"required": ["active", "passive"]}]
    })
}

/// `"host:port": weight` map or a list of node objects. A bad node in either form reports the
/// bare anyOf message, never the inner failure.
pub fn nodes() -> Value {
    json!({"anyOf": [
        {
            "type": "object",
            "patternProperties": {
                ".*": {"description": "weight of node", "type": "integer", "minimum": 0}
            }
        },
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "host": host(),
                    "port": {"description": "port of node", "type": "integer", "minimum": 1, "maximum": 65535},
                    "weight": {"description": "weight of node", "type": "integer", "minimum": 0},
                    "priority": {"description": "priority of node", "type": "integer", "default": 0},
                    "metadata": {"description": "metadata of node", "type": "object"}
                },
                "required": ["host", "weight"]
            }
        }
    ]})
}

fn certificate() -> Value {
    json!({"type": "string", "minLength": 128, "maxLength": 65536})
}

fn private_key() -> Value {
    json!({"type": "string", "minLength": 64, "maxLength": 65536})
}

pub fn upstream() -> Value {
    json!({
        "type": "object",
        "properties": named_properties(json!({
            "nodes": nodes(),
            "retries": {"type": "integer", "minimum": 0},
            "retry_timeout": {"type": "number", "minimum": 0},
            "timeout": timeout(),
            "tls": {
                "type": "object",
                "properties": {
                    "client_cert_id": id(),
                    "client_cert": certificate(),
                    "client_key": private_key(),
                    "verify": {
                        "type": "boolean",
                        "description": "verify the server certificate (kafka upstreams only)",
                        "default": false
                    }
                },
                "dependencies": {
                    "client_cert": {"required": ["client_key"]},
                    "client_key": {"required": ["client_cert"]},
                    "client_cert_id": {"not": {"required": ["client_cert", "client_key"]}}
                }
            },
            "keepalive_pool": {
                "type": "object",
                "properties": {
                    "size": {"type": "integer", "default": 320, "minimum": 1},
                    "idle_timeout": {"type": "number", "default": 60, "minimum": 0},
                    "requests": {"type": "integer", "default": 1000, "minimum": 1}
                }
            },
            // No enum at write time: unknown balancers are reported when the snapshot compiles.
            "type": {"description": "algorithms of load balancing", "type": "string", "default": "roundrobin"},
            "checks": health_checker(),
            "hash_on": {
                "type": "string",
                "default": "vars",
                "enum": ["vars", "header", "cookie", "consumer", "vars_combinations"]
            },
            "key": {"description": "the key of chash for dynamic load balancing", "type": "string"},
            "scheme": {
                "default": "http",
                "enum": ["grpc", "grpcs", "http", "https", "tcp", "tls", "udp", "kafka"],
                "description": "upstream scheme: L7 grpc/grpcs/http/https, L4 tcp/tls/udp, or kafka"
            },
            "discovery_type": {"description": "discovery type", "type": "string"},
            "discovery_args": {
                "type": "object",
                "properties": {
                    "namespace_id": {"description": "namespace id", "type": "string"},
                    "group_name": {"description": "group name", "type": "string"}
                }
            },
            "pass_host": {
                "description": "how the Host header is passed",
                "type": "string",
                "enum": ["pass", "node", "rewrite"],
                "default": "pass"
            },
            "upstream_host": host(),
            "service_name": {"type": "string", "maxLength": 256, "minLength": 1}
        })),
        "oneOf": [
            {"required": ["nodes"]},
            {"required": ["service_name", "discovery_type"]}
        ],
        "additionalProperties": false
    })
}

/// `key` of a `chash` upstream hashing on `vars`: one of a few nginx variables or `arg_*`.
pub fn upstream_hash_vars() -> Value {
    json!({
        "type": "string",
        "pattern": "^((uri|server_name|server_addr|request_uri|remote_port|remote_addr|query_string|host|hostname|mqtt_client_id)|arg_[0-9a-zA-z_-]+)$"
    })
}

/// `key` of a `chash` upstream hashing on a header or cookie name.
pub fn upstream_hash_header() -> Value {
    json!({"type": "string", "pattern": "^[a-zA-Z0-9-_]+$"})
}

pub fn upstream_hash_vars_combinations() -> Value {
    json!({"type": "string"})
}

fn plugins() -> Value {
    json!({"type": "object"})
}

fn script() -> Value {
    json!({"type": "string", "minLength": 10, "maxLength": 102400})
}

fn unique_list(items: Value) -> Value {
    json!({"type": "array", "items": items, "minItems": 1, "uniqueItems": true})
}

/// Both-or-neither of two exclusive fields, written so that having both reports
/// `matches both schemas 2 and 3` (APISIX checks that case earlier with its own message).
fn at_most_one_of(a: &str, b: &str) -> Value {
    json!({"oneOf": [
        {"not": {"anyOf": [{"required": [a]}, {"required": [b]}]}},
        {"required": [a]},
        {"required": [b]}
    ]})
}

pub fn route() -> Value {
    // What a route needs besides its path: something to run or somewhere to send to. The order
    // of these pairs is part of the error text.
    let mut needs = Vec::new();
    for path in ["uri", "uris"] {
        for what in ["plugins", "upstream", "upstream_id", "service_id"] {
            needs.push(json!({"required": [what, path]}));
        }
    }
    needs.push(json!({"required": ["script", "uri"]}));
    needs.push(json!({"required": ["script", "uris"]}));

    json!({
        "type": "object",
        "properties": named_properties(json!({
            "uri": {"type": "string", "minLength": 1, "maxLength": 4096},
            "uris": unique_list(json!({"description": "HTTP uri", "type": "string"})),
            "priority": {"type": "integer", "default": 0},
            "methods": {"type": "array", "items": method(), "uniqueItems": true},
            "host": host(),
            "hosts": unique_list(host()),
            "remote_addr": remote_addr(),
            "remote_addrs": unique_list(remote_addr()),
            "timeout": timeout(),
            "vars": {"type": "array"},
            "filter_func": {"type": "string", "minLength": 10, "pattern": "^function"},
            "script": script(),
            "script_id": id(),
            "plugins": plugins(),
            "plugin_config_id": id(),
            "upstream": upstream(),
            "service_id": id(),
            "upstream_id": id(),
            "enable_websocket": {"description": "enable websocket for request", "type": "boolean"},
            "status": {
                "description": "route status, 1 to enable, 0 to disable",
                "type": "integer",
                "enum": [1, 0],
                "default": 1
            }
        })),
        "allOf": [
            {"oneOf": [{"required": ["uri"]}, {"required": ["uris"]}]},
            at_most_one_of("host", "hosts"),
            at_most_one_of("remote_addr", "remote_addrs")
        ],
        "anyOf": needs,
        "not": {"anyOf": [
            {"required": ["script", "plugins"]},
            {"required": ["script", "plugin_config_id"]}
        ]},
        "additionalProperties": false
    })
}

pub fn service() -> Value {
    json!({
        "type": "object",
        "properties": named_properties(json!({
            "plugins": plugins(),
            "upstream": upstream(),
            "upstream_id": id(),
            "script": script(),
            "enable_websocket": {"description": "enable websocket for request", "type": "boolean"},
            "hosts": unique_list(host())
        })),
        "additionalProperties": false
    })
}

pub fn consumer() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": id(),
            "username": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": r"^[a-zA-Z0-9_\-]+$"},
            "desc": desc(),
            "labels": labels(),
            "create_time": timestamp(),
            "update_time": timestamp(),
            "group_id": id(),
            "plugins": plugins()
        },
        "required": ["username"],
        "additionalProperties": false
    })
}

pub fn credential() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"oneOf": [
                id(),
                {
                    "type": "string",
                    "minLength": 15,
                    "maxLength": 128,
                    "pattern": "^[a-zA-Z0-9-_]+/credentials/[a-zA-Z0-9-_.]+$"
                }
            ]},
            "name": name(),
            "desc": desc(),
            "labels": labels(),
            "create_time": timestamp(),
            "update_time": timestamp(),
            "plugins": {"type": "object", "maxProperties": 1}
        },
        "additionalProperties": false
    })
}

/// The ocsp-stapling plugin's field of ssls (`apisix/plugins/ocsp-stapling.lua` adds it to
/// the ssl schema when the plugin is enabled; the Admin API refuses it otherwise).
pub fn ocsp_stapling() -> Value {
    json!({
        "type": "object",
        "properties": {
            "enabled": {"type": "boolean", "default": false},
            "skip_verify": {"type": "boolean", "default": false},
            "cache_ttl": {"type": "integer", "minimum": 60, "default": 3600}
        }
    })
}

pub fn ssl() -> Value {
    let sni = json!({"type": "string", "pattern": HOST_PATTERN});
    json!({
        "type": "object",
        "properties": {
            "id": id(),
            "desc": desc(),
            "labels": labels(),
            "create_time": timestamp(),
            "update_time": timestamp(),
            "type": {
                "description": "server: certificate served to clients; client: certificate presented to upstreams",
                "type": "string",
                "default": "server",
                "enum": ["server", "client"]
            },
            "cert": certificate(),
            "key": private_key(),
            "sni": sni,
            "snis": {"type": "array", "items": sni, "minItems": 1},
            "certs": {"type": "array", "items": certificate()},
            "keys": {"type": "array", "items": private_key()},
            "client": {
                "type": "object",
                "properties": {
                    "ca": certificate(),
                    "depth": {"type": "integer", "minimum": 0, "default": 1},
                    "skip_mtls_uri_regex": {
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": true,
                        "items": {"description": "uri regular expression to skip mtls", "type": "string"}
                    }
                },
                "required": ["ca"]
            },
            "status": {
                "description": "ssl status, 1 to enable, 0 to disable",
                "type": "integer",
                "enum": [1, 0],
                "default": 1
            },
            "ssl_protocols": {
                "description": "set ssl protocols",
                "type": "array",
                "maxItems": 3,
                "uniqueItems": true,
                "items": {"enum": ["TLSv1.1", "TLSv1.2", "TLSv1.3"]}
            },
            "ocsp_stapling": ocsp_stapling()
        },
        "if": {"properties": {"type": {"enum": ["server"]}}},
        "then": {"oneOf": [
            {"required": ["sni", "key", "cert"]},
            {"required": ["snis", "key", "cert"]}
        ]},
        "else": {"required": ["key", "cert"]},
        "additionalProperties": false
    })
}

pub fn proto() -> Value {
    json!({
        "type": "object",
        "properties": named_properties(json!({
            "content": {"type": "string", "minLength": 1, "maxLength": 1048576}
        })),
        "required": ["content"],
        "additionalProperties": false
    })
}

/// Global rules and plugin configs are looked up by id, so the id is part of the document
/// (the Admin API writes the path id into it before checking).
pub fn global_rule() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": id(),
            "create_time": timestamp(),
            "update_time": timestamp(),
            "plugins": plugins()
        },
        "required": ["id", "plugins"],
        "additionalProperties": false
    })
}

pub fn plugin_config() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": id(),
            "name": {"type": "string"},
            "desc": desc(),
            "labels": labels(),
            "create_time": timestamp(),
            "update_time": timestamp(),
            "plugins": plugins()
        },
        "required": ["id", "plugins"],
        "additionalProperties": false
    })
}

pub fn consumer_group() -> Value {
    json!({
        "type": "object",
        "properties": named_properties(json!({
            "plugins": plugins()
        })),
        "required": ["id", "plugins"],
        "additionalProperties": false
    })
}

pub fn stream_route() -> Value {
    json!({
        "type": "object",
        "properties": named_properties(json!({
            "remote_addr": remote_addr(),
            "server_addr": {"description": "server IP", "type": "string", "anyOf": ip_alternatives()},
            "server_port": {"description": "server port", "type": "integer", "minimum": 1, "maximum": 65535},
            "sni": {"description": "server name indication", "type": "string", "pattern": HOST_PATTERN},
            "upstream": upstream(),
            "upstream_id": id(),
            "service_id": id(),
            "plugins": plugins(),
            "protocol": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "superior_id": id(),
                    "conf": {"description": "protocol-specific configuration", "type": "object"},
                    "logger": {
                        "type": "array",
                        "items": {
                            "properties": {
                                "name": {"type": "string"},
                                "filter": {"description": "logger filter rules", "type": "array"},
                                "conf": {"description": "logger plugin configuration", "type": "object"}
                            },
                            "dependencies": {"name": ["conf"]},
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["name"]
            }
        })),
        "additionalProperties": false
    })
}

/// The enabled-plugin list (`plugins:` in `apisix.yaml`, `/apisix/plugins` in etcd).
pub fn plugin_list() -> Value {
    json!({
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "stream": {"type": "boolean"}
            },
            "required": ["name"]
        }
    })
}

/// The `_meta` property every plugin schema accepts.
pub fn plugin_meta() -> Value {
    json!({
        "type": "object",
        "properties": {
            "disable": {"type": "boolean"},
            "error_response": {"oneOf": [{"type": "string"}, {"type": "object"}]},
            "priority": {"description": "priority of plugins by customized order", "type": "integer"},
            "filter": {"description": "run the plugin only when this vars expression matches", "type": "array"},
            "pre_function": {"description": "function run before the plugin in each phase", "type": "string"}
        },
        "additionalProperties": false
    })
}

/// Plugin metadata has no core schema: each plugin's `metadata_schema` applies.
pub fn plugin_metadata() -> Value {
    json!({"type": "object"})
}
