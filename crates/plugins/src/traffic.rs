//! Traffic control: splitting traffic between upstreams (traffic-split), injecting faults
//! (fault-injection), breaking the circuit to failing upstreams (api-breaker) and shadowing
//! requests to another host (proxy-mirror), running actions by rule (workflow) and labelling
//! requests with headers (traffic-label), and sending a batch of requests back through the gateway
//! (batch-requests); the credentials of a kafka upstream's pub-sub connection (kafka-proxy).

family! {
    traffic_split,
    fault_injection,
    api_breaker,
    proxy_mirror,
    workflow,
    traffic_label,
    batch_requests,
    kafka_proxy,
}
