//! Rate and concurrency limits: limit-count (fixed and sliding windows), limit-req (leaky
//! bucket), limit-conn (requests in flight), each local to the gateway or shared in Redis.

family! {
    limit_conn,
    limit_count,
    limit_req,
}
