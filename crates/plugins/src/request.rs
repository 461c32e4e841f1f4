//! Plugins that shape how the gateway takes a request in: its size and buffering, the client's
//! real address, its id.

family! {
    client_control,
    proxy_control,
    real_ip,
    request_id,
}
