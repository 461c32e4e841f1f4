//! key-auth (`apisix/plugins/key-auth.lua`): the key in the `header` (default `apikey`),
//! else in the `query` argument (default `apikey`), names a consumer's credential. Without a
//! key, or with one no consumer has, the answer is 401 with the `WWW-Authenticate: apikey
//! realm="<realm>"` challenge, unless `anonymous_consumer` names the consumer to go on as.
//! `hide_credentials` takes the key out of the request before it goes upstream.
//!
//! The key is looked up in the snapshot's consumer index (one hash lookup on the key itself:
//! the map compares the full key, so a near miss costs what any miss costs).

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Step};
use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::support::auth::{
    anonymous_consumer_schema, anonymous_or_401, challenge, hide_query_arg, realm_schema,
};

pub const NAME: &str = "key-auth";

pub static DEF: PluginDef = PluginDef::new(NAME, 2500, schema, compile).with_credentials(
    consumer_schema,
    &["key"],
    "key",
    None,
);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header": {"type": "string", "default": "apikey"},
            "query": {"type": "string", "default": "apikey"},
            "realm": realm_schema("key"),
            "hide_credentials": {"type": "boolean", "default": false},
            "anonymous_consumer": anonymous_consumer_schema()
        }
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"]
    })
}

#[derive(Debug)]
struct KeyAuth {
    header: Option<HeaderName>,
    query: String,
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
    challenge: Option<HeaderValue>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let text = |name: &str| conf.get(name).and_then(Value::as_str).map(str::to_owned);
    let header = text("header").unwrap_or_else(|| "apikey".into());
    Ok(Arc::new(KeyAuth {
        // A name no request can carry matches nothing (APISIX's header lookup finds none).
        header: HeaderName::from_bytes(header.as_bytes()).ok(),
        query: text("query").unwrap_or_else(|| "apikey".into()),
        hide_credentials: conf.get("hide_credentials").and_then(Value::as_bool) == Some(true),
        anonymous_consumer: text("anonymous_consumer"),
        challenge: challenge("apikey", &text("realm").unwrap_or_else(|| "key".into())),
    }))
}

/// Where the key came from.
enum Found {
    Header,
    Query,
}

impl KeyAuth {
    fn fail(&self, ctx: &mut PluginCtx<'_>, msg: &str) -> Step<'static> {
        if self.anonymous_consumer.is_some() && self.hide_credentials {
            // An invalid credential is not forwarded with the anonymous consumer either.
            if let Some(h) = &self.header {
                ctx.headers_mut().remove(h);
            }
            if ctx.arg(&self.query).is_some() {
                hide_query_arg(ctx, &self.query);
            }
        }
        let anonymous_consumer = self.anonymous_consumer.as_deref();
        match anonymous_or_401(ctx, NAME, anonymous_consumer, msg, self.challenge.as_ref()) {
            Ok(()) => Step::CONTINUE,
            Err(exit) => Step::exit(exit),
        }
    }
}

impl Plugin for KeyAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let from_header = self
            .header
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let (key, found) = match from_header {
            Some(k) => (k, Found::Header),
            None => match ctx.arg(&self.query) {
                Some(k) => (k.into_owned(), Found::Query),
                None => return self.fail(ctx, "Missing API key in request"),
            },
        };
        let Some(cred) = ctx.find_credential(NAME, &key).cloned() else {
            // The key is not logged: it may be a mistyped real one.
            tracing::warn!("failed to find consumer: invalid api key");
            return self.fail(ctx, "Invalid API key in request");
        };
        if self.hide_credentials {
            match found {
                Found::Header => {
                    if let Some(h) = &self.header {
                        ctx.headers_mut().remove(h);
                    }
                }
                Found::Query => hide_query_arg(ctx, &self.query),
            }
        }
        ctx.attach_consumer(cred.consumer.clone());
        Step::CONTINUE
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{Consumer, ConsumerIndex, Credential, Flow};

    use super::*;
    use crate::testing::Compiler;

