//! hmac-auth (`apisix/plugins/hmac-auth.lua`, the 3.x scheme): `Authorization: Signature
//! keyId="..",algorithm="..",headers="..",signature=".."` names a consumer's credential by
//! `key_id`; the signature is the base64 HMAC (`hmac-sha1`, `hmac-sha256`, `hmac-sha512`,
//! limited to `allowed_algorithms`) with its `secret_key` of the signing string: the key id,
//! then `name: value` of each listed header (`@request-target` is `METHOD request-uri`), each
//! line ending in `\n`. The `Date` header must be within `clock_skew` seconds, every one of
//! `signed_headers` must be signed, and with `validate_request_body` the `Digest` header
//! must be `SHA-256=<base64 sha256 of the body>` (bodies over `max_req_body_size` get 413).
//! Failures are 401 with `WWW-Authenticate: hmac realm="<realm>"` unless `anonymous_consumer`
//! names the consumer to go on as; signatures are compared in constant time.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ferrisix_plugin_api::{
    BodyError, Clock, CompileCtx, Credential, Flow, Phases, Plugin, PluginCtx, PluginDef, Step,
};
use http::header::AUTHORIZATION;
use http::{HeaderValue, StatusCode};
use ring::hmac;
use serde_json::{json, Value};

use crate::support::auth::{
    anonymous, anonymous_consumer_schema, challenge, message_exit, realm_schema, secret_eq,
    unauthorized,
};

pub const NAME: &str = "hmac-auth";

const ALGORITHMS: [&str; 3] = ["hmac-sha1", "hmac-sha256", "hmac-sha512"];

pub static DEF: PluginDef = PluginDef::new(NAME, 2530, schema, compile).with_credentials(
    consumer_schema,
    &["secret_key"],
    "key_id",
    None,
);

fn schema() -> Value {
    json!({
        "type": "object",
        "title": "work with route or service object",
        "properties": {
            "allowed_algorithms": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "enum": ALGORITHMS},
                "default": ALGORITHMS
            },
            "clock_skew": {"type": "integer", "default": 300, "minimum": 1},
            "signed_headers": {
                "type": "array",
                "default": ["date"],
                "items": {"type": "string", "minLength": 1, "maxLength": 50}
            },
            "validate_request_body": {"type": "boolean", "default": false},
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67_108_864},
            "hide_credentials": {"type": "boolean", "default": false},
            "realm": realm_schema("hmac"),
            "anonymous_consumer": anonymous_consumer_schema()
        }
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "title": "work with consumer object",
        "properties": {
            "key_id": {"type": "string", "minLength": 1, "maxLength": 256},
            "secret_key": {"type": "string", "minLength": 1, "maxLength": 256}
        },
        "required": ["key_id", "secret_key"]
    })
}

