//! google-cloud-logging (`apisix/plugins/google-cloud-logging.lua` with
//! `apisix/utils/google-cloud-oauth.lua`): batches written to Cloud Logging's
//! `entries:write` (`auth_config.entries_uri`) as `{"entries": [...], "partialSuccess":
//! false}`, authorised by a service account: a JWT (RS256, signed with `private_key`;
//! `iss` the `client_email`, `aud` the `token_uri`, `scope` the scopes joined by spaces,
//! an hour's validity) is exchanged at `token_uri` for an access token
//! (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`), which is kept until a minute
//! before it expires. The account is `auth_config`, or the JSON key file `auth_file` (read
//! when the conf compiles). Each entry: `logName` `projects/<project_id>/logs/<log_id>`,
//! `resource`, `labels.source`, `timestamp` (RFC 3339), `insertId` (`$request_id` where the
//! gateway has it), and with the default entry `httpRequest` (method, URL, sizes, status,
//! user agent, remote and server IP, latency as `"0.012s"`) and `jsonPayload` (`route_id`,
//! `service_id`, the `log_format_extra` fields), with a `log_format` `jsonPayload` that
//! entry. `ssl_verify` for both calls.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use ferrisix_config::schema::lua;
use ferrisix_plugin_api::{
    CompileCtx, LogCtx, LogNeeds, Phases, Plugin, PluginDef, PluginServices, VarNames,
};
use http::{header, HeaderValue, Method};
use serde_json::{json, Map, Value};

use super::sink::http::HttpTarget;
use super::sink::{self, rfc5424, BatchSink, EntryParts, Logger, SendError, SendFuture};
use crate::support::cloud::gcp_token::{self, Token};

pub const NAME: &str = "google-cloud-logging";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &["auth_config.private_key"],
    ..sink::def(NAME, 407, schema, compile)
};

const DEFAULT_ENTRIES_URI: &str = "https://logging.googleapis.com/v2/entries:write";

fn schema() -> Value {
    let scopes = json!({"type": "array",
        "items": {"description": "Google OAuth2 Authorization Scopes", "type": "string"},
        "minItems": 1, "uniqueItems": true});
    let mut scope = scopes.clone();
    scope["default"] = json!([
        "https://www.googleapis.com/auth/logging.read",
        "https://www.googleapis.com/auth/logging.write",
        "https://www.googleapis.com/auth/logging.admin",
        "https://www.googleapis.com/auth/cloud-platform"
    ]);
    sink::batch_schema(
        json!({
            "type": "object",
            "properties": {
                "auth_config": {
                    "type": "object",
                    "properties": {
                        "client_email": {"type": "string"},
                        "private_key": {"type": "string"},
                        "project_id": {"type": "string"},
                        "token_uri": {"type": "string", "default": gcp_token::DEFAULT_TOKEN_URI},
                        "scope": scope,
                        "scopes": scopes,
                        "entries_uri": {"type": "string", "default": DEFAULT_ENTRIES_URI}
                    },
                    "required": ["client_email", "private_key", "project_id", "token_uri"]
                },
                "ssl_verify": {"type": "boolean", "default": true},
                "auth_file": {"type": "string"},
                "resource": {
                    "type": "object",
                    "properties": {"type": {"type": "string"}, "labels": {"type": "object"}},
                    "default": {"type": "global"},
                    "required": ["type"]
                },
                "log_id": {"type": "string", "default": "apisix.apache.org%2Flogs"},
                "log_format": {"type": "object"},
                "log_format_extra": {"type": "object"}
            },
            "oneOf": [{"required": ["auth_config"]}, {"required": ["auth_file"]}]
        }),
        NAME,
    )
}

/// The service account (`google-cloud-oauth.lua`'s object, shared in
/// `support::cloud::gcp_token`) and where entries are written.
#[derive(Clone, Debug)]
struct Account {
    oauth: gcp_token::Account,
    project_id: String,
    entries_uri: String,
}

