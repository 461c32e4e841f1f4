//! APISIX's `serverless/generic-upstream.lua`, which aws-lambda, azure-functions and
//! openfunction are made of: in the access phase the client's request (its method, headers
//! without `Content-Length`/`Transfer-Encoding`, query and body up to `max_req_body_size`)
//! is sent to `function_uri`, the path followed by what the route's `*` matched, `Host`
//! the function's host; the plugin's processor adds its authorization; the function's
//! answer (status, headers but the hop-by-hop ones, body) ends the request. A body that
//! cannot be read is answered 400, a function that cannot be reached within `timeout` ms
//! 503. `ssl_verify` for `https` functions; the connection is kept for the next call at most
//! `keepalive_timeout` ms idle among `keepalive_pool` idle ones, or with `keepalive: false`
//! closed after the call (`Connection: close` asks the function to close it too).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_plugin_api::{
    CompileCtx, Exit, Flow, KeepAlive, Phases, Plugin, PluginCtx, PluginServices, Step,
};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use serde_json::{json, Value};

/// The generic schema with the plugin's `authorization` schema.
pub fn schema(authorization: Option<Value>) -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67_108_864,
                "description": "maximum request body size in bytes buffered into memory; larger request bodies are rejected"},
            "function_uri": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 100, "default": 3000},
            "ssl_verify": {"type": "boolean", "default": true},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
        },
        "required": ["function_uri"]
    });
    if let Some(a) = authorization {
        s["properties"]["authorization"] = a;
    }
    s
}

/// The request to the function, as the processor may change it (APISIX's `params`).
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    /// The path sent (the function's, plus the route's wildcard part).
    pub path: String,
    /// The query string sent as it is (`None`: none).
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A plugin's additions to the call (its authorization).
pub type Processor = Box<dyn Fn(&mut Call) + Send + Sync>;

/// One conf of a function-calling plugin.
pub struct FunctionCall {
    name: &'static str,
    /// `scheme://authority` of `function_uri`.
    origin: String,
    /// `function_uri`'s host, sent as `Host`.
    host: HeaderValue,
    path: String,
    max_req_body_size: usize,
    timeout: Duration,
    ssl_verify: bool,
    /// `keepalive*`: how the connection is kept for the next call (`None`: closed).
    keepalive: Option<KeepAlive>,
    services: Arc<PluginServices>,
    processor: Processor,
}

/// Compiles the conf of plugin `name` with its `processor`.
pub fn compile(
    cx: &CompileCtx<'_>,
    name: &'static str,
    processor: Processor,
) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = conf
        .get("function_uri")
        .and_then(Value::as_str)
        .unwrap_or("");
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("invalid function_uri {text}: {e}"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(format!("invalid function_uri {text}: no scheme and host"));
    };
    let host = uri.host().unwrap_or("");
    let int = |k: &str, d: u64| conf.get(k).and_then(Value::as_u64).unwrap_or(d);
    Ok(Arc::new(FunctionCall {
        name,
        origin: format!("{scheme}://{authority}"),
        host: HeaderValue::from_str(host).map_err(|_| format!("invalid host {host}"))?,
        path: if uri.path().is_empty() {
            "/".into()
        } else {
            uri.path().to_owned()
        },
        max_req_body_size: usize::try_from(int("max_req_body_size", 67_108_864))
            .unwrap_or(usize::MAX),
        timeout: Duration::from_millis(int("timeout", 3000)),
        ssl_verify: conf.get("ssl_verify").and_then(Value::as_bool) != Some(false),
        keepalive: conf.as_object().and_then(|c| KeepAlive::of_conf(c, 5)),
        services: cx.services.clone(),
        processor,
    }))
}

/// The part of `uri` the route pattern's trailing `*` matched (radixtree's `:ext`).
fn wildcard_part<'a>(pattern: &str, uri: &'a str) -> Option<&'a str> {
    let prefix = pattern.strip_suffix('*')?;
    uri.strip_prefix(prefix)
}

/// `path` with the wildcard part appended as APISIX joins them.
pub fn join_path(path: &str, ext: Option<&str>) -> String {
    match ext {
        None => path.to_owned(),
        Some(ext) if path.ends_with('/') || ext.starts_with('/') => format!("{path}{ext}"),
        Some(ext) => format!("{path}/{ext}"),
    }
}

/// Response headers a proxy does not pass on (the body is sent whole, with its length).
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "transfer-encoding",
    "content-length",
];

/// The function's answer as the client's.
pub fn answer(resp: http::Response<Bytes>) -> Exit {
    let (head, body) = resp.into_parts();
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (k, v) in &head.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            headers.push((k.clone(), v.clone()));
        }
    }
    Exit {
        status: head.status,
        body: Some(body),
        headers,
    }
}

