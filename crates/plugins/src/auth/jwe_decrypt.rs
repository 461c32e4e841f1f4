//! jwe-decrypt (`apisix/plugins/jwe-decrypt.lua`): the request's `header` (default
//! `Authorization`, `Bearer ` or `bearer ` stripped) carries a compact JWE
//! (`header.key.iv.ciphertext.tag`, base64url). Its header's `kid` names a consumer's
//! jwe-decrypt credential (`key`); the ciphertext is decrypted with AES-256-GCM under the
//! credential's `secret` (base64url-decoded first with `is_base64_encoded`), without
//! additional data as APISIX does it, and the plaintext replaces `forward_header` on the
//! request sent upstream. Answers: 403 "missing JWE token in request" (with `strict`, the
//! default; else the request goes on), 400 "JWE token invalid", "missing kid in JWE token",
//! "invalid kid in JWE token", "failed to decrypt JWE token".
//!
//! The secret must be 32 bytes; APISIX checks that only when the consumer's fields are not
//! stored encrypted, which its default deployment does, so a consumer with another length is
//! stored and its tokens fail to decrypt (400), as there.

use std::sync::Arc;

use base64::Engine;
use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, Prepared, Step};
use http::{HeaderName, HeaderValue, StatusCode};
use ring::aead;
use serde_json::{json, Value};

use crate::support::auth::message_exit;

pub const NAME: &str = "jwe-decrypt";

pub static DEF: PluginDef = PluginDef::new(NAME, 2509, schema, compile).with_credentials(
    consumer_schema,
    &["key", "secret"],
    "key",
    Some(prepare),
);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header": {"type": "string", "default": "Authorization"},
            "forward_header": {"type": "string", "default": "Authorization"},
            "strict": {"type": "boolean", "default": true}
        },
        "required": ["header", "forward_header"]
    })
}

fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"type": "string"},
            "secret": {"type": "string"},
            "is_base64_encoded": {"type": "boolean"}
        },
        "required": ["key", "secret"]
    })
}

/// A credential's AES-256-GCM key; `None` when its secret is not 32 bytes.
struct JweKey(Option<aead::LessSafeKey>);

fn prepare(conf: &Value) -> Result<Prepared, String> {
    let secret = conf
        .get("secret")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let bytes = if conf.get("is_base64_encoded").and_then(Value::as_bool) == Some(true) {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(secret.trim_end_matches('='))
            .unwrap_or_default()
    } else {
        secret.as_bytes().to_vec()
    };
    let key = aead::UnboundKey::new(&aead::AES_256_GCM, &bytes)
        .ok()
        .map(aead::LessSafeKey::new);
    Ok(Arc::new(JweKey(key)))
}

#[derive(Debug)]
struct JweDecrypt {
    header: Option<HeaderName>,
    forward_header: Option<HeaderName>,
    strict: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let name = |k: &str| {
        conf.get(k)
            .and_then(Value::as_str)
            .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok())
    };
    Ok(Arc::new(JweDecrypt {
        header: name("header"),
        forward_header: name("forward_header"),
        strict: conf.get("strict").and_then(Value::as_bool) != Some(false),
    }))
}

fn b64url(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()
}

/// Why a token is refused.
enum Refusal {
    Invalid,
    MissingKid,
    UnknownKid,
    Decrypt,
}

impl Refusal {
    fn message(&self) -> &'static str {
        match self {
            Refusal::Invalid => "JWE token invalid",
            Refusal::MissingKid => "missing kid in JWE token",
            Refusal::UnknownKid => "invalid kid in JWE token",
            Refusal::Decrypt => "failed to decrypt JWE token",
        }
    }
}

fn decrypt(ctx: &PluginCtx<'_>, token: &str) -> Result<Vec<u8>, Refusal> {
    let parts: Vec<&str> = token.splitn(5, '.').collect();
    let [header, _key, iv, ciphertext, tag] = parts[..] else {
        return Err(Refusal::Invalid);
    };
    let header = b64url(header).ok_or(Refusal::Invalid)?;
    let header: Value = serde_json::from_slice(&header).map_err(|_| Refusal::Invalid)?;
    let kid = match header.get("kid") {
        None | Some(Value::Null) => return Err(Refusal::MissingKid),
        Some(Value::String(k)) => k.as_str(),
        Some(_) => return Err(Refusal::UnknownKid),
    };
    let cred = ctx.find_credential(NAME, kid).ok_or(Refusal::UnknownKid)?;
    let key = cred
        .prepared::<JweKey>()
        .and_then(|k| k.0.as_ref())
        .ok_or(Refusal::Decrypt)?;
    let iv = b64url(iv).ok_or(Refusal::Decrypt)?;
    let nonce = aead::Nonce::try_assume_unique_for_key(&iv).map_err(|_| Refusal::Decrypt)?;
    let mut sealed = b64url(ciphertext).ok_or(Refusal::Decrypt)?;
    let tag = b64url(tag).ok_or(Refusal::Decrypt)?;
    if tag.len() != aead::AES_256_GCM.tag_len() {
        return Err(Refusal::Decrypt);
    }
    sealed.extend_from_slice(&tag);
    let plain = key
        .open_in_place(nonce, aead::Aad::empty(), &mut sealed)
        .map_err(|_| Refusal::Decrypt)?;
    Ok(plain.to_vec())
}