impl Account {
    /// `fetch_oauth_conf` and `google_oauth.new`.
    fn from_conf(conf: &Value) -> Result<Account, String> {
        let file;
        let auth = match (conf.get("auth_config"), conf.get("auth_file")) {
            (Some(a), _) => a,
            (None, Some(Value::String(path))) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("failed to read configuration, file: {path} err: {e}"))?;
                file = serde_json::from_str::<Value>(&text)
                    .map_err(|e| format!("config parse failure, file: {path}, err: {e}"))?;
                &file
            }
            _ => return Err("configuration is not defined".into()),
        };
        let oauth = gcp_token::Account::from_auth(auth);
        Ok(Account {
            project_id: oauth.project_id.clone(),
            entries_uri: auth
                .get("entries_uri")
                .and_then(Value::as_str)
                .map_or_else(|| DEFAULT_ENTRIES_URI.into(), str::to_owned),
            oauth,
        })
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

struct GoogleSink {
    account: Account,
    target: HttpTarget,
    token: Mutex<Option<Token>>,
}

impl GoogleSink {
    /// `generate_access_token`: the kept token, else a new one (`None`: the exchange failed,
    /// logged).
    async fn access_token(&self) -> Option<Token> {
        let now = now_secs();
        if let Some(t) = self.token.lock().ok()?.as_ref() {
            if now + 60 <= t.expires_at {
                return Some(t.clone());
            }
        }
        let body = match self.account.oauth.exchange_body(now) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("failed to refresh google oauth access token, {e}");
                return None;
            }
        };
        let builder = self
            .target
            .request(Method::POST, &self.account.oauth.token_uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        let resp = match self.target.call(builder, Bytes::from(body)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(
                    "failed to refresh google oauth access token, {}",
                    e.into_send_error("").message
                );
                return None;
            }
        };
        if resp.status().as_u16() != 200 {
            tracing::error!(
                "failed to refresh google oauth access token: {}",
                String::from_utf8_lossy(resp.body())
            );
            return None;
        }
        let token = match Token::from_answer(resp.body(), now_secs()) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("{e}");
                return None;
            }
        };
        if let Ok(mut kept) = self.token.lock() {
            *kept = Some(token.clone());
        }
        Some(token)
    }

    async fn write(&self, entries: &[Bytes]) -> Result<(), SendError> {
        let token = self
            .access_token()
            .await
            .ok_or_else(|| SendError::new("failed to get google oauth token"))?;
        let mut body = BytesMut::new();
        body.put_slice(b"{\"entries\":[");
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                body.put_u8(b',');
            }
            body.put_slice(e);
        }
        body.put_slice(b"],\"partialSuccess\":false}");
        let auth = format!(
            "{} {}",
            token.kind.as_deref().unwrap_or("Bearer"),
            token.value
        );
        let builder = self
            .target
            .request(Method::POST, &self.account.entries_uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::AUTHORIZATION,
                HeaderValue::from_str(&auth).map_err(|e| SendError::new(e.to_string()))?,
            );
        let resp = self
            .target
            .call(builder, body.freeze())
            .await
            .map_err(|e| e.into_send_error("failed to write log to google, "))?;
        if resp.status().as_u16() != 200 {
            return Err(SendError::new(
                String::from_utf8_lossy(resp.body()).into_owned(),
            ));
        }
        Ok(())
    }
}

impl BatchSink for GoogleSink {
    fn send<'a>(&'a self, entries: &'a [Bytes], _: usize) -> SendFuture<'a> {
        Box::pin(self.write(entries))
    }
}

/// What every entry of one conf shares.
struct EntryHead {
    log_name: String,
    resource: Value,
}