struct HmacAuth {
    allowed_algorithms: Vec<String>,
    clock_skew: u64,
    signed_headers: Vec<String>,
    validate_request_body: bool,
    max_req_body_size: usize,
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
    challenge: Option<HeaderValue>,
    clock: Clock,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let strings = |name: &str| -> Vec<String> {
        conf.get(name)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    Ok(Arc::new(HmacAuth {
        allowed_algorithms: strings("allowed_algorithms"),
        clock_skew: conf
            .get("clock_skew")
            .and_then(Value::as_u64)
            .unwrap_or(300),
        signed_headers: strings("signed_headers"),
        validate_request_body: conf.get("validate_request_body").and_then(Value::as_bool)
            == Some(true),
        max_req_body_size: conf
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(67_108_864, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        hide_credentials: conf.get("hide_credentials").and_then(Value::as_bool) == Some(true),
        anonymous_consumer: conf
            .get("anonymous_consumer")
            .and_then(Value::as_str)
            .map(str::to_owned),
        challenge: challenge(
            "hmac",
            conf.get("realm").and_then(Value::as_str).unwrap_or("hmac"),
        ),
        clock: cx.services.clock().clone(),
    }))
}

/// The fields of the `Authorization: Signature ...` header.
#[derive(Debug, Default, PartialEq, Eq)]
struct Params {
    key_id: Option<String>,
    algorithm: Option<String>,
    signature: Option<String>,
    headers: Option<Vec<String>>,
}

/// APISIX's `retrieve_hmac_fields`: `key="value"` fields split at commas after `Signature`.
fn parse_params(auth: &str) -> Result<Params, &'static str> {
    let rest = auth
        .strip_prefix("Signature")
        .ok_or("Authorization header does not start with 'Signature'")?;
    let mut params = Params::default();
    // APISIX skips the one character after the prefix (the space).
    let rest = rest.get(1..).unwrap_or("");
    for field in rest.split(',').filter(|f| !f.is_empty()) {
        let field = field.trim_start();
        let Some((key, value)) = field.split_once("=\"") else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let Some(end) = value.find('"') else {
            continue;
        };
        let value = value[..end].to_owned();
        match key {
            "keyId" => params.key_id = Some(value),
            "algorithm" => params.algorithm = Some(value),
            "signature" => params.signature = Some(value),
            "headers" => params.headers = Some(value.split(' ').map(str::to_owned).collect()),
            _ => {}
        }
    }
    Ok(params)
}

/// Why a request is refused.
enum Refusal {
    /// The header could not be read: the reason is in the answer.
    Unreadable(&'static str),
    /// Anything after: the reason is only logged.
    Invalid(String),
    /// A definite status (413 for a body over the limit), with its message.
    Status(StatusCode, String),
}

fn sign(algorithm: &str, key: &[u8], message: &[u8]) -> Option<Vec<u8>> {
    let alg = match algorithm {
        "hmac-sha1" => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        "hmac-sha256" => hmac::HMAC_SHA256,
        "hmac-sha512" => hmac::HMAC_SHA512,
        _ => return None,
    };
    Some(
        hmac::sign(&hmac::Key::new(alg, key), message)
            .as_ref()
            .to_vec(),
    )
}

impl HmacAuth {
    /// Everything but the body digest; the credential it authenticates with and the
    /// `Digest` header.
    fn validate(&self, ctx: &PluginCtx<'_>) -> Result<(Arc<Credential>, Option<String>), Refusal> {
        let auth = ctx
            .headers()
            .get(AUTHORIZATION)
            .ok_or(Refusal::Unreadable("missing Authorization header"))?;
        let auth = String::from_utf8_lossy(auth.as_bytes());
        let params = parse_params(&auth).map_err(Refusal::Unreadable)?;
        let invalid = |m: &str| Refusal::Invalid(m.to_owned());
        let (Some(key_id), Some(signature)) = (&params.key_id, &params.signature) else {
            return Err(invalid("keyId or signature missing"));
        };
        let algorithm = params
            .algorithm
            .as_deref()
            .ok_or_else(|| invalid("algorithm missing"))?;
        let cred = ctx
            .find_credential(NAME, key_id)
            .cloned()
            .ok_or_else(|| invalid("Invalid key_id"))?;
        if !self.allowed_algorithms.iter().any(|a| a == algorithm) {
            return Err(invalid("Invalid algorithm"));
        }
        if self.clock_skew > 0 {
            let date = ctx
                .header("date")
                .ok_or_else(|| invalid("Date header missing. failed to validate clock skew"))?;
            let time =
                httpdate::parse_http_date(date).map_err(|_| invalid("Invalid GMT format time"))?;
            let then = time
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_secs();
            let now = self.clock.epoch_ms() / 1000;
            if now.abs_diff(then) > self.clock_skew {
                return Err(invalid("Clock skew exceeded"));
            }
        }
        let signed: &[String] = params.headers.as_deref().unwrap_or(&[]);
        for h in &self.signed_headers {
            if !signed.contains(h) {
                return Err(Refusal::Invalid(format!(
                    "expected header \"{h}\" missing in signing"
                )));
            }
        }
        let mut signing = String::with_capacity(128);
        signing.push_str(key_id);
        for h in signed {
            match ctx.header(&h.to_ascii_lowercase()) {
                Some(v) => {
                    signing.push('\n');
                    signing.push_str(h);
                    signing.push_str(": ");
                    signing.push_str(v);
                }
                None if h == "@request-target" => {
                    let uri = match ctx.request_uri() {
                        "" => "/",
                        u => u,
                    };
                    signing.push('\n');
                    signing.push_str(ctx.method().as_str());
                    signing.push(' ');
                    signing.push_str(uri);
                }
                None => {}
            }
        }
        signing.push('\n');
        let secret = cred.field("secret_key").unwrap_or_default();
        let expected = sign(algorithm, secret.as_bytes(), signing.as_bytes())
            .ok_or_else(|| invalid("Invalid algorithm"))?;
        let given = STANDARD.decode(signature).unwrap_or_default();
        if !secret_eq(&expected, &given) {
            return Err(invalid("Invalid signature"));
        }
        Ok((cred, ctx.header("digest").map(str::to_owned)))
    }

