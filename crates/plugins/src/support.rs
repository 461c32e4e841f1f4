//! Support shared by several plugins: the Redis connections of the limit plugins' `redis`,
//! `redis-cluster` and `redis-sentinel` policies, and what the auth plugins share.

pub mod auth;
pub mod redis;
