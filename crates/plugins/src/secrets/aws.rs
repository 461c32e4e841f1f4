//! AWS Secrets Manager (`apisix/secret/aws.lua`): `GetSecretValue` for the secret id with
//! `VersionStage: AWSCURRENT`, a JSON 1.1 `POST /` to `endpoint_url` (default
//! `https://secretsmanager.<region>.amazonaws.com`) signed with SigV4 for the
//! `secretsmanager` service (`access_key_id`, `secret_access_key` and `session_token` may be
//! `$env://` references). The value is `SecretString`; a key `<name>/<field>` reads the field
//! of a secret holding a JSON object. As secret names may hold `/`, the longest name is tried
//! first, then on `ResourceNotFoundException` each shorter one (`a/b/c`, then `a/b` with
//! field `c`, then `a` with field `b/c`).

use bytes::Bytes;
use ferrisix_config::secret::env_or_plain;
use ferrisix_plugin_api::http_client::HttpClient;
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use serde_json::{json, Value};

use super::{json_field, status_error, Env, FetchError, CALL_TIMEOUT};
use crate::support::cloud::sigv4;

/// The endpoint (scheme, host and port of `endpoint_url`, its path dropped as APISIX does).
fn endpoint(conf: &Value) -> Result<Uri, FetchError> {
    let region = conf
        .get("region")
        .and_then(Value::as_str)
        .unwrap_or("us-east-1");
    let raw = conf
        .get("endpoint_url")
        .and_then(Value::as_str)
        .map_or_else(
            || format!("https://secretsmanager.{region}.amazonaws.com"),
            str::to_owned,
        );
    let uri: Uri = raw
        .parse()
        .map_err(|e| FetchError::Missing(format!("invalid endpoint_url {raw}: {e}")))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(FetchError::Missing(format!("invalid endpoint_url {raw}")));
    };
    format!("{scheme}://{authority}/")
        .parse()
        .map_err(|e| FetchError::Missing(format!("invalid endpoint_url {raw}: {e}")))
}

/// One `GetSecretValue`: the `SecretString`, or the failure with whether the secret was not
/// found.
async fn get_secret_value(
    http: &HttpClient,
    conf: &Value,
    secret_id: &str,
    env: &Env,
    now: u64,
) -> Result<Option<String>, (FetchError, bool)> {
    let text = |k: &str| conf.get(k).and_then(Value::as_str);
    let creds = sigv4::Credentials {
        access_key: env_or_plain(text("access_key_id").unwrap_or(""), env),
        secret_key: env_or_plain(text("secret_access_key").unwrap_or(""), env),
        session_token: text("session_token").map(|t| env_or_plain(t, env)),
        region: text("region").unwrap_or("us-east-1").to_owned(),
        service: "secretsmanager".into(),
    };
    let uri = endpoint(conf).map_err(|e| (e, false))?;
    let body = json!({"SecretId": secret_id, "VersionStage": "AWSCURRENT"}).to_string();
    let mut headers = HeaderMap::new();
    let host = uri.authority().map_or("", |a| a.as_str()).to_owned();
    let bad = |e: http::header::InvalidHeaderValue| (FetchError::Missing(e.to_string()), false);
    headers.insert("host", HeaderValue::from_str(&host).map_err(bad)?);
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/x-amz-json-1.1"),
    );
    headers.insert(
        "x-amz-target",
        HeaderValue::from_static("secretsmanager.GetSecretValue"),
    );
    let method = Method::POST;
    let mut signed = sigv4::Request {
        method: &method,
        path: "/",
        query: None,
        headers: &mut headers,
        body: body.as_bytes(),
    };
    sigv4::sign(&mut signed, &creds, now);
    let mut req = Request::builder().method(Method::POST).uri(uri);
    if let Some(h) = req.headers_mut() {
        *h = headers;
    }
    let req = req
        .body(Bytes::from(body))
        .map_err(|e| (FetchError::Missing(e.to_string()), false))?;
    let resp = http.send(req, CALL_TIMEOUT).await.map_err(|e| {
        (
            FetchError::Unavailable(format!(
                "failed to retrieve data from aws secret manager: {e}"
            )),
            false,
        )
    })?;
    let status = resp.status().as_u16();
    let decoded: Option<Value> = serde_json::from_slice(resp.body()).ok();
    if status != 200 {
        let not_found = decoded
            .as_ref()
            .and_then(|b| b.get("__type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t.contains("ResourceNotFoundException"));
        let msg = match &decoded {
            Some(b) => format!(
                "failed to retrieve data from aws secret manager: invalid status code {status}, {b}"
            ),
            None => format!(
                "failed to retrieve data from aws secret manager: invalid status code {status}"
            ),
        };
        return Err((status_error(status, msg), not_found));
    }
    Ok(decoded
        .as_ref()
        .and_then(|b| b.get("SecretString"))
        .and_then(Value::as_str)
        .map(str::to_owned))
}

/// The value of `key` (`<secret id>` or `<secret id>/<field>`).
pub async fn get(
    http: &HttpClient,
    conf: &Value,
    key: &str,
    env: &Env,
    now: u64,
) -> Result<Option<Value>, FetchError> {
    if key.is_empty() || key.starts_with('/') {
        return Err(FetchError::Missing(format!(
            "can't find main key, key: {key}"
        )));
    }
    let mut main = key;
    let mut sub: Option<&str> = None;
    loop {
        match get_secret_value(http, conf, main, env, now).await {
            Ok(value) => {
                let Some(value) = value else { return Ok(None) };
                return match sub {
                    None => Ok(Some(Value::String(value))),
                    Some(field) => json_field(&value, field),
                };
            }
            Err((e, not_found)) => {
                let Some(idx) = main.rfind('/').filter(|_| not_found) else {
                    return Err(e);
                };
                main = &key[..idx];
                sub = Some(&key[idx + 1..]);
            }
        }
    }
}
