//! Support shared by several plugin families: the Redis connections of the limit plugins'
//! `redis`, `redis-cluster` and `redis-sentinel` policies, and `resty.roundrobin`.

pub mod redis;
pub mod roundrobin;
