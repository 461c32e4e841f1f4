//! mcp-bridge (`apisix/plugins/mcp-bridge.lua`, with `apisix/plugins/mcp/`): bridges a client
//! speaking the Model Context Protocol over SSE (protocol revision 2024-11-05) to an MCP server
//! on stdio, a `command` with `args` the gateway starts once per SSE session.
//!
//! In the access phase, the URI (`$uri`) is matched against `^<base_uri>/(.*)` (`base_uri` is a
//! regex prefix, as APISIX splices it into `ngx.re.match`):
//!
//! - `GET <base_uri>/sse` opens a session: the process is started, the answer is an event
//!   stream whose first event (`endpoint`) announces `<base_uri>/message?sessionId=<uuid>`,
//!   then a `ping` request (`ping:<n>`) at once and every 30 seconds, each line the process
//!   writes on stdout as a `message` event, and each line on stderr as a
//!   `notifications/stderr` notification;
//! - `POST <base_uri>/message?sessionId=<id>` hands the body (one JSON-RPC message, not
//!   parsed) to that session's process as one stdin line and answers 202; an empty body is
//!   400; a session that does not exist (or no `sessionId`) still gets 202, the message going
//!   nowhere, as APISIX pushes it to a queue nobody reads;
//! - anything else under the route is 404.
//!
//! The session ends when the client goes away (the stream's body is dropped, or a ping cannot
//! be sent), when the process closes its stdout and stderr, or when the gateway shuts down:
//! the process's stdin is closed, it gets a while to exit, then SIGKILL, and it is always
//! waited for, so no process is left behind, running or unreaped.

use std::sync::Arc;

use ferrisix_plugin_api::{
    BodyError, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step,
};
use http::{header, HeaderValue, Method, StatusCode};
use regex::Regex;
use serde_json::{json, Value};

use crate::support::pcre;

mod session;

use session::{Bridge, Sessions};

pub const NAME: &str = "mcp-bridge";

pub static DEF: PluginDef = PluginDef::new(NAME, 510, schema, compile);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "base_uri": {"type": "string", "minLength": 1, "default": ""},
            "command": {"type": "string", "minLength": 1},
            "args": {"type": "array", "items": {"type": "string"}, "minItems": 0}
        },
        "required": ["command"]
    })
}

struct McpBridge {
    base_uri: String,
    /// `^<base_uri>/(.*)`; `None` when `base_uri` is not a valid regex, which APISIX's
    /// `ngx.re.match` fails on at every request (answered 404).
    matcher: Option<Regex>,
    bridge: Bridge,
    sessions: Arc<Sessions>,
}

impl std::fmt::Debug for McpBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpBridge")
            .field("base_uri", &self.base_uri)
            .field("command", &self.bridge.command)
            .finish()
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let base_uri = conf["base_uri"].as_str().unwrap_or_default().to_owned();
    let matcher = match pcre::compile(&format!("^{base_uri}/(.*)"), false) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!("mcp-bridge: base_uri {base_uri:?} is not a usable regex: {e}");
            None
        }
    };
    let command = conf["command"].as_str().unwrap_or_default().to_owned();
    let args = conf
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    Ok(Arc::new(McpBridge {
        base_uri,
        matcher,
        bridge: Bridge {
            command,
            args,
            executor: cx.services.executor().clone(),
            shutdown: cx.services.shutdown().clone(),
        },
        sessions: cx.services.shared::<Sessions>(),
    }))
}

/// What the URI asks for.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Sse,
    Message,
    NotFound,
}

impl McpBridge {
    fn action(&self, method: &Method, uri: &str) -> Action {
        let Some(caps) = self.matcher.as_ref().and_then(|m| m.captures(uri)) else {
            return Action::NotFound;
        };
        match (caps.get(1).map_or("", |m| m.as_str()), method) {
            ("sse", &Method::GET) => Action::Sse,
            ("message", &Method::POST) => Action::Message,
            _ => Action::NotFound,
        }
    }

    fn open(&self, ctx: &mut PluginCtx<'_>) -> Exit {
        let session = match self.bridge.open(&self.sessions, &self.base_uri) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("failed to spawn mcp process: {e}");
                return Exit::status(StatusCode::INTERNAL_SERVER_ERROR);
            }
        };
        ctx.set_exit_stream(Box::pin(session));
        Exit::status(StatusCode::OK)
            .with_header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            )
            .with_header(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"))
    }

    async fn message(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let id = ctx.arg("sessionId").map(|s| s.into_owned());
        let body = match ctx.read_body(usize::MAX).await {
            Ok(b) if !b.is_empty() => b.clone(),
            Ok(_) => return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST)),
            Err(e @ (BodyError::Broken(_) | BodyError::Timeout | BodyError::TooLarge(_))) => {
                tracing::info!("mcp-bridge: {e}");
                return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
            }
        };
        match self.sessions.push(id.as_deref(), body) {
            Ok(()) => Flow::Exit(Exit::status(StatusCode::ACCEPTED)),
            Err(e) => {
                tracing::error!("failed to add task to queue: {e}");
                Flow::Exit(Exit::status(StatusCode::INTERNAL_SERVER_ERROR))
            }
        }
    }
}

