//! Rate and concurrency limits: limit-count (fixed and sliding windows), limit-req (leaky
//! bucket), limit-conn (requests in flight), graphql-limit-count (limit-count charging a
//! GraphQL query its depth), each local to the gateway or shared in Redis.

family! {
    graphql_limit_count,
    limit_conn,
    limit_count,
    limit_req,
}
