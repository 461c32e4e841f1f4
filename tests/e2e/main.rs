//! The end-to-end tests: the real `ferrisix` binary, started by each test on random 127.0.0.1
//! ports, against real upstreams, etcd, Redis and log servers (`support`).
//!
//! They are one test binary with a module per area, rather than one binary per file: each
//! binary links the whole harness and its dependencies again, and that linking was most of
//! what building the tests cost. Run one area with `cargo test --test e2e <module>::`.
//! `tests/route_memory.rs` stays a binary of its own: it installs a counting global allocator.

mod support;

mod admin_tools;
mod auth_etcd;
mod balancing;
mod discovery;
mod dns;
mod docs_commands;
mod docs_inline;
mod embedded_store;
mod etcd_cluster;
mod etcd_pages;
mod ext_plugin;
mod grpc;
mod grpc_transcode;
mod h2_upstream;
mod headers;
mod health;
mod http3;
mod lifecycle;
mod plugins_access;
mod plugins_ai;
mod plugins_ai_cache;
mod plugins_ai_guards;
mod plugins_apis;
mod plugins_chaitin_waf;
mod plugins_dubbo;
mod plugins_echo;
mod plugins_error_page;
mod plugins_http;
mod plugins_kafka;
mod plugins_limit_count;
mod plugins_limit_req_conn;
mod plugins_log_rotate;
mod plugins_loggers;
mod plugins_long_tail;
mod plugins_mcp;
mod plugins_observe_more;
mod plugins_opentelemetry;
mod plugins_prometheus;
mod plugins_proxy_cache;
mod plugins_sso;
mod plugins_transform;
mod plugins_zipkin;
mod prometheus_scrape;
mod proxy_protocol;
mod pubsub_kafka;
mod reload;
mod restart;
mod retries;
mod routing;
mod secrets;
mod security;
mod standalone_api;
mod stream;
mod stream_mqtt;
mod stream_xrpc;
mod streaming;
mod tls;
mod tls_etcd;
mod tls_ocsp;
mod wasm;
mod wasm_ports;