impl Plugin for McpBridge {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match self.action(ctx.method(), ctx.uri()) {
            Action::Sse => Step::exit(self.open(ctx)),
            Action::Message => Step::Wait(Box::pin(self.message(ctx))),
            Action::NotFound => Step::exit(Exit::status(StatusCode::NOT_FOUND)),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::registry::PluginRegistry;
    use crate::testing::Compiler;

    fn check(conf: Value) -> Result<(), String> {
        PluginRegistry::builtin().check(NAME, &conf)
    }

    #[test]
    fn schema_as_apisix_checks_it() {
        assert!(check(json!({"command": "npx"})).is_ok());
        assert!(check(json!({"command": "npx", "args": ["-y", "test"]})).is_ok());
        let e = check(json!({})).unwrap_err();
        assert!(e.contains("property \"command\" is required"), "{e}");
        let e = check(json!({"command": 123})).unwrap_err();
        assert!(
            e.contains(
                "property \"command\" validation failed: wrong type: expected string, got number"
            ),
            "{e}"
        );
        let e = check(json!({"command": "npx", "args": "test"})).unwrap_err();
        assert!(
            e.contains(
                "property \"args\" validation failed: wrong type: expected array, got string"
            ),
            "{e}"
        );
        assert!(check(json!({"command": ""})).is_err());
        assert!(check(json!({"command": "x", "base_uri": ""})).is_err());
    }

    fn plugin(conf: Value) -> Arc<dyn Plugin> {
        let c = Compiler::new();
        (DEF.compile)(&c.cx(NAME, &conf, "r1", None)).unwrap()
    }

    fn exit_of(p: &Arc<dyn Plugin>, method: &str, uri: &str) -> Option<Exit> {
        let mut req = TestRequest::new(method.parse().unwrap(), uri);
        let out = match p.access(&mut req.ctx()) {
            Step::Done(Flow::Exit(e)) => Some(e),
            _ => None,
        };
        out
    }

    #[test]
    fn only_the_two_endpoints_under_base_uri_answer() {
        let p = plugin(json!({"command": "true", "base_uri": "/mcp"}));
        for (method, uri) in [
            ("GET", "/mcp"),
            ("GET", "/mcp/"),
            ("POST", "/mcp/sse"),
            ("GET", "/mcp/message"),
            ("GET", "/mcp/sse/x"),
            ("GET", "/other/sse"),
            ("GET", "/x/mcp/sse"),
        ] {
            let e = exit_of(&p, method, uri).expect("answered now");
            assert_eq!(e.status, 404, "{method} {uri}");
            assert_eq!(e.body, None);
        }
        // The base is a regex prefix, as APISIX splices it into the pattern.
        let p = plugin(json!({"command": "true", "base_uri": "/m.p"}));
        assert_eq!(exit_of(&p, "GET", "/mxp/nothing").unwrap().status, 404);
        // A base that is no regex answers 404 to everything.
        let p = plugin(json!({"command": "true", "base_uri": "/m("}));
        assert_eq!(exit_of(&p, "GET", "/m(/sse").unwrap().status, 404);
    }

    #[test]
    fn actions() {
        let bridge = |base: &str| McpBridge {
            base_uri: base.into(),
            matcher: pcre::compile(&format!("^{base}/(.*)"), false).ok(),
            bridge: Bridge {
                command: "true".into(),
                args: Vec::new(),
                executor: Default::default(),
                shutdown: Default::default(),
            },
            sessions: Arc::new(Sessions::default()),
        };
        let b = bridge("");
        assert_eq!(b.action(&Method::GET, "/sse"), Action::Sse);
        assert_eq!(b.action(&Method::POST, "/message"), Action::Message);
        assert_eq!(b.action(&Method::GET, "/a/sse"), Action::NotFound);
        let b = bridge("/m.p");
        assert_eq!(b.action(&Method::GET, "/mxp/sse"), Action::Sse);
        assert_eq!(b.action(&Method::POST, "/mcp/message"), Action::Message);
        assert_eq!(b.action(&Method::PUT, "/mcp/message"), Action::NotFound);
    }
}