impl Plugin for JweDecrypt {
    fn phases(&self) -> Phases {
        Phases::REWRITE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let token = self
            .header
            .as_ref()
            .and_then(|h| ctx.headers().get(h))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let Some(token) = token else {
            if self.strict {
                return Step::exit(message_exit(
                    StatusCode::FORBIDDEN,
                    "missing JWE token in request",
                ));
            }
            return Step::CONTINUE;
        };
        let token = token
            .strip_prefix("Bearer ")
            .or_else(|| token.strip_prefix("bearer "))
            .unwrap_or(&token);
        let plain = match decrypt(ctx, token) {
            Ok(p) => p,
            Err(r) => {
                if matches!(r, Refusal::Decrypt) {
                    tracing::info!("failed to decrypt JWE token");
                }
                return Step::exit(message_exit(StatusCode::BAD_REQUEST, r.message()));
            }
        };
        let Ok(value) = HeaderValue::from_bytes(&plain) else {
            // A plaintext that cannot be a header value cannot be forwarded.
            return Step::exit(message_exit(
                StatusCode::BAD_REQUEST,
                Refusal::Decrypt.message(),
            ));
        };
        if let Some(h) = &self.forward_header {
            ctx.headers_mut().insert(h.clone(), value);
        }
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

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn seal(kid: Option<&str>, secret: &str, plain: &str) -> String {
        let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = match kid {
            Some(k) => json!({"alg": "dir", "kid": k, "enc": "A256GCM"}),
            None => json!({"alg": "dir", "enc": "A256GCM"}),
        };
        let iv = b"twelve-bytes";
        let key = aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::AES_256_GCM, secret.as_bytes()).unwrap(),
        );
        let mut data = plain.as_bytes().to_vec();
        let tag = key
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(*iv),
                aead::Aad::empty(),
                &mut data,
            )
            .unwrap();
        format!(
            "{}..{}.{}.{}",
            enc(header.to_string().as_bytes()),
            enc(iv),
            enc(&data),
            enc(tag.as_ref())
        )
    }

    fn run(conf: Value, req: TestRequest) -> (u16, String, TestRequest) {
        let mut req = req;
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "jwe", None)).unwrap();
        let mut index = ConsumerIndex::default();
        let jack = Arc::new(Consumer {
            username: "jack".into(),
            ..Default::default()
        });
        let cred = json!({"key": "k1", "secret": SECRET});
        index.add_credential(
            NAME,
            "k1".into(),
            Credential {
                consumer: jack,
                prepared: Some(prepare(&cred).unwrap()),
                conf: cred,
            },
        );
        req.state.set_consumers(Arc::new(index));
        let out = match p.rewrite(&mut req.ctx()) {
            Step::Done(Flow::Continue) => (200, String::new()),
            Step::Done(Flow::Exit(e)) => (
                e.status.as_u16(),
                String::from_utf8_lossy(e.body.as_deref().unwrap_or_default()).into_owned(),
            ),
            Step::Wait(_) => panic!("jwe-decrypt does not wait"),
        };
        (out.0, out.1, req)
    }

    fn msg(m: &str) -> String {
        format!("{{\"message\":\"{m}\"}}\n")
    }

    #[test]
    fn decrypts_and_forwards() {
        let conf = json!({"header": "Authorization", "forward_header": "X-Plain"});
        let token = seal(Some("k1"), SECRET, "claims");
        for value in [format!("Bearer {token}"), token.clone()] {
            let (status, _, req) = run(
                conf.clone(),
                TestRequest::get("/").header("authorization", &value),
            );
            assert_eq!(status, 200);
            assert_eq!(req.headers["x-plain"], "claims");
        }
        let (status, body, _) = run(conf.clone(), TestRequest::get("/"));
        assert_eq!((status, body), (403, msg("missing JWE token in request")));
        let lax = json!({"header": "Authorization", "forward_header": "X-Plain", "strict": false});
        assert_eq!(run(lax, TestRequest::get("/")).0, 200);
    }

    #[test]
    fn refusals() {
        let conf = json!({"header": "Authorization", "forward_header": "Authorization"});
        let cases = [
            ("a.b.c".to_owned(), "JWE token invalid"),
            (
                format!("invalid-{}", seal(Some("k1"), SECRET, "x")),
                "JWE token invalid",
            ),
            (seal(None, SECRET, "x"), "missing kid in JWE token"),
            (
                seal(Some("nobody"), SECRET, "x"),
                "invalid kid in JWE token",
            ),
            (
                seal(Some("k1"), "fedcba9876543210fedcba9876543210", "x"),
                "failed to decrypt JWE token",
            ),
        ];
        for (token, want) in cases {
            let (status, body, _) = run(
                conf.clone(),
                TestRequest::get("/").header("authorization", &token),
            );
            assert_eq!((status, body), (400, msg(want)), "{token}");
        }
    }

    #[test]
    fn schemas() {
        let c = Compiler::new();
        let r = &c.registry;
        assert!(r
            .check(
                NAME,
                &json!({"header": "X-Jwe", "forward_header": "X-Plain"})
            )
            .is_ok());
        assert!(r
            .check(NAME, &json!({"header": 1, "forward_header": "X"}))
            .is_err());
        assert_eq!(
            r.check_consumer(NAME, &json!({"key": "k"})).unwrap_err(),
            "failed to check the configuration of plugin jwe-decrypt err: property \"secret\" is required"
        );
        let info = r.get(NAME).unwrap();
        assert_eq!((info.plugin_type, info.priority), (Some("auth"), 2509));
    }
}