    /// `SHA-256=<base64>` of the body must be the `Digest` header.
    async fn check_body(
        &self,
        ctx: &mut PluginCtx<'_>,
        digest: Option<String>,
    ) -> Result<(), Refusal> {
        let digest = digest.ok_or_else(|| Refusal::Invalid("Invalid digest".into()))?;
        let too_large = |size: u64| {
            Refusal::Status(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request size {size} is greater than the maximum size {} allowed",
                    self.max_req_body_size
                ),
            )
        };
        if let Some(len) = ctx
            .header("content-length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > self.max_req_body_size as u64 {
                return Err(too_large(len));
            }
        }
        let body = match ctx.read_body(self.max_req_body_size).await {
            Ok(b) => b.clone(),
            Err(BodyError::TooLarge(n)) => return Err(too_large(n as u64)),
            Err(e) => return Err(Refusal::Status(StatusCode::BAD_REQUEST, e.to_string())),
        };
        let sum = ring::digest::digest(&ring::digest::SHA256, &body);
        let created = format!("SHA-256={}", STANDARD.encode(sum.as_ref()));
        if created != digest {
            return Err(Refusal::Invalid("Invalid digest".into()));
        }
        Ok(())
    }

    fn accept(&self, ctx: &mut PluginCtx<'_>, cred: &Credential) -> Flow {
        if self.hide_credentials {
            ctx.headers_mut().remove(AUTHORIZATION);
        }
        ctx.attach_consumer(cred.consumer.clone());
        Flow::Continue
    }

    fn refuse(&self, ctx: &mut PluginCtx<'_>, refusal: Refusal) -> Flow {
        let msg = match refusal {
            Refusal::Status(status, msg) => return Flow::Exit(message_exit(status, &msg)),
            Refusal::Unreadable(e) => {
                tracing::warn!("client request can't be validated: {e}");
                format!("client request can't be validated: {e}")
            }
            Refusal::Invalid(e) => {
                tracing::warn!("client request can't be validated: {e}");
                "client request can't be validated".to_owned()
            }
        };
        let Some(name) = &self.anonymous_consumer else {
            return Flow::Exit(unauthorized(&msg, self.challenge.as_ref()));
        };
        match anonymous(ctx, name) {
            Some(consumer) => {
                if self.hide_credentials {
                    ctx.headers_mut().remove(AUTHORIZATION);
                }
                ctx.attach_consumer(consumer);
                Flow::Continue
            }
            None => {
                tracing::error!("failed to get anonymous consumer {name}");
                Flow::Exit(unauthorized(
                    "Invalid user authorization",
                    self.challenge.as_ref(),
                ))
            }
        }
    }
}

impl Plugin for HmacAuth {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let (cred, digest) = match self.validate(ctx) {
            Ok(v) => v,
            Err(r) => return Step::Done(self.refuse(ctx, r)),
        };
        if !self.validate_request_body {
            return Step::Done(self.accept(ctx, &cred));
        }
        Step::Wait(Box::pin(async move {
            match self.check_body(ctx, digest).await {
                Ok(()) => self.accept(ctx, &cred),
                Err(r) => self.refuse(ctx, r),
            }
        }))
    }
}

