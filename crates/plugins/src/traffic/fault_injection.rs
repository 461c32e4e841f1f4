//! fault-injection (`apisix/plugins/fault-injection.lua`), in `rewrite` at priority 11000:
//! `delay` sleeps `duration` seconds, then `abort` answers `http_status` with `body` and
//! `headers` (both with `$var`s resolved), each when its `percentage` sample hits and one of
//! its `vars` expressions passes (no `vars`: always; an empty list: never, as APISIX's loop
//! leaves its result nil). Without `body`, a status below 300 is answered with no body and
//! one from 300 on with nginx's page, as `ngx.exit` answers them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrisix_config::schema::lua;
use ferrisix_config::vars::compile_vars;
use ferrisix_plugin_api::{
    CheckCtx, CompileCtx, Exit, Flow, Phases, Plugin, PluginCtx, PluginDef, Step, Template,
};
use ferrisix_router::Expr;
use http::{HeaderName, HeaderValue, StatusCode};
use rand::Rng;
use serde_json::{json, Value};

pub const NAME: &str = "fault-injection";

pub static DEF: PluginDef = PluginDef {
    check: Some(check),
    ..PluginDef::new(NAME, 11000, schema, compile)
};

fn vars_schema() -> Value {
    json!({"type": "array", "maxItems": 20, "items": {"type": "array"}})
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "abort": {
                "type": "object",
                "properties": {
                    "http_status": {"type": "integer", "minimum": 200},
                    "body": {"type": "string", "minLength": 0},
                    "headers": {
                        "type": "object",
                        "minProperties": 1,
                        "patternProperties": {
                            "^[^:]+$": {"oneOf": [{"type": "string"}, {"type": "number"}]}
                        }
                    },
                    "percentage": {"type": "integer", "minimum": 0, "maximum": 100},
                    "vars": vars_schema()
                },
                "required": ["http_status"]
            },
            "delay": {
                "type": "object",
                "properties": {
                    "duration": {"type": "number", "minimum": 0},
                    "percentage": {"type": "integer", "minimum": 0, "maximum": 100},
                    "vars": vars_schema()
                },
                "required": ["duration"]
            }
        },
        "minProperties": 1
    })
}

