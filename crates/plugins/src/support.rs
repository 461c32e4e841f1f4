//! Support shared by several plugin families: the AI plugins' providers, protocols and
//! calls (`ai`), request arguments as Lua sees them, Apache Dubbo 2's wire protocol and
//! Hessian 2 (`dubbo`), JSONPath,
//! GraphQL documents, the Redis connections of the limit plugins'
//! `redis`, `redis-cluster` and `redis-sentinel` policies, the instance of plugins that do nothing per request, what the auth plugins share, the
//! checks of user-written JSON schemas, the regexes of plugin confs (PCRE's syntax on a linear-time engine), header edits with `$var`
//! values, nginx's URI escapes, a small LDAP client (the ldap-auth plugins), lua-resty-session's cookie sessions (the login plugins), and the tracing plugins' ids, clock and collector export
//! (`resty.roundrobin` is the plugin API's, shared with the upstream balancer).

pub mod ai;
pub mod args;
pub mod auth;
pub mod cloud;
pub mod dubbo;
pub mod encoding;
pub mod graphql;
pub mod headers;
pub mod inert;
pub mod ip;
pub mod jsonpath;
pub mod ldap;
pub mod limit;
pub mod pcre;
pub mod redis;
pub mod schema_check;
pub mod session;
pub mod stream_sub;
pub mod trace;
pub mod uri;