    fn index() -> Arc<ConsumerIndex> {
        let mut index = ConsumerIndex::default();
        for (name, key, cred) in [("jack", "k-jack", None), ("rose", "k-rose", Some("c1"))] {
            let consumer = Arc::new(Consumer {
                username: name.into(),
                credential_id: cred.map(str::to_owned),
                ..Default::default()
            });
            index.add_consumer(consumer.clone());
            index.add_credential(
                NAME,
                key.into(),
                Credential {
                    consumer,
                    conf: json!({"key": key}),
                    prepared: None,
                },
            );
        }
        index.add_consumer(Arc::new(Consumer {
            username: "anon".into(),
            ..Default::default()
        }));
        Arc::new(index)
    }

    fn run(conf: Value, mut req: TestRequest) -> (Flow, TestRequest) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ka", None)).unwrap();
        req.state.set_consumers(index());
        let flow = match p.rewrite(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(_) => panic!("key-auth does not wait"),
        };
        (flow, req)
    }

    fn exit_body(flow: &Flow) -> (u16, String) {
        match flow {
            Flow::Exit(e) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Flow::Continue => (0, String::new()),
        }
    }

    #[test]
    fn header_then_query_and_rejections() {
        let (flow, req) = run(json!({}), TestRequest::get("/").header("apikey", "k-jack"));
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "jack");
        assert!(req.headers.get("x-credential-identifier").is_none());
        assert_eq!(
            req.headers["apikey"], "k-jack",
            "kept without hide_credentials"
        );

        let (flow, req) = run(json!({}), TestRequest::get("/?apikey=k-rose"));
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-credential-identifier"], "c1");
        assert_eq!(req.state.consumer().unwrap().username, "rose");

        let (flow, _) = run(json!({}), TestRequest::get("/"));
        assert_eq!(
            exit_body(&flow),
            (401, "{\"message\":\"Missing API key in request\"}\n".into())
        );
        let Flow::Exit(e) = flow else { unreachable!() };
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "apikey realm=\"key\""));
        let (flow, _) = run(json!({}), TestRequest::get("/").header("apikey", "k-jac"));
        assert_eq!(
            exit_body(&flow),
            (401, "{\"message\":\"Invalid API key in request\"}\n".into())
        );
        // A client cannot pass its own consumer headers.
        let (_, req) = run(
            json!({}),
            TestRequest::get("/")
                .header("apikey", "k-jack")
                .header("x-credential-identifier", "forged"),
        );
        assert!(req.headers.get("x-credential-identifier").is_none());
    }

    #[test]
    fn custom_names_hide_credentials_and_realm() {
        let conf = json!({"header": "X-Key", "query": "k", "hide_credentials": true,
            "realm": "mine"});
        let (flow, _) = run(
            conf.clone(),
            TestRequest::get("/").header("apikey", "k-jack"),
        );
        let Flow::Exit(e) = flow else {
            panic!("the default header no longer counts")
        };
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "www-authenticate" && v == "apikey realm=\"mine\""));
        let (flow, mut req) = run(
            conf.clone(),
            TestRequest::get("/").header("x-key", "k-jack"),
        );
        assert_eq!(flow, Flow::Continue);
        assert!(req.headers.get("x-key").is_none());
        let (flow, mut qreq) = run(conf, TestRequest::get("/p?k=k-jack&keep=1"));
        assert_eq!(flow, Flow::Continue);
        assert_eq!(qreq.ctx().upstream_uri(), "/p?keep=1");
        assert_eq!(req.ctx().upstream_uri(), "/");
    }

    #[test]
    fn anonymous_consumer() {
        let (flow, req) = run(
            json!({"anonymous_consumer": "anon", "hide_credentials": true}),
            TestRequest::get("/").header("apikey", "bad"),
        );
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "anon");
        assert!(req.headers.get("apikey").is_none());
        let (flow, _) = run(
            json!({"anonymous_consumer": "nobody"}),
            TestRequest::get("/"),
        );
        assert_eq!(
            exit_body(&flow),
            (401, "{\"message\":\"Invalid user authorization\"}\n".into())
        );
    }

    #[test]
    fn schemas() {
        let c = Compiler::new();
        let r = &c.registry;
        assert!(r.check(NAME, &json!({"header": "h"})).is_ok());
        assert!(r.check(NAME, &json!({"realm": "a\"b"})).is_err());
        assert_eq!(
            r.check_consumer(NAME, &json!({})),
            Err("failed to check the configuration of plugin key-auth err: property \"key\" is required".into())
        );
        let info = r.get(NAME).unwrap();
        assert_eq!(info.plugin_type, Some("auth"));
        assert_eq!(info.priority, 2500);
    }
}
