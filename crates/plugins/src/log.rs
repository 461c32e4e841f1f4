//! Loggers: each request's log entry (`log_entry`, APISIX's `log-util`) sent to a log
//! pipeline through a batch processor (`batch_processor`, APISIX's), one file per logger on
//! the shared `logger` core and the `sink` helpers (schemas, conf reading, TCP/TLS/UDP and
//! HTTP(S) sends); file-logger writes its own file through a writer task; log-rotate rotates
//! the gateway's own access and error logs.

pub mod batch_processor;
pub mod log_entry;
pub mod logger;
pub mod sink;

family! {
    data_mask,
    http_logger,
    tcp_logger,
    udp_logger,
    loki_logger,
    elasticsearch_logger,
    syslog,
    clickhouse_logger,
    file_logger,
    log_rotate,
    kafka_logger,
    splunk_hec_logging,
    loggly,
    datadog,
    skywalking_logger,
    sls_logger,
    tencent_cloud_cls,
    google_cloud_logging,
    error_log_logger,
    lago,
    rocketmq_logger,
}