impl EntryHead {
    /// `get_logger_entry`.
    fn entry(&self, parts: EntryParts, now_ms: u64, request_id: Option<&str>) -> Value {
        let EntryParts {
            entry,
            extra,
            customized,
        } = parts;
        let mut out = Map::new();
        if customized {
            out.insert("jsonPayload".into(), Value::Object(entry));
        } else {
            let req = entry.get("request").cloned().unwrap_or(Value::Null);
            let resp = entry.get("response").cloned().unwrap_or(Value::Null);
            let latency = entry.get("latency").and_then(Value::as_f64).unwrap_or(0.0);
            let mut http = Map::new();
            let mut put = |k: &str, v: Option<&Value>| {
                if let Some(v) = v.filter(|v| !v.is_null()) {
                    http.insert(k.to_owned(), v.clone());
                }
            };
            put("requestMethod", req.get("method"));
            put("requestUrl", req.get("url"));
            put("requestSize", req.get("size"));
            put("status", resp.get("status"));
            put("responseSize", resp.get("size"));
            put(
                "userAgent",
                req.get("headers").and_then(|h| h.get("user-agent")),
            );
            put("remoteIp", entry.get("client_ip"));
            put("serverIp", entry.get("upstream"));
            http.insert(
                "latency".into(),
                Value::String(format!("{:.3}s", latency / 1000.0)),
            );
            let mut payload = Map::new();
            for k in ["route_id", "service_id"] {
                if let Some(v) = entry.get(k) {
                    payload.insert(k.into(), v.clone());
                }
            }
            for (k, v) in extra.into_iter().flatten() {
                payload.entry(k).or_insert(v);
            }
            out.insert("httpRequest".into(), Value::Object(http));
            out.insert("jsonPayload".into(), Value::Object(payload));
        }
        out.insert(
            "labels".into(),
            json!({"source": "apache-apisix-google-cloud-logging"}),
        );
        out.insert(
            "timestamp".into(),
            Value::String(rfc5424::timestamp(now_ms)),
        );
        out.insert("resource".into(), self.resource.clone());
        if let Some(id) = request_id {
            out.insert("insertId".into(), Value::String(id.into()));
        }
        out.insert("logName".into(), Value::String(self.log_name.clone()));
        Value::Object(out)
    }
}

/// The logger, or why the account could not be read (then every request logs it, as
/// APISIX's log phase does).
enum Google {
    Ready {
        logger: Box<Logger>,
        head: Arc<EntryHead>,
    },
    Broken(String),
}

impl Plugin for Google {
    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn log_needs(&self) -> LogNeeds {
        match self {
            Google::Ready { logger, .. } => logger.needs(),
            Google::Broken(_) => LogNeeds::default(),
        }
    }

