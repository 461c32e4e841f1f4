//! Support shared by several plugin families: the AI plugins' providers, protocols and
//! calls (`ai`), the Redis connections of the limit plugins'
//! `redis`, `redis-cluster` and `redis-sentinel` policies, what the auth plugins share, the
//! regexes of plugin confs (PCRE's syntax on a linear-time engine), header edits with `$var`
//! values, nginx's URI escapes, and the tracing plugins' ids, clock and collector export
//! (`resty.roundrobin` is the plugin API's, shared with the upstream balancer).

pub mod ai;
pub mod auth;
pub mod encoding;
pub mod headers;
pub mod ip;
pub mod pcre;
pub mod redis;
pub mod stream_sub;
pub mod trace;
pub mod uri;
