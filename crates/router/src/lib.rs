//! APISIX-compatible route matching.
//!
//! `RouteTable` reproduces the observable semantics of APISIX's three HTTP routers
//! (`radixtree_host_uri`, `radixtree_uri`, `radixtree_uri_with_parameter`, all built on
//! lua-resty-radixtree): exact paths before prefixes, longest prefix first with fall-back to
//! shorter ones, host stage before the hostless stage, priority then insertion order within one
//! path entry, and per-candidate filters (methods, remote addresses, hosts, `vars` expressions).
//! It is pure: no I/O, no JSON. The caller builds `RouteEntry`s from its own model, compiles a
//! table once, and shares it immutably between threads; a lookup takes no lock and does not
//! allocate on the common path.
#![forbid(unsafe_code)]

pub mod expr;
mod methods;
mod path;
mod table;

pub use expr::{CmpOp, Expr, ExprValue, VarSource};
pub use methods::{Method, MethodSet};
pub use path::normalize_path;
pub use table::{Params, RequestInfo, RouteEntry, RouteMatch, RouteTable, RouterKind, TableError};