/// Each of `vars` as one expression; the error is lua-resty-expr's own (APISIX's check
/// returns it without the route's `vars` prefix).
fn compile_list(vars: Option<&Value>) -> Result<Option<Vec<Expr>>, String> {
    let Some(list) = vars.and_then(Value::as_array) else {
        return Ok(None);
    };
    list.iter()
        .map(|v| {
            compile_vars(v).map_err(|e| {
                e.strip_prefix("failed to validate the 'vars' expression: ")
                    .map_or(e.clone(), str::to_owned)
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn check(cx: &CheckCtx<'_>) -> Result<(), String> {
    compile_list(cx.conf.pointer("/abort/vars"))?;
    compile_list(cx.conf.pointer("/delay/vars"))?;
    Ok(())
}

/// When a fault applies.
#[derive(Debug)]
struct When {
    percentage: Option<u32>,
    vars: Option<Vec<Expr>>,
}

impl When {
    fn new(conf: &Value) -> Result<When, String> {
        Ok(When {
            percentage: conf
                .get("percentage")
                .and_then(Value::as_u64)
                .map(|p| p as u32),
            vars: compile_list(conf.get("vars"))?,
        })
    }

    fn vars_match(&self, ctx: &PluginCtx<'_>) -> bool {
        match &self.vars {
            None => true,
            Some(list) => list.iter().any(|e| e.eval(ctx)),
        }
    }

    /// `random(1, 100) <= percentage`.
    fn sample_hit(&self) -> bool {
        match self.percentage {
            None => true,
            Some(p) => rand::thread_rng().gen_range(1..=100) <= p,
        }
    }
}

#[derive(Debug)]
struct Abort {
    status: StatusCode,
    body: Option<Template>,
    headers: Vec<(HeaderName, HeaderValueSource)>,
    when: When,
}

#[derive(Debug)]
enum HeaderValueSource {
    Fixed(HeaderValue),
    Template(Template),
}

#[derive(Debug)]
struct Delay {
    duration: Duration,
    when: When,
}

#[derive(Debug)]
struct FaultInjection {
    abort: Option<Abort>,
    delay: Option<Delay>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.conf;
    let abort = match conf.get("abort") {
        None => None,
        Some(a) => {
            let code = a.get("http_status").and_then(Value::as_u64).unwrap_or(0);
            let status = u16::try_from(code)
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or_else(|| format!("invalid http_status {code}"))?;
            let mut headers = Vec::new();
            for (name, value) in a
                .get("headers")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                    tracing::warn!(header = name, "fault-injection: invalid header name");
                    continue;
                };
                let source = match value {
                    Value::String(s) => HeaderValueSource::Template(Template::parse(s)),
                    Value::Number(n) => match HeaderValue::from_str(&lua::json_number(n)) {
                        Ok(v) => HeaderValueSource::Fixed(v),
                        Err(_) => continue,
                    },
                    _ => continue,
                };
                headers.push((name, source));
            }
            Some(Abort {
                status,
                body: a.get("body").and_then(Value::as_str).map(Template::parse),
                headers,
                when: When::new(a)?,
            })
        }
    };
    let delay = match conf.get("delay") {
        None => None,
        Some(d) => Some(Delay {
            duration: Duration::try_from_secs_f64(
                d.get("duration").and_then(Value::as_f64).unwrap_or(0.0),
            )
            .map_err(|e| format!("invalid delay duration: {e}"))?,
            when: When::new(d)?,
        }),
    };
    Ok(Arc::new(FaultInjection { abort, delay }))
}

impl FaultInjection {
    fn abort_now(&self, ctx: &mut PluginCtx<'_>, abort_vars: bool) -> Flow {
        let Some(abort) = &self.abort else {
            return Flow::Continue;
        };
        if !(abort.when.sample_hit() && abort_vars) {
            return Flow::Continue;
        }
        // Without `body` APISIX returns the status with a nil body: `ngx.exit` of a status
        // below 300 sends the headers alone, from 300 on nginx's page for the status.
        let body = match &abort.body {
            Some(t) => Some(Bytes::from(t.resolve(&*ctx).text)),
            None if abort.status.as_u16() < 300 => Some(Bytes::new()),
            None => None,
        };
        let mut exit = Exit {
            status: abort.status,
            body,
            headers: Vec::new(),
        };
        for (name, value) in &abort.headers {
            let value = match value {
                HeaderValueSource::Fixed(v) => v.clone(),
                HeaderValueSource::Template(t) => {
                    match HeaderValue::from_str(&t.resolve(&*ctx).text) {
                        Ok(v) => v,
                        Err(_) => continue,
                    }
                }
            };
            exit.headers.push((name.clone(), value));
        }
        Flow::Exit(exit)
    }
}

impl Plugin for FaultInjection {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        // Both `vars` are evaluated before the delay, as APISIX does.
        let abort_vars = self.abort.as_ref().is_none_or(|a| a.when.vars_match(ctx));
        let delay = self
            .delay
            .as_ref()
            .filter(|d| d.when.sample_hit() && d.when.vars_match(ctx));
        match delay {
            None => Step::Done(self.abort_now(ctx, abort_vars)),
            Some(d) => Step::Wait(Box::pin(async move {
                tokio::time::sleep(d.duration).await;
                self.abort_now(ctx, abort_vars)
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;

    use super::*;
    use crate::testing::Compiler;

    async fn run(conf: Value, uri: &str) -> Flow {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "fi", None)).unwrap();
        let mut req = TestRequest::get(uri);
        let mut ctx = req.ctx();
        let flow = match p.rewrite(&mut ctx) {
            Step::Done(f) => f,
            Step::Wait(f) => f.await,
        };
        flow
    }

    fn exit(flow: Flow) -> Exit {
        match flow {
            Flow::Exit(e) => e,
            Flow::Continue => panic!("expected an abort"),
        }
    }

    #[tokio::test]
    async fn abort_with_body_headers_and_vars() {
        let e = exit(
            run(
                json!({"abort": {"http_status": 200, "body": "client addr: $remote_addr\n",
                    "headers": {"X-Fault": "$arg_name", "X-Num": 7}}}),
                "/hello?name=jack",
            )
            .await,
        );
        assert_eq!(e.status, 200);
        assert_eq!(e.body.unwrap(), "client addr: 127.0.0.1\n");
        assert_eq!(e.headers[0].1, "jack");
        assert_eq!(e.headers[1].1, "7");
        // Without a body: nginx's page for the status.
        let e = exit(run(json!({"abort": {"http_status": 403}}), "/").await);
        assert_eq!((e.status.as_u16(), e.body), (403, None));
        // vars: OR of the list, AND inside one expression.
        let conf = json!({"abort": {"http_status": 403, "vars": [
            [["arg_name", "==", "jack"], ["arg_age", "!", "<", 18]],
            [["http_apikey", "==", "api-key"]]]}});
        assert!(matches!(
            run(conf.clone(), "/?name=jack&age=20").await,
            Flow::Exit(_)
        ));
        assert_eq!(
            run(conf.clone(), "/?name=jack&age=10").await,
            Flow::Continue
        );
        assert_eq!(run(conf, "/?name=rose").await, Flow::Continue);
        // percentage 0 never hits; an empty vars list never matches.
        let conf = json!({"abort": {"http_status": 403, "percentage": 0}});
        assert_eq!(run(conf, "/").await, Flow::Continue);
        let conf = json!({"abort": {"http_status": 403, "vars": []}});
        assert_eq!(run(conf, "/").await, Flow::Continue);
    }

    /// APISIX's `abort` returns its status with a nil body when `body` is not set, and
    /// `ngx.exit` of a 2xx sends the headers alone (`t/plugin/fault-injection2.t` TEST 4-5);
    /// from 300 on nginx sends its page for the status.
    #[tokio::test]
    async fn abort_without_body_sends_no_page_below_300() {
        let conf = json!({"abort": {"http_status": 200,
            "headers": {"h1": "v1", "h2": 2, "h3": "$uri"}}});
        let e = exit(run(conf, "/hello").await);
        assert_eq!(e.status, 200);
        assert_eq!(
            e.body.as_deref(),
            Some(&b""[..]),
            "an empty body, not a page"
        );
        let headers: Vec<(&str, &str)> = e
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("h1", "v1"), ("h2", "2"), ("h3", "/hello")]);
        let e = exit(
            run(
                json!({"abort": {"http_status": 204, "headers": {"h1": "v1"}}}),
                "/",
            )
            .await,
        );
        assert_eq!(e.body.as_deref(), Some(&b""[..]));
        let e = exit(
            run(
                json!({"abort": {"http_status": 503, "headers": {"h1": "v1"}}}),
                "/",
            )
            .await,
        );
        assert_eq!(e.body, None, "nginx's page from 300 on");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_then_abort() {
        let start = tokio::time::Instant::now();
        let e = exit(
            run(
                json!({"delay": {"duration": 2.5}, "abort": {"http_status": 500, "body": "x"}}),
                "/",
            )
            .await,
        );
        assert_eq!(e.status, 500);
        assert_eq!(start.elapsed(), Duration::from_millis(2500));
        let start = tokio::time::Instant::now();
        let conf = json!({"delay": {"duration": 1, "vars": [[["arg_slow", "==", "1"]]]}});
        assert_eq!(run(conf.clone(), "/").await, Flow::Continue);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(run(conf, "/?slow=1").await, Flow::Continue);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let err = |c: Value| r.check(NAME, &c).unwrap_err();
        assert_eq!(err(json!({})), "failed to check the configuration of plugin fault-injection err: expect object to have at least 1 properties");
        assert_eq!(err(json!({"abort": {"http_status": 100}})), "failed to check the configuration of plugin fault-injection err: property \"abort\" validation failed: property \"http_status\" validation failed: expected 100 to be at least 200");
        assert_eq!(err(json!({"abort": {"body": "x"}})), "failed to check the configuration of plugin fault-injection err: property \"abort\" validation failed: property \"http_status\" is required");
        let e = err(json!({"abort": {"http_status": 200, "vars": [[["a", "=", "b"]]]}}));
        assert_eq!(
            e,
            "failed to check the configuration of plugin fault-injection err: invalid operator '='"
        );
        assert_eq!(r.get(NAME).unwrap().priority, 11000);
    }
}