/// Exits this plugin answers with, for the tests.
#[cfg(test)]
fn exit_message(e: &ferrisix_plugin_api::Exit) -> String {
    let v: Value = serde_json::from_slice(e.body.as_deref().unwrap_or_default()).unwrap();
    v["message"].as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::{PluginServices, RequestBody};

    use super::*;
    use crate::testing::{jack_and_anon, Compiler};

    const NOW: u64 = 1_700_000_000;

    fn date(offset: i64) -> String {
        httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs((NOW as i64 + offset) as u64))
    }

    fn signature(alg: &str, secret: &str, signing: &str) -> String {
        STANDARD.encode(sign(alg, secret.as_bytes(), signing.as_bytes()).unwrap())
    }

    async fn run(
        conf: Value,
        mut req: TestRequest,
        body: Option<&'static str>,
    ) -> (Flow, TestRequest) {
        let services = Arc::new(PluginServices::new(
            Default::default(),
            ferrisix_plugin_api::Executor::current(),
            Clock::manual(NOW * 1000),
        ));
        let c = Compiler::with(services);
        let p = (DEF.compile)(&c.cx(NAME, &conf, "hmac", None)).unwrap();
        req.state.set_consumers(jack_and_anon(
            NAME,
            "my-key",
            json!({"key_id": "my-key", "secret_key": "my-secret"}),
        ));
        if let Some(b) = body {
            req.state
                .set_body(RequestBody::Buffered(Bytes::from_static(b.as_bytes())));
        }
        let flow = match p.rewrite(&mut req.ctx()) {
            Step::Done(f) => f,
            Step::Wait(fut) => fut.await,
        };
        (flow, req)
    }

    fn signed(
        alg: &str,
        secret: &str,
        headers: &str,
        date: &str,
        extra: &[(&'static str, &str)],
    ) -> TestRequest {
        let mut signing = "my-key".to_owned();
        let mut req = TestRequest::get("/hello?a=1").header("date", date);
        for (n, v) in extra {
            req = req.header(n, v);
        }
        for h in headers.split(' ') {
            match h {
                "@request-target" => signing.push_str("\nGET /hello?a=1"),
                "date" => signing.push_str(&format!("\ndate: {date}")),
                other => {
                    let v = extra.iter().find(|(n, _)| *n == other).unwrap().1;
                    signing.push_str(&format!("\n{other}: {v}"));
                }
            }
        }
        signing.push('\n');
        let sig = signature(alg, secret, &signing);
        req.header(
            "authorization",
            &format!(
                "Signature keyId=\"my-key\",algorithm=\"{alg}\",headers=\"{headers}\",signature=\"{sig}\""
            ),
        )
    }

    fn message(flow: &Flow) -> (u16, String) {
        match flow {
            Flow::Continue => (200, String::new()),
            Flow::Exit(e) => (e.status.as_u16(), exit_message(e)),
        }
    }

    #[tokio::test]
    async fn signatures_of_every_algorithm() {
        for alg in ALGORITHMS {
            let req = signed(alg, "my-secret", "@request-target date", &date(0), &[]);
            let (flow, req) = run(json!({}), req, None).await;
            assert_eq!(flow, Flow::Continue, "{alg}");
            assert_eq!(req.headers["x-consumer-username"], "jack");
            assert!(req.headers.get("authorization").is_some());
        }
        let req = signed(
            "hmac-sha256",
            "my-secret",
            "date x-custom",
            &date(0),
            &[("x-custom", "v")],
        );
        let (flow, req) = run(
            json!({"hide_credentials": true, "signed_headers": ["x-custom"]}),
            req,
            None,
        )
        .await;
        assert_eq!(flow, Flow::Continue);
        assert!(req.headers.get("authorization").is_none());
    }

    #[tokio::test]
    async fn refusals() {
        let invalid = (401, "client request can't be validated".to_owned());
        let cases: Vec<(Value, TestRequest, (u16, String))> = vec![
            (
                json!({}),
                TestRequest::get("/"),
                (401, "client request can't be validated: missing Authorization header".into()),
            ),
            (
                json!({}),
                TestRequest::get("/").header("authorization", "Basic abc"),
                (
                    401,
                    "client request can't be validated: Authorization header does not start with 'Signature'".into(),
                ),
            ),
            (
                json!({}),
                signed("hmac-sha256", "wrong", "@request-target date", &date(0), &[]),
                invalid.clone(),
            ),
            (
                json!({}),
                signed("hmac-sha256", "my-secret", "@request-target date", &date(-301), &[]),
                invalid.clone(),
            ),
            (
                json!({"allowed_algorithms": ["hmac-sha512"]}),
                signed("hmac-sha256", "my-secret", "@request-target date", &date(0), &[]),
                invalid.clone(),
            ),
            (
                json!({}),
                signed("hmac-sha256", "my-secret", "@request-target", &date(0), &[]),
                invalid.clone(),
            ),
            (
                json!({}),
                TestRequest::get("/")
                    .header("date", &date(0))
                    .header("authorization", "Signature keyId=\"nobody\",algorithm=\"hmac-sha256\",headers=\"date\",signature=\"YQ==\""),
                invalid.clone(),
            ),
            (
                json!({}),
                TestRequest::get("/").header("authorization", "Signature algorithm=\"hmac-sha256\""),
                invalid.clone(),
            ),
        ];
        for (i, (conf, req, want)) in cases.into_iter().enumerate() {
            let (flow, _) = run(conf, req, None).await;
            assert_eq!(message(&flow), want, "case {i}");
            if let Flow::Exit(e) = &flow {
                assert!(e
                    .headers
                    .iter()
                    .any(|(n, v)| n == "www-authenticate" && v == "hmac realm=\"hmac\""));
            }
        }
        // The clock skew check is within the window either way.
        let req = signed(
            "hmac-sha256",
            "my-secret",
            "@request-target date",
            &date(299),
            &[],
        );
        assert_eq!(run(json!({}), req, None).await.0, Flow::Continue);
        // Anonymous consumer.
        let (flow, req) = run(
            json!({"anonymous_consumer": "anon"}),
            TestRequest::get("/"),
            None,
        )
        .await;
        assert_eq!(flow, Flow::Continue);
        assert_eq!(req.headers["x-consumer-username"], "anon");
    }

    #[tokio::test]
    async fn body_digest() {
        let body = "{\"a\":1}";
        let digest = format!(
            "SHA-256={}",
            STANDARD.encode(ring::digest::digest(&ring::digest::SHA256, body.as_bytes()).as_ref())
        );
        let conf = json!({"validate_request_body": true});
        let req = signed(
            "hmac-sha256",
            "my-secret",
            "date",
            &date(0),
            &[("digest", &digest)],
        );
        assert_eq!(run(conf.clone(), req, Some(body)).await.0, Flow::Continue);
        let req = signed(
            "hmac-sha256",
            "my-secret",
            "date",
            &date(0),
            &[("digest", &digest)],
        );
        assert_eq!(
            message(&run(conf.clone(), req, Some("{\"a\":2}")).await.0),
            (401, "client request can't be validated".into())
        );
        let req = signed("hmac-sha256", "my-secret", "date", &date(0), &[]);
        assert_eq!(message(&run(conf, req, Some(body)).await.0).0, 401);
        let req = signed(
            "hmac-sha256",
            "my-secret",
            "date",
            &date(0),
            &[("digest", &digest)],
        );
        let small = json!({"validate_request_body": true, "max_req_body_size": 3});
        assert_eq!(
            message(&run(small, req, Some(body)).await.0),
            (
                413,
                "request size 7 is greater than the maximum size 3 allowed".into()
            )
        );
    }

    #[test]
    fn header_fields() {
        let p = parse_params(
            "Signature keyId=\"k\",algorithm=\"hmac-sha1\",headers=\"a b\",signature=\"s=\"",
        )
        .unwrap();
        assert_eq!(p.key_id.as_deref(), Some("k"));
        assert_eq!(p.headers, Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(p.signature.as_deref(), Some("s="));
        assert!(parse_params("signature keyId=\"k\"").is_err());
        assert_eq!(parse_params("Signature").unwrap(), Params::default());
    }
}
