//! Tests for `config.yaml` loading: defaults, every accepted spelling of the loosely typed keys,
//! warnings for unknown keys, errors with paths, environment substitution, and the shipped
//! example file.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(text: &str) -> Settings {
    let (s, warnings) = Settings::from_yaml_str_with_env(text, &no_env).unwrap();
    assert!(warnings.is_empty(), "unexpected warnings: {warnings:?}");
    s
}

fn errors(text: &str) -> Vec<String> {
    match Settings::from_yaml_str_with_env(text, &no_env) {
        Err(SettingsError::Invalid { errors, .. }) => errors,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// The etcd prefix and the three timing settings, to compare at once.
fn etcd_timing(e: &EtcdSettings) -> (&str, u64, u64, u32) {
    (
        e.prefix.as_str(),
        e.timeout,
        e.watch_timeout,
        e.startup_retry,
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn empty_and_comment_only_files_are_all_defaults() {
    assert_eq!(parse(""), Settings::embedded_default());
    assert_eq!(parse("# nothing here\n\n"), Settings::embedded_default());
    assert_eq!(parse("apisix:\n"), Settings::embedded_default());
}

#[test]
fn defaults_match_apisix() {
    let s = Settings::embedded_default();
    assert_eq!(
        s.apisix.node_listen,
        vec![ListenAddr {
            ip: ip("0.0.0.0"),
            port: 9080,
            enable_http2: true,
            enable_http3: false,
            any_address: true,
        }]
    );
    assert!(s.apisix.enable_server_tokens && s.apisix.enable_admin);
    assert!(!s.apisix.show_upstream_status_in_response_header);
    assert!(!s.apisix.delete_uri_tail_slash && !s.apisix.normalize_uri_like_servlet);
    assert_eq!(s.apisix.router.http, HttpRouter::RadixtreeHostUri);
    assert_eq!(s.apisix.proxy_mode, ProxyMode::Http);

    let n = &s.nginx_config;
    assert_eq!(n.worker_processes, WorkerProcesses::Auto);
    assert_eq!(n.worker_shutdown_timeout, Duration::from_secs(240));
    let h = &n.http;
    assert_eq!(h.real_ip_header, "X-Real-IP");
    assert_eq!(
        h.real_ip_from.nets,
        vec!["127.0.0.1/32".parse::<IpNet>().unwrap()]
    );
    assert!(h.real_ip_from.unix && !h.real_ip_recursive);
    assert!(h.real_ip_from.trusts(ip("127.0.0.1")) && !h.real_ip_from.trusts(ip("127.0.0.2")));
    assert!(h.enable_access_log);
    assert_eq!(
        h.access_log,
        AccessLogTarget::File(PathBuf::from("logs/access.log"))
    );
    assert!(h
        .access_log_format
        .starts_with("$remote_addr - $remote_user [$time_local] $http_host"));
    assert!(h.access_log_format.ends_with("\"$apisix_request_id\""));
    assert_eq!(h.access_log_format_escape, LogEscape::Default);
    assert_eq!(h.keepalive_timeout, Duration::from_secs(60));
    assert_eq!(h.client_header_timeout, Duration::from_secs(60));
    assert_eq!(h.client_body_timeout, Duration::from_secs(60));
    assert_eq!(h.send_timeout, Duration::from_secs(10));
    assert_eq!(h.client_max_body_size, 0);
    assert_eq!(
        (h.upstream.keepalive, h.upstream.keepalive_requests),
        (320, 1000)
    );
    assert_eq!(h.upstream.keepalive_timeout, Duration::from_secs(60));

    let d = &s.deployment;
    assert_eq!(d.role, Role::Traditional);
    assert_eq!(d.role_traditional.config_provider, None);
    assert_eq!(
        d.admin.admin_listen,
        AdminListen {
            ip: ip("0.0.0.0"),
            port: 9180
        }
    );
    assert_eq!(
        d.admin.admin_key,
        vec![AdminKey {
            name: "admin".into(),
            key: String::new(),
            role: AdminRole::Admin
        }]
    );
    assert!(d.admin.admin_key_required && d.admin.enable_admin_cors);
    assert_eq!(
        d.admin.allow_admin,
        Some(vec!["127.0.0.0/24".parse().unwrap()])
    );
    assert_eq!(d.admin.admin_api_version, AdminApiVersion::V3);
    assert_eq!(d.etcd.host, vec!["http://127.0.0.1:2379".to_string()]);
    assert_eq!(etcd_timing(&d.etcd), ("/apisix", 30, 50, 2));
    assert_eq!(
        (d.etcd.page_size, d.etcd.max_value_size),
        (1000, 1536 * 1024)
    );
    assert!(d.etcd.tls.verify);

    let p = &s.plugin_attr.prometheus;
    assert_eq!(p.export_uri, "/apisix/prometheus/metrics");
    assert_eq!(p.metric_prefix, "apisix_");
    assert!(p.enable_export_server);
    assert_eq!(
        p.export_addr,
        ExportAddr {
            ip: ip("127.0.0.1"),
            port: 9091
        }
    );
    assert_eq!(p.refresh_interval, 15.0);
    assert_eq!(s.plugins, None);

    assert_eq!(s.provider(), ProviderKind::Embedded);
    assert!(s.admin_enabled());
    assert_eq!(s.standalone_file(), PathBuf::from("conf/apisix.yaml"));
}

#[test]
fn node_listen_single_port() {
    let s = parse("apisix:\n  node_listen: 9081\n");
    assert_eq!(s.apisix.node_listen, vec![ListenAddr::port(9081)]);
}

#[test]
fn node_listen_every_entry_form() {
    let s = parse(
        r#"
apisix:
  node_listen:
    - 9080
    - ip: 127.0.0.2
      port: 9082
      enable_http2: false
    - port: 9083
    - ip: "[::1]"
    - "127.0.0.3:9084"
    - "[::1]:9085"
"#,
    );
    let want = vec![
        ListenAddr {
            ip: ip("0.0.0.0"),
            port: 9080,
            enable_http2: true,
            enable_http3: false,
            any_address: true,
        },
        ListenAddr {
            ip: ip("127.0.0.2"),
            port: 9082,
            enable_http2: false,
            enable_http3: false,
            any_address: false,
        },
        ListenAddr {
            ip: ip("0.0.0.0"),
            port: 9083,
            enable_http2: true,
            enable_http3: false,
            any_address: true,
        },
        ListenAddr {
            ip: ip("::1"),
            port: 9080,
            enable_http2: true,
            enable_http3: false,
            any_address: false,
        },
        ListenAddr {
            ip: ip("127.0.0.3"),
            port: 9084,
            enable_http2: true,
            enable_http3: false,
            any_address: false,
        },
        ListenAddr {
            ip: ip("::1"),
            port: 9085,
            enable_http2: true,
            enable_http3: false,
            any_address: false,
        },
    ];
    assert_eq!(s.apisix.node_listen, want);
}

#[test]
fn listener_http2_follows_the_global_switch_unless_explicit() {
    let s = parse(
        "apisix:\n  enable_http2: false\n  node_listen:\n    - 9080\n    - {port: 9081, enable_http2: true}\n",
    );
    assert!(!s.apisix.node_listen[0].enable_http2);
    assert!(s.apisix.node_listen[1].enable_http2);
    let s = parse("apisix:\n  enable_http2: false\n");
    assert!(!s.apisix.node_listen[0].enable_http2);
}

#[test]
fn apisix_switches_router_and_proxy_mode() {
    let s = parse(
        r#"
apisix:
  enable_server_tokens: false
  enable_admin: false
  show_upstream_status_in_response_header: true
  delete_uri_tail_slash: true
  normalize_uri_like_servlet: true
  router:
    http: radixtree_uri_with_parameter
  proxy_mode: "http&stream"
"#,
    );
    assert!(!s.apisix.enable_server_tokens && !s.apisix.enable_admin);
    assert!(s.apisix.show_upstream_status_in_response_header);
    assert!(s.apisix.delete_uri_tail_slash && s.apisix.normalize_uri_like_servlet);
    assert_eq!(s.apisix.router.http, HttpRouter::RadixtreeUriWithParameter);
    assert_eq!(s.apisix.proxy_mode, ProxyMode::HttpAndStream);
    assert!(!s.admin_enabled());
    assert_eq!(
        parse("apisix: {router: {http: radixtree_uri}}")
            .apisix
            .router
            .http,
        HttpRouter::RadixtreeUri
    );
}

#[test]
fn worker_processes_forms() {
    let wp = |v: &str| {
        parse(&format!("nginx_config:\n  worker_processes: {v}\n"))
            .nginx_config
            .worker_processes
    };
    assert_eq!(wp("auto"), WorkerProcesses::Auto);
    assert_eq!(wp("4"), WorkerProcesses::Count(4));
    assert_eq!(wp("\"2\""), WorkerProcesses::Count(2));
    assert_eq!(WorkerProcesses::Count(3).resolve(), 3);
    assert!(WorkerProcesses::Auto.resolve() >= 1);
    let e = errors("nginx_config:\n  worker_processes: 0\n");
    assert_eq!(
        e,
        vec!["nginx_config.worker_processes: invalid value: integer `0`, expected \"auto\" or a number of workers (at least 1)".to_string()]
    );
}

#[test]
fn nginx_http_keys() {
    let s = parse(
        r#"
nginx_config:
  worker_shutdown_timeout: 2m
  http:
    real_ip_header: X-Forwarded-For
    real_ip_from: [10.0.0.0/8, "::1"]
    real_ip_recursive: "on"
    enable_access_log: false
    access_log: stdout
    access_log_format: "$remote_addr $status"
    access_log_format_escape: json
    keepalive_timeout: 75s
    client_header_timeout: 30
    client_body_timeout: 1m30s
    send_timeout: 500ms
    client_max_body_size: 8m
    upstream:
      keepalive: 64
      keepalive_requests: 100
      keepalive_timeout: 30s
"#,
    );
    let n = &s.nginx_config;
    assert_eq!(n.worker_shutdown_timeout, Duration::from_secs(120));
    let h = &n.http;
    assert_eq!(h.real_ip_header, "X-Forwarded-For");
    assert_eq!(
        h.real_ip_from,
        RealIpFrom {
            nets: vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            unix: false
        }
    );
    assert!(h.real_ip_recursive && !h.enable_access_log);
    assert_eq!(h.access_log, AccessLogTarget::Stdout);
    assert_eq!(h.access_log_format, "$remote_addr $status");
    assert_eq!(h.access_log_format_escape, LogEscape::Json);
    assert_eq!(h.keepalive_timeout, Duration::from_secs(75));
    assert_eq!(h.client_header_timeout, Duration::from_secs(30));
    assert_eq!(h.client_body_timeout, Duration::from_secs(90));
    assert_eq!(h.send_timeout, Duration::from_millis(500));
    assert_eq!(h.client_max_body_size, 8 << 20);
    assert_eq!(
        (h.upstream.keepalive, h.upstream.keepalive_requests),
        (64, 100)
    );
    assert_eq!(h.upstream.keepalive_timeout, Duration::from_secs(30));

    let h = parse("nginx_config: {http: {real_ip_recursive: true, access_log: \"off\"}}")
        .nginx_config
        .http;
    assert!(h.real_ip_recursive);
    assert_eq!(h.access_log, AccessLogTarget::Off);
    let h =
        parse("nginx_config: {http: {access_log: /dev/stderr, access_log_format_escape: none}}")
            .nginx_config
            .http;
    assert_eq!(h.access_log, AccessLogTarget::Stderr);
    assert_eq!(h.access_log_format_escape, LogEscape::NoEscape);
}

#[test]
fn allow_admin_keeps_null_and_empty_apart() {
    let allow = |t: &str| parse(t).deployment.admin.allow_admin;
    assert_eq!(allow(""), Some(vec!["127.0.0.0/24".parse().unwrap()]));
    assert_eq!(allow("deployment:\n  admin:\n    allow_admin: ~\n"), None);
    assert_eq!(allow("deployment:\n  admin:\n    allow_admin:\n"), None);
    assert_eq!(
        allow("deployment:\n  admin:\n    allow_admin: []\n"),
        Some(vec![])
    );
    assert_eq!(
        allow("deployment:\n  admin:\n    allow_admin: [10.1.2.3, \"::/64\"]\n"),
        Some(vec![
            "10.1.2.3/32".parse().unwrap(),
            "::/64".parse().unwrap()
        ])
    );
}

#[test]
fn deployment_admin_and_etcd() {
    let (s, _bypass_warning) = with_warnings(
        r#"
deployment:
  role: traditional
  role_traditional:
    config_provider: etcd
  admin:
    admin_listen: {ip: 127.0.0.1, port: 9181}
    admin_key:
      - {name: admin, key: edd1c9f034335f136f87ad84b625c8f1, role: admin}
      - {name: viewer, key: 4054, role: viewer}
    admin_key_required: false
    enable_admin_cors: false
    admin_api_version: default
  etcd:
    host: ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
    prefix: /gw
    timeout: 5
    watch_timeout: 20
    startup_retry: 5
    page_size: 250
    max_value_size: 0
    user: root
    password: 123456
    tls: {cert: /c.pem, key: /k.pem, verify: false, sni: etcd.local}
"#,
    );
    let d = &s.deployment;
    assert_eq!(s.provider(), ProviderKind::Etcd);
    assert_eq!(
        d.admin.admin_listen,
        AdminListen {
            ip: ip("127.0.0.1"),
            port: 9181
        }
    );
    assert_eq!(
        d.admin.admin_key[1],
        AdminKey {
            name: "viewer".into(),
            key: "4054".into(),
            role: AdminRole::Viewer
        }
    );
    assert!(!d.admin.admin_key_required && !d.admin.enable_admin_cors);
    assert_eq!(d.admin.admin_api_version, AdminApiVersion::Default);
    assert_eq!(d.etcd.host.len(), 2);
    assert_eq!(etcd_timing(&d.etcd), ("/gw", 5, 20, 5));
    assert_eq!((d.etcd.page_size, d.etcd.max_value_size), (250, 0));
    assert_eq!(
        (d.etcd.user.as_deref(), d.etcd.password.as_deref()),
        (Some("root"), Some("123456"))
    );
    assert_eq!(
        d.etcd.tls,
        EtcdTls {
            cert: Some("/c.pem".into()),
            key: Some("/k.pem".into()),
            verify: false,
            sni: Some("etcd.local".into())
        }
    );
}

#[test]
fn status_api_address() {
    assert_eq!(parse("").apisix.status, None);
    assert_eq!(
        parse("apisix: {status: {}}").apisix.status,
        Some(StatusListen::default())
    );
    let s = parse("apisix: {status: {ip: 127.0.0.2, port: 7086}}");
    assert_eq!(
        s.apisix.status,
        Some(StatusListen {
            ip: "127.0.0.2".parse().unwrap(),
            port: 7086
        })
    );
}

#[test]
fn provider_selection() {
    let kind = |t: &str| parse(t).provider();
    assert_eq!(kind(""), ProviderKind::Embedded);
    assert_eq!(
        kind("deployment: {role_traditional: {config_provider: embedded}}"),
        ProviderKind::Embedded
    );
    assert_eq!(
        kind("deployment: {role_traditional: {config_provider: yaml}}"),
        ProviderKind::StandaloneApi
    );
    assert_eq!(
        kind("apisix: {enable_admin: false}\ndeployment: {role_traditional: {config_provider: yaml}}"),
        ProviderKind::Yaml
    );
    assert_eq!(
        kind("deployment: {role_traditional: {config_provider: etcd}}"),
        ProviderKind::Etcd
    );
    assert_eq!(
        kind("deployment: {role: control_plane}"),
        ProviderKind::Etcd
    );
    assert_eq!(
        kind("deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}"),
        ProviderKind::Yaml
    );
    assert_eq!(
        kind("deployment: {role: data_plane, role_data_plane: {config_provider: json}}"),
        ProviderKind::Json
    );
    assert_eq!(
        kind("deployment: {role: data_plane, role_data_plane: {config_provider: etcd}}"),
        ProviderKind::Etcd
    );

    let s = parse("deployment: {role: data_plane, role_data_plane: {config_provider: json}}");
    assert_eq!(s.standalone_file(), PathBuf::from("conf/apisix.json"));
    assert!(!s.admin_enabled());
}

#[test]
fn data_plane_needs_a_supported_provider() {
    assert_eq!(
        errors("deployment:\n  role: data_plane\n"),
        vec!["deployment.role_data_plane.config_provider: required when deployment.role is data_plane (etcd, yaml or json)".to_string()]
    );
    assert_eq!(
        errors("deployment: {role: data_plane, role_data_plane: {config_provider: xds}}"),
        vec!["deployment.role_data_plane.config_provider: xds is not supported by ferrisix (use etcd, yaml or json)".to_string()]
    );
}

#[test]
fn plugins_and_plugin_attr() {
    let s = parse(
        r#"
plugins: [limit-count, prometheus]
plugin_attr:
  prometheus:
    export_uri: /metrics
    metric_prefix: gw_
    enable_export_server: false
    export_addr: {ip: 0.0.0.0, port: 9092}
    refresh_interval: 0.1
    default_buckets: [1, 5, 10.5]
  log-rotate:
    interval: 60
"#,
    );
    assert_eq!(
        s.plugins,
        Some(vec!["limit-count".to_string(), "prometheus".to_string()])
    );
    let p = &s.plugin_attr.prometheus;
    assert_eq!(
        (p.export_uri.as_str(), p.metric_prefix.as_str()),
        ("/metrics", "gw_")
    );
    assert!(!p.enable_export_server);
    assert_eq!(
        p.export_addr,
        ExportAddr {
            ip: ip("0.0.0.0"),
            port: 9092
        }
    );
    assert_eq!(p.refresh_interval, 0.1);
    assert_eq!(p.default_buckets, Some(vec![1.0, 5.0, 10.5]));
    assert_eq!(
        s.plugin_attr.others["log-rotate"],
        serde_json::json!({"interval": 60})
    );
    assert_eq!(parse("plugins: []").plugins, Some(vec![]));
}

#[test]
fn prometheus_metrics_extra_labels_and_expire() {
    // APISIX's config.yaml.example, uncommented.
    let s = parse(
        r#"
plugin_attr:
  prometheus:
    metrics:
      http_status:
        expire: 0
        extra_labels:
          - upstream_addr: $upstream_addr
          - status: $upstream_status
      http_latency:
        expire: 1.5
        extra_labels:
          - upstream_addr: $upstream_addr
      bandwidth:
        expire: 60
"#,
    );
    let m = &s.plugin_attr.prometheus.metrics;
    let label = |name: &str, value: &str| ExtraLabel {
        name: name.into(),
        value: value.into(),
    };
    assert_eq!(
        m.http_status,
        MetricAttr {
            expire: 0.0,
            extra_labels: vec![
                label("upstream_addr", "$upstream_addr"),
                label("status", "$upstream_status")
            ],
        }
    );
    assert_eq!(m.http_status.extra_labels[1].variable(), "upstream_status");
    assert_eq!(m.http_latency.expire, 1.5);
    assert_eq!(
        m.http_latency.extra_labels,
        vec![label("upstream_addr", "$upstream_addr")]
    );
    assert_eq!(
        m.bandwidth,
        MetricAttr {
            expire: 60.0,
            extra_labels: vec![]
        }
    );

    // Empty keys (everything below them commented out) are absent values, as in APISIX.
    for text in [
        "plugin_attr:\n  prometheus:\n    metrics:\n",
        "plugin_attr:\n  prometheus:\n    metrics:\n      http_status:\n",
        "plugin_attr:\n  prometheus:\n    metrics:\n      http_status:\n        expire:\n        extra_labels:\n",
    ] {
        assert_eq!(
            parse(text).plugin_attr.prometheus.metrics,
            PrometheusMetrics::default(),
            "{text}"
        );
    }
}

#[test]
fn prometheus_metrics_errors() {
    let e = errors(
        r#"
plugin_attr:
  prometheus:
    metrics:
      http_status:
        expire: -1
        extra_labels:
          - upstream_addr: 5
      http_latency:
        expire: soon
        extra_labels:
          - {a: $a, b: $b}
          - $upstream_addr
      bandwidth:
        extra_labels:
          - a: [$a, {b: 1}]
"#,
    );
    assert_eq!(
        e,
        vec![
            "plugin_attr.prometheus.metrics.http_status.expire: invalid value: integer `-1`, expected a number of seconds, 0 or more (0 = never)",
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[0]: invalid type: integer `5`, expected a string naming an nginx variable, like "$upstream_addr""#,
            r#"plugin_attr.prometheus.metrics.http_latency.expire: invalid type: string "soon", expected a number of seconds, 0 or more (0 = never)"#,
            "plugin_attr.prometheus.metrics.http_latency.extra_labels[0]: invalid length 2, expected a single `label: $variable` entry, like {upstream_addr: $upstream_addr}",
            r#"plugin_attr.prometheus.metrics.bandwidth.extra_labels[0]: invalid type: sequence, expected a string naming an nginx variable, like "$upstream_addr""#,
        ]
    );
    let e = errors(
        r#"
plugin_attr:
  prometheus:
    metrics:
      http_status:
        extra_labels:
          - 1st: $upstream_addr
          - code: $upstream_status
          - up: $upstream_addr
          - up: $upstream_status
      http_latency:
        extra_labels:
          - le: $upstream_addr
          - upstream-addr: $upstream_addr
      bandwidth:
        extra_labels:
          - type: $scheme
"#,
    );
    assert_eq!(
        e,
        vec![
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[0]: invalid value: string "1st", expected a label name matching [a-zA-Z_][a-zA-Z0-9_]*"#,
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[1]: invalid value: string "code", expected a label name the metric does not already have"#,
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[3]: invalid value: string "up", expected a label name not used earlier in the list"#,
            r#"plugin_attr.prometheus.metrics.http_latency.extra_labels[0]: invalid value: string "le", expected a label name other than le (reserved for histogram buckets)"#,
            r#"plugin_attr.prometheus.metrics.http_latency.extra_labels[1]: invalid value: string "upstream-addr", expected a label name matching [a-zA-Z_][a-zA-Z0-9_]*"#,
            r#"plugin_attr.prometheus.metrics.bandwidth.extra_labels[0]: invalid value: string "type", expected a label name the metric does not already have"#,
        ]
    );
}

#[test]
fn prometheus_metrics_warnings() {
    let (s, warnings) = Settings::from_yaml_str_with_env(
        r#"
plugin_attr:
  prometheus:
    metrics:
      http_status:
        extra_labels:
          - up: upstream_addr
          - empty: ""
      upstream_status:
        expire: 5
        extra_labels:
          - up: $upstream_addr
"#,
        &no_env,
    )
    .unwrap();
    let labels = &s.plugin_attr.prometheus.metrics.http_status.extra_labels;
    assert_eq!(labels[0].variable(), "pstream_addr");
    assert_eq!(labels[1].variable(), "");
    assert_eq!(s.plugin_attr.prometheus.metrics.upstream_status.expire, 5.0);
    assert_eq!(
        warnings,
        vec![
            "unknown or unsupported key `plugin_attr.prometheus.metrics.upstream_status.extra_labels` ignored",
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[0]: "upstream_addr" is not a $variable; as in APISIX, label "up" takes the value of variable "pstream_addr""#,
            r#"plugin_attr.prometheus.metrics.http_status.extra_labels[1]: "" is not a $variable; as in APISIX, label "empty" takes the value of variable """#,
            "plugin_attr.prometheus.metrics.upstream_status.expire ignored: ferrisix's upstream_status series come and go with the health checkers",
        ]
    );
}

#[test]
fn unknown_keys_are_warnings_with_their_path() {
    let (s, warnings) = Settings::from_yaml_str_with_env(
        r#"
apisix:
  node_listen:
    - {port: 9081, reuseport: true}
  enable_ipv6: false
  disable_upstream_healthcheck: true
  ssl:
    enable: true
nginx_config:
  http:
    upstream:
      keepalive_pool: 3
stream_plugins: [ip-restriction]
plugin_attr:
  prometheus:
    metrics:
      llm_latency: {expire: 10}
      ai_cache_hits_total: {expire: 10}
      not_a_metric: {expire: 10}
"#,
        &no_env,
    )
    .unwrap();
    assert_eq!(s.apisix.node_listen, vec![ListenAddr::port(9081)]);
    assert!(!s.apisix.enable_ipv6);
    assert!(s.apisix.disable_upstream_healthcheck);
    let mut warnings = warnings;
    warnings.sort();
    assert_eq!(
        warnings,
        vec![
            "unknown or unsupported key `apisix.node_listen[0].reuseport` ignored",
            "unknown or unsupported key `nginx_config.http.upstream.keepalive_pool` ignored",
            "unknown or unsupported key `plugin_attr.prometheus.metrics.not_a_metric` ignored",
        ]
    );
}

#[test]
fn wrong_type_is_refused_with_the_key_path() {
    let e = errors("apisix:\n  node_listen: [9080, x]\n");
    assert_eq!(
        e,
        vec![r#"apisix.node_listen[1]: invalid value: string "x", expected a port number (1-65535), an "ip:port" string or a map {ip, port, enable_http2, enable_http3}"#.to_string()]
    );
    let e = errors("apisix:\n  node_listen: [9080, true]\n");
    assert!(
        e[0].starts_with(
            "apisix.node_listen[1]: invalid type: boolean `true`, expected a port number"
        ),
        "{e:?}"
    );
    let e = errors("apisix:\n  node_listen: 70000\n");
    assert!(
        e[0].starts_with("apisix.node_listen: invalid value: integer `70000`"),
        "{e:?}"
    );
}

#[test]
fn every_error_is_reported() {
    let e = errors(
        r#"
apisix:
  node_listen: [9080, {port: "abc"}]
  enable_admin: "yes"
  router:
    http: radixtree_nope
nginx_config:
  worker_shutdown_timeout: soon
deployment:
  admin:
    admin_listen: {port: 0}
    allow_admin: [not-an-ip]
  etcd:
    host: ["127.0.0.1:2379"]
"#,
    );
    assert_eq!(
        e,
        vec![
            r#"apisix.node_listen[1].port: invalid type: string "abc", expected a port number (1-65535)"#,
            r#"apisix.enable_admin: invalid type: string "yes", expected a boolean"#,
            "apisix.router.http: unknown variant `radixtree_nope`, expected one of `radixtree_host_uri`, `radixtree_uri`, `radixtree_uri_with_parameter`",
            r#"nginx_config.worker_shutdown_timeout: invalid value: string "soon", expected a number of seconds or an nginx time like "60s", "1m30s", "500ms""#,
            "deployment.admin.admin_listen.port: invalid value: integer `0`, expected a port number (1-65535)",
            r#"deployment.admin.allow_admin[0]: invalid value: string "not-an-ip", expected an IP address or CIDR"#,
            r#"deployment.etcd.host[0]: invalid value: string "127.0.0.1:2379", expected an address starting with http:// or https://"#,
        ]
    );
}

#[test]
fn yaml_syntax_error_has_line_and_column() {
    match Settings::from_yaml_str_with_env("apisix:\n  node_listen: [9080\nfoo: bar\n", &no_env) {
        Err(SettingsError::Syntax { message, .. }) => {
            assert!(message.contains("line"), "{message}")
        }
        other => panic!("expected Syntax, got {other:?}"),
    }
    assert_eq!(
        errors("- 1\n- 2\n"),
        vec!["the top level must be a mapping of sections".to_string()]
    );
}

#[test]
fn env_substitution() {
    let env = |name: &str| match name {
        "PORT" => Some("9443".to_string()),
        "ADMIN_KEY" => Some("secret".to_string()),
        "CORS" => Some("false".to_string()),
        _ => None,
    };
    let (s, _) = Settings::from_yaml_str_with_env(
        r#"
apisix:
  node_listen: ${{PORT}}
deployment:
  admin:
    admin_key: [{name: admin, key: "${{ADMIN_KEY}}", role: admin}]
    enable_admin_cors: ${{CORS}}
    admin_listen: {port: "${{ADMIN_PORT:=9181}}"}
  etcd:
    prefix: "/${{NAME:= gw }}"
"#,
        &env,
    )
    .unwrap();
    assert_eq!(s.apisix.node_listen, vec![ListenAddr::port(9443)]);
    assert_eq!(s.deployment.admin.admin_key[0].key, "secret");
    assert!(!s.deployment.admin.enable_admin_cors);
    assert_eq!(s.deployment.admin.admin_listen.port, 9181);
    assert_eq!(s.deployment.etcd.prefix, "/gw");

    match Settings::from_yaml_str_with_env("apisix:\n  node_listen: ${{NOPE}}\n", &env) {
        Err(SettingsError::Invalid { errors, .. }) => assert_eq!(
            errors,
            vec![
                "failed to handle configuration: can't find environment variable NOPE".to_string()
            ]
        ),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn load_from_a_file_and_resolve_the_standalone_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n",
    )
    .unwrap();
    let (s, warnings) = Settings::load(&path).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(s.source.as_deref(), Some(path.as_path()));
    assert_eq!(s.provider(), ProviderKind::Yaml);
    assert_eq!(s.standalone_file(), dir.path().join("apisix.yaml"));

    std::fs::write(&path, "ferrisix:\n  config_file: routes/gw.yaml\n").unwrap();
    let (s, _) = Settings::load(&path).unwrap();
    assert_eq!(s.standalone_file(), dir.path().join("routes/gw.yaml"));

    std::fs::write(&path, "ferrisix:\n  config_file: /etc/gw.yaml\n").unwrap();
    assert_eq!(
        Settings::load(&path).unwrap().0.standalone_file(),
        PathBuf::from("/etc/gw.yaml")
    );

    let missing = dir.path().join("missing.yaml");
    assert!(matches!(
        Settings::load(&missing),
        Err(SettingsError::Io { .. })
    ));
    let (s, warnings) = Settings::load_or_default(&missing).unwrap();
    assert_eq!(s, Settings::embedded_default());
    assert_eq!(warnings.len(), 1);

    std::fs::write(&path, "apisix:\n  node_listen: x\n").unwrap();
    let err = Settings::load(&path).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "{}: invalid configuration:\n  apisix.node_listen: ",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn shipped_example_config_is_a_yaml_data_plane() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/config.yaml");
    let (s, warnings) = Settings::load(&path).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(s.deployment.role, Role::DataPlane);
    assert_eq!(s.provider(), ProviderKind::Yaml);
    assert!(!s.admin_enabled());
    assert_eq!(
        s.standalone_file(),
        path.parent().unwrap().join("apisix.yaml")
    );
    // Everything else in the reference file is APISIX's default.
    let mut defaults = Settings::embedded_default();
    defaults.deployment.role = Role::DataPlane;
    defaults.deployment.role_data_plane.config_provider = Some(DataPlaneProvider::Yaml);
    defaults.deployment.role_traditional.config_provider =
        s.deployment.role_traditional.config_provider;
    defaults.source = s.source.clone();
    assert_eq!(s, defaults);
}

fn with_warnings(text: &str) -> (Settings, Vec<String>) {
    Settings::from_yaml_str_with_env(text, &no_env).unwrap()
}

/// Issue 8, finding 1: an empty key list is refused (APISIX's CLI dies on it) unless the
/// Admin API is loopback-only, where it is only warned about; the run-time check then refuses
/// every request.
#[test]
fn empty_admin_key_list_is_refused_or_warned() {
    let e = errors("deployment:\n  admin:\n    admin_key: []\n    allow_admin: [0.0.0.0/0]\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("deployment.admin.admin_key: ERROR: missing valid Admin API token"),
        "{e:?}"
    );
    // `allow_admin: ~` lets everyone in: refused too.
    assert_eq!(
        errors("deployment:\n  admin:\n    admin_key: []\n    allow_admin: ~\n").len(),
        1
    );
    let (s, w) = with_warnings("deployment:\n  admin:\n    admin_key: []\n");
    assert!(s.deployment.admin.admin_key.is_empty());
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("every Admin API request is refused with 401"),
        "{w:?}"
    );
    // No Admin API, nothing to say.
    let (_, w) = with_warnings(
        "apisix:\n  enable_admin: false\ndeployment:\n  admin:\n    admin_key: []\n    allow_admin: ~\n",
    );
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn admin_key_not_required_is_warned_about() {
    let (s, w) = with_warnings(
        "deployment:\n  admin:\n    admin_key: []\n    admin_key_required: false\n    allow_admin: ~\n",
    );
    assert!(!s.deployment.admin.admin_key_required);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("Admin key is bypassed"), "{w:?}");
}

/// Issue 8, finding 9: config.yaml nested 100k deep is refused at once with a clear message.
#[test]
fn deeply_nested_config_is_refused_quickly() {
    let started = std::time::Instant::now();
    let text = format!("apisix:\n  node_listen: {}\n", "[".repeat(100_000));
    match Settings::from_yaml_str_with_env(&text, &no_env) {
        Err(SettingsError::Syntax { message, .. }) => {
            assert!(
                message.contains("nested deeper than 256 levels"),
                "{message}"
            )
        }
        other => panic!("expected Syntax, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn proxy_cache_zones_default_to_apisixs_and_are_read() {
    let s = Settings::default();
    let pc = s.apisix.proxy_cache.unwrap();
    assert_eq!(pc.cache_ttl, Duration::from_secs(10));
    let names: Vec<&str> = pc.zones.iter().map(|z| z.name.as_str()).collect();
    assert_eq!(names, ["disk_cache_one", "memory_cache"]);
    let (s, warnings) = Settings::from_yaml_str_with_env(
        r#"
apisix:
  proxy_cache:
    cache_ttl: 1m
    zones:
      - name: disk_two
        memory_size: 1m
        disk_size: 2g
        disk_path: /var/cache/two
        cache_levels: "2:1:2"
      - {name: mem, memory_size: 512k}
"#,
        &no_env,
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pc = s.apisix.proxy_cache.unwrap();
    assert_eq!(pc.cache_ttl, Duration::from_secs(60));
    assert_eq!(pc.zones[0].disk_size, Some(2 << 30));
    assert_eq!(pc.zones[0].memory_size, 1 << 20);
    assert_eq!(pc.zones[1].memory_size, 512 << 10);
    assert_eq!(pc.zones[1].disk_path, None);
    assert_eq!(super::cache_levels("2:1:2"), Some(vec![2, 1, 2]));
    for bad in ["", "3", "1:2:1:2", "1:", "a"] {
        assert_eq!(super::cache_levels(bad), None, "{bad}");
    }
    let err = Settings::from_yaml_str_with_env(
        "apisix:\n  proxy_cache:\n    zones:\n      - {name: d, memory_size: 1m, disk_path: /x, cache_levels: \"1:3\"}\n",
        &no_env,
    )
    .unwrap_err();
    assert!(err.to_string().contains("zones[0].cache_levels"), "{err}");
}

#[test]
fn stream_proxy_listens_and_plugins() {
    let s = parse(
        r#"
apisix:
  proxy_mode: stream
  stream_proxy:
    tcp:
      - 9100
      - "127.0.0.1:9101"
      - addr: "[::1]:9110"
        tls: true
      - addr: 9120
      - "127.0.0.2:9130-9132"
    udp:
      - "127.0.0.1:9200"
stream_plugins:
  - ip-restriction
  - mqtt-proxy
"#,
    );
    assert!(s.apisix.proxy_mode.stream());
    let tcp: Vec<(IpAddr, u16, bool)> = s
        .apisix
        .stream_proxy
        .tcp
        .iter()
        .map(|l| (l.ip, l.port, l.tls))
        .collect();
    assert_eq!(
        tcp,
        [
            (ip("0.0.0.0"), 9100, false),
            (ip("127.0.0.1"), 9101, false),
            (ip("::1"), 9110, true),
            (ip("0.0.0.0"), 9120, false),
            (ip("127.0.0.2"), 9130, false),
            (ip("127.0.0.2"), 9131, false),
            (ip("127.0.0.2"), 9132, false),
        ]
    );
    assert_eq!(s.apisix.stream_proxy.udp.len(), 1);
    assert_eq!(s.apisix.stream_proxy.udp[0].port, 9200);
    assert_eq!(
        s.stream_plugins.as_deref(),
        Some(&["ip-restriction".to_string(), "mqtt-proxy".to_string()][..])
    );
    assert!(!parse("apisix: {proxy_mode: http}")
        .apisix
        .proxy_mode
        .stream());
    for bad in [
        "apisix: {stream_proxy: {tcp: [\"127.0.0.1:0\"]}}",
        "apisix: {stream_proxy: {tcp: [\"x:9100\"]}}",
        "apisix: {stream_proxy: {tcp: [\"127.0.0.1:9105-9100\"]}}",
        "apisix: {stream_proxy: {tcp: [{addr: 9100, tls: 1}]}}",
    ] {
        assert!(!errors(bad).is_empty(), "{bad}");
    }
}

/// APISIX's `t/cli/test_stream_proxy_protocol.sh` cases: the global defaults, per-port
/// overrides both ways, UDP never, and `nginx_config.stream.real_ip_from`.
#[test]
fn proxy_protocol_keys() {
    let flags = |s: &Settings| -> Vec<(u16, bool, bool)> {
        s.apisix
            .stream_proxy
            .tcp
            .iter()
            .map(|l| (l.port, l.accepts_proxy_protocol(), l.sends_proxy_protocol()))
            .collect()
    };
    let s = parse("apisix:\n  stream_proxy:\n    tcp: [9100]\n    udp: [9200]\n");
    assert_eq!(flags(&s), [(9100, false, false)]);
    assert_eq!(s.apisix.proxy_protocol, ProxyProtocolSettings::default());
    assert!(s.nginx_config.stream.real_ip_from.nets.is_empty());

    let s = parse(
        r#"
apisix:
  proxy_protocol:
    listen_http_port: 9181
    listen_https_port: 9182
    enable_tcp_pp: true
    enable_tcp_pp_to_upstream: true
  stream_proxy:
    tcp:
      - 9100
      - addr: 9101
        proxy_protocol: false
      - addr: "127.0.0.1:9102-9103"
        proxy_protocol_to_upstream: false
    udp:
      - 9200
nginx_config:
  stream:
    real_ip_from:
      - 192.168.1.0/24
      - 10.0.0.0/8
"#,
    );
    let pp = s.apisix.proxy_protocol;
    assert_eq!(
        (pp.listen_http_port, pp.listen_https_port),
        (Some(9181), Some(9182))
    );
    assert_eq!(
        flags(&s),
        [
            (9100, true, true),
            (9101, false, true),
            (9102, true, false),
            (9103, true, false)
        ]
    );
    let udp = &s.apisix.stream_proxy.udp[0];
    assert!(!udp.accepts_proxy_protocol() && !udp.sends_proxy_protocol());
    let trusted = &s.nginx_config.stream.real_ip_from;
    assert!(trusted.trusts(ip("192.168.1.9")) && trusted.trusts(ip("10.1.2.3")));
    assert!(!trusted.trusts(ip("127.0.0.1")));

    let s = parse(
        "apisix:\n  stream_proxy:\n    tcp:\n      - addr: 9100\n        proxy_protocol: true\n      - addr: 9101\n        proxy_protocol_to_upstream: true\n",
    );
    assert_eq!(flags(&s), [(9100, true, false), (9101, false, true)]);

    for bad in [
        "apisix: {proxy_protocol: {listen_http_port: x}}",
        "apisix: {proxy_protocol: {listen_http_port: 70000}}",
        "apisix: {proxy_protocol: {enable_tcp_pp: 1}}",
        "apisix: {stream_proxy: {tcp: [{addr: 9100, proxy_protocol: yes-please}]}}",
        "apisix: {stream_proxy: {tcp: [{addr: 9100, proxy_protocol_to_upstream: 1}]}}",
        "nginx_config: {stream: {real_ip_from: [not-an-address]}}",
    ] {
        assert!(!errors(bad).is_empty(), "{bad}");
    }
}

#[test]
fn wasm_plugins_and_limits() {
    let s = parse(
        "wasm:\n  plugins:\n    - name: wasm-log\n      priority: 7999\n      file: t/wasm/log.wasm\n\
         \x20   - name: wasm-auth\n      priority: 7998\n      file: /abs/auth.wasm\n      http_request_phase: rewrite\n\
         ferrisix:\n  wasm:\n    timeout: 250ms\n    max_memory: 1048576\n",
    );
    let p = &s.wasm.plugins;
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].name.as_str(), p[0].priority), ("wasm-log", 7999));
    assert_eq!(p[0].file, PathBuf::from("t/wasm/log.wasm"));
    assert_eq!(p[0].http_request_phase, WasmRequestPhase::Access);
    assert_eq!(p[1].http_request_phase, WasmRequestPhase::Rewrite);
    assert_eq!(s.ferrisix.wasm.timeout, Duration::from_millis(250));
    assert_eq!(s.ferrisix.wasm.max_memory, 1 << 20);
    assert_eq!(parse("{}").ferrisix.wasm, WasmLimits::default());
    for bad in [
        "wasm: {plugins: [{name: a, priority: 1, file: a.wasm}, {name: a, priority: 2, file: b.wasm}]}",
        "wasm: {plugins: [{name: '', priority: 1, file: a.wasm}]}",
        "wasm: {plugins: [{name: a, priority: 1, file: ''}]}",
        "wasm: {plugins: [{name: a, priority: 1, file: a.wasm, http_request_phase: log}]}",
        "wasm: {plugins: [{name: a, file: a.wasm}]}",
        "ferrisix: {wasm: {timeout: 0}}",
        "ferrisix: {wasm: {max_memory: 100}}",
    ] {
        assert!(!errors(bad).is_empty(), "{bad}");
    }
}

#[test]
fn ext_plugin_section() {
    let (s, warnings) = Settings::from_yaml_str_with_env(
        r#"
ext-plugin:
  cmd: ["python3", "runner.py", "run"]
  path_for_test: /tmp/runner.sock
ferrisix:
  ext_plugin_timeout: 2s
"#,
        &no_env,
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        s.ext_plugin.cmd.as_deref(),
        Some(
            &[
                "python3".to_owned(),
                "runner.py".to_owned(),
                "run".to_owned()
            ][..]
        )
    );
    assert_eq!(s.ext_plugin_socket(), PathBuf::from("/tmp/runner.sock"));
    assert_eq!(s.ferrisix.ext_plugin_timeout, Duration::from_secs(2));
    let d = Settings::default();
    assert_eq!(d.ferrisix.ext_plugin_timeout, Duration::from_secs(60));
    assert!(d.ext_plugin_socket().is_absolute());
    assert!(d
        .ext_plugin_socket()
        .ends_with(format!("conf/apisix-{}.sock", std::process::id())));
}

#[test]
fn ssl_listen_reads_enable_http3() {
    let s = parse(
        r#"
apisix:
  ssl:
    listen:
      - port: 9443
        enable_http3: true
      - ip: 127.0.0.3
        port: 9445
      - 9446
"#,
    );
    let l = &s.apisix.ssl.listen;
    assert_eq!(l.len(), 3);
    assert!(l[0].enable_http3 && l[0].port == 9443);
    assert!(!l[1].enable_http3 && l[1].port == 9445);
    assert!(!l[2].enable_http3);
    // Off unless asked for, as in APISIX's config.yaml.example.
    assert!(!Settings::embedded_default().apisix.ssl.listen[0].enable_http3);
}