    fn log(&self, ctx: &LogCtx) {
        match self {
            Google::Ready { logger, head } => logger.log_parts(ctx, |parts, now| {
                Bytes::from(lua::cjson_encode(&head.entry(
                    parts,
                    now,
                    ctx.vars.get("request_id"),
                )))
            }),
            Google::Broken(e) => {
                tracing::error!("failed to fetch google-cloud-logging.oauth object: {e}")
            }
        }
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let filled = cx.filled();
    let account = match Account::from_conf(&filled) {
        Ok(a) => a,
        Err(e) => return Ok(Arc::new(Google::Broken(e))),
    };
    let head = Arc::new(EntryHead {
        log_name: format!(
            "projects/{}/logs/{}",
            account.project_id,
            filled
                .get("log_id")
                .and_then(Value::as_str)
                .unwrap_or("apisix.apache.org%2Flogs")
        ),
        resource: filled
            .get("resource")
            .cloned()
            .unwrap_or_else(|| json!({"type": "global"})),
    });
    let services: &Arc<PluginServices> = cx.services;
    let logger = Logger::compile(cx, NAME, false, |c| {
        Ok(Arc::new(GoogleSink {
            target: HttpTarget::new(
                services,
                std::time::Duration::from_secs(60),
                c.get("ssl_verify").and_then(Value::as_bool).unwrap_or(true),
                Vec::new(),
            ),
            account,
            token: Mutex::new(None),
        }) as Arc<dyn BatchSink>)
    })?
    .with_vars(&VarNames::from(vec!["request_id".into()]));
    Ok(Arc::new(Google::Ready {
        logger: Box::new(logger),
        head,
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferrisix_config::validate::PluginCheck;

    use super::*;
    use crate::log::sink::testing::{answer, http_server, log_ctx, Captured};
    use crate::testing::Compiler;

    const KEY: &str = include_str!("../../../../tests/data/tls/dual-rsa.key");
    const PUBLIC: &str = include_str!("../../../../tests/data/tls/dual-rsa.pub");

    /// Google's token endpoint and Logging API in one server, following their documented
    /// protocol: `POST /token` takes a form with the JWT-bearer grant and an RS256
    /// assertion, checked against the account's public key (issuer, audience, scope,
    /// expiry), and answers a bearer token; `POST /v2/entries:write` needs that token.
    fn google(req: &Captured) -> Vec<u8> {
        if req.head.starts_with("POST /token ") {
            let form: std::collections::HashMap<String, String> = url_form(&req.text());
            if form.get("grant_type").map(String::as_str)
                != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
                || !req
                    .lower()
                    .contains("content-type: application/x-www-form-urlencoded")
            {
                return answer(400, r#"{"error":"unsupported_grant_type"}"#);
            }
            let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUBLIC.as_bytes()).unwrap();
            let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
            v.set_audience(&[format!("http://{}/token", host_of(req))]);
            v.set_issuer(&["gw@project.iam.gserviceaccount.com"]);
            let Ok(t) =
                jsonwebtoken::decode::<Value>(form.get("assertion").map_or("", |a| a), &key, &v)
            else {
                return answer(400, r#"{"error":"invalid_grant"}"#);
            };
            if t.claims["scope"] != "https://www.googleapis.com/auth/logging.write"
                || t.claims["exp"].as_u64().unwrap() != t.claims["iat"].as_u64().unwrap() + 3600
            {
                return answer(400, r#"{"error":"invalid_scope"}"#);
            }
            return answer(
                200,
                r#"{"access_token":"ya29.test-token","expires_in":3599,"token_type":"Bearer"}"#,
            );
        }
        if req.head.starts_with("POST /v2/entries:write ") {
            if !req
                .lower()
                .contains("authorization: bearer ya29.test-token")
            {
                return answer(401, r#"{"error":{"code":401,"status":"UNAUTHENTICATED"}}"#);
            }
            return answer(200, "{}");
        }
        answer(404, "")
    }

    fn host_of(req: &Captured) -> String {
        req.head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(": ")?;
                k.eq_ignore_ascii_case("host").then(|| v.to_owned())
            })
            .unwrap_or_default()
    }

    fn url_form(body: &str) -> std::collections::HashMap<String, String> {
        body.split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| {
                let bytes = v.as_bytes();
                let mut out = Vec::new();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i] == b'%' && i + 2 < bytes.len() + 1 {
                        out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap());
                        i += 3;
                    } else {
                        out.push(bytes[i]);
                        i += 1;
                    }
                }
                (k.to_owned(), String::from_utf8(out).unwrap())
            })
            .collect()
    }

    fn auth(port: u16) -> Value {
        json!({"client_email": "gw@project.iam.gserviceaccount.com", "private_key": KEY,
            "project_id": "apisix-test", "token_uri": format!("http://127.0.0.1:{port}/token"),
            "entries_uri": format!("http://127.0.0.1:{port}/v2/entries:write"),
            "scopes": ["https://www.googleapis.com/auth/logging.write"]})
    }

    #[tokio::test]
    async fn log_id_names_the_log() {
        let (port, mut rx) = http_server(google).await;
        let c = Compiler::new();
        let conf = json!({"auth_config": auth(port), "batch_max_size": 1, "ssl_verify": false,
            "log_id": "gateway-access"});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "gcl-id", None)).unwrap();
        p.log(&log_ctx(&*p, 0));
        let mut write = None;
        for _ in 0..2 {
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            if got.head.starts_with("POST /v2/entries:write ") {
                write = Some(got);
                break;
            }
        }
        let body: Value = serde_json::from_slice(&write.expect("an entries write").body).unwrap();
        assert_eq!(
            body["entries"][0]["logName"],
            "projects/apisix-test/logs/gateway-access"
        );
    }

    #[tokio::test]
    async fn token_exchange_then_entries() {
        let (port, mut rx) = http_server(google).await;
        let c = Compiler::new();
        let conf = json!({"auth_config": auth(port), "batch_max_size": 2, "ssl_verify": false,
            "resource": {"type": "generic_node", "labels": {"node_id": "n1"}},
            "log_format_extra": {"extra": "$request_uri"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "gcl-1", None)).unwrap();
        for round in 0..2 {
            for n in 0..2 {
                p.log(&log_ctx(&*p, n));
            }
            let mut got = Vec::new();
            // The first round exchanges the JWT for a token; the second reuses it.
            let expect = if round == 0 { 2 } else { 1 };
            for _ in 0..expect {
                got.push(
                    tokio::time::timeout(Duration::from_secs(5), rx.recv())
                        .await
                        .unwrap()
                        .unwrap(),
                );
            }
            if round == 0 {
                assert!(got[0].head.starts_with("POST /token "), "{}", got[0].head);
            }
            let write = got.last().unwrap();
            assert!(
                write.head.starts_with("POST /v2/entries:write "),
                "{}",
                write.head
            );
            let body: Value = serde_json::from_slice(&write.body).unwrap();
            assert_eq!(body["partialSuccess"], false);
            let e = &body["entries"][1];
            assert_eq!(
                e["logName"],
                "projects/apisix-test/logs/apisix.apache.org%2Flogs"
            );
            assert_eq!(
                e["resource"],
                json!({"type": "generic_node", "labels": {"node_id": "n1"}})
            );
            assert_eq!(e["labels"]["source"], "apache-apisix-google-cloud-logging");
            assert_eq!(e["httpRequest"]["status"], 200);
            assert!(e["httpRequest"]["requestUrl"]
                .as_str()
                .unwrap()
                .ends_with("/x?n=1"));
            assert!(e["httpRequest"]["latency"].as_str().unwrap().ends_with('s'));
            assert_eq!(
                e["jsonPayload"],
                json!({"route_id": "r1", "service_id": "", "extra": "/x?n=1"})
            );
            assert!(e["timestamp"].as_str().unwrap().ends_with('Z'));
        }
    }

    #[tokio::test]
    async fn refused_tokens_and_writes() {
        let (port, _rx) = http_server(google).await;
        let services = Arc::new(PluginServices::default());
        let sink = |account: Account| GoogleSink {
            account,
            target: HttpTarget::new(&services, Duration::from_secs(5), false, Vec::new()),
            token: Mutex::new(None),
        };
        let mut wrong = Account::from_conf(&json!({"auth_config": auth(port)})).unwrap();
        wrong.oauth.client_email = "other@project.iam.gserviceaccount.com".into();
        let err = sink(wrong)
            .write(&[Bytes::from_static(b"{}")])
            .await
            .unwrap_err();
        assert_eq!(err.message, "failed to get google oauth token");
        let mut account = Account::from_conf(&json!({"auth_config": auth(port)})).unwrap();
        account.entries_uri = format!("http://127.0.0.1:{port}/other");
        let s = sink(account);
        *s.token.lock().unwrap() = Some(Token {
            value: "stale".into(),
            kind: None,
            expires_at: now_secs() + 3600,
        });
        let err = s.write(&[Bytes::from_static(b"{}")]).await.unwrap_err();
        assert_eq!(err.message, "");
    }

    #[test]
    fn auth_file_and_scopes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.json");
        std::fs::write(
            &path,
            json!({"client_email": "a@b", "private_key": KEY, "project_id": "p",
                "token_uri": "http://127.0.0.1:1/token"})
            .to_string(),
        )
        .unwrap();
        let a = Account::from_conf(&json!({"auth_file": path})).unwrap();
        assert_eq!(a.project_id, "p");
        assert_eq!(
            a.oauth.scope,
            "https://www.googleapis.com/auth/cloud-platform"
        );
        assert_eq!(a.entries_uri, DEFAULT_ENTRIES_URI);
        let missing =
            Account::from_conf(&json!({"auth_file": "/nonexistent/sa.json"})).unwrap_err();
        assert!(
            missing.starts_with("failed to read configuration, file: /nonexistent/sa.json err: "),
            "{missing}"
        );
        assert!(a.oauth.assertion(1).unwrap().split('.').count() == 3);
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin google-cloud-logging err: ";
        assert_eq!(
            r.check(NAME, &json!({})).unwrap_err(),
            format!("{pre}value should match only one schema, but matches none")
        );
        assert!(r.check(NAME, &json!({"auth_file": "/x.json"})).is_ok());
        assert_eq!(
            r.check(NAME, &json!({"auth_config": {"client_email": "a", "private_key": "k"}}))
                .unwrap_err(),
            format!("{pre}property \"auth_config\" validation failed: property \"project_id\" is required")
        );
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, 407);
        assert_eq!(info.schema["properties"]["name"]["default"], NAME);
    }
}