impl FunctionCall {
    async fn run(&self, ctx: &mut PluginCtx<'_>) -> Flow {
        let body = match ctx.read_body(self.max_req_body_size).await {
            Ok(b) => b.clone(),
            Err(e) => {
                tracing::error!("error while reading request body: {e}");
                return Flow::Exit(Exit::status(StatusCode::BAD_REQUEST));
            }
        };
        let mut headers = ctx.headers().clone();
        headers.remove(header::TRANSFER_ENCODING);
        headers.remove(header::CONTENT_LENGTH);
        headers.insert(header::HOST, self.host.clone());
        let ext = wildcard_part(ctx.matched_uri(), ctx.uri());
        let mut call = Call {
            method: ctx.method().clone(),
            path: join_path(&self.path, ext),
            query: ctx.query().filter(|q| !q.is_empty()).map(str::to_owned),
            headers,
            body,
        };
        (self.processor)(&mut call);
        if self.keepalive.is_none() {
            call.headers
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let url = match &call.query {
            Some(q) => format!("{}{}?{q}", self.origin, call.path),
            None => format!("{}{}", self.origin, call.path),
        };
        let mut req = match Request::builder()
            .method(call.method)
            .uri(url)
            .body(call.body)
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("failed to process {}, err: {e}", self.name);
                return Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE));
            }
        };
        *req.headers_mut() = call.headers;
        match self
            .services
            .http()
            .send_kept(req, self.timeout, self.ssl_verify, self.keepalive)
            .await
        {
            Ok(resp) => Flow::Exit(answer(resp)),
            Err(e) => {
                tracing::error!("failed to process {}, err: {e}", self.name);
                Flow::Exit(Exit::status(StatusCode::SERVICE_UNAVAILABLE))
            }
        }
    }
}

impl Plugin for FunctionCall {
    fn phases(&self) -> Phases {
        Phases::ACCESS
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.run(ctx)))
    }
}

/// A function platform for the family's tests: answers every request with 200, the request
/// it got as JSON (`method`, `path`, `query`, `headers`, `body`), and the header
/// `x-fn: called`; a path ending in `/fail` gets 500.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::SocketAddr;

    use ferrisix_plugin_api::testing::TestRequest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    pub async fn platform(answer: fn(&Value) -> (u16, String)) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let n = conn.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&got[..end]).into_owned();
                        let mut lines = head.split("\r\n");
                        let line: Vec<&str> = lines.next().unwrap().split(' ').collect();
                        let mut headers = serde_json::Map::new();
                        let mut len = 0;
                        for l in lines {
                            let (k, v) = l.split_once(": ").unwrap();
                            let k = k.to_ascii_lowercase();
                            if k == "content-length" {
                                len = v.parse().unwrap();
                            }
                            headers.insert(k, Value::String(v.to_owned()));
                        }
                        if got.len() < end + 4 + len {
                            continue;
                        }
                        let body =
                            String::from_utf8_lossy(&got[end + 4..end + 4 + len]).into_owned();
                        got.drain(..end + 4 + len);
                        let (path, query) = line[1].split_once('?').unwrap_or((line[1], ""));
                        let seen = json!({"method": line[0], "path": path, "query": query,
                            "headers": headers, "body": body});
                        let (status, body) = answer(&seen);
                        let resp = format!(
                            "HTTP/1.1 {status} X\r\nx-fn: called\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Echoes what it got.
    pub fn echo(seen: &Value) -> (u16, String) {
        (200, seen.to_string())
    }

    /// Runs `p`'s access phase for `req`: the exit it answered with.
    pub async fn call(p: &dyn Plugin, mut req: TestRequest) -> Exit {
        let flow = match p.access(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        match flow {
            Flow::Exit(e) => e,
            Flow::Continue => panic!("the function answers"),
        }
    }

    /// The request the echoing platform saw, from its answer.
    pub fn seen(e: &Exit) -> Value {
        serde_json::from_slice(e.body.as_deref().unwrap()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_as_apisix_does() {
        assert_eq!(join_path("/api", Some("x/y")), "/api/x/y");
        assert_eq!(join_path("/api/", Some("x")), "/api/x");
        assert_eq!(join_path("/api", Some("/x")), "/api/x");
        assert_eq!(join_path("/api", None), "/api");
        assert_eq!(wildcard_part("/azure/*", "/azure/fn/a"), Some("fn/a"));
        assert_eq!(wildcard_part("/azure", "/azure"), None);
    }
}
