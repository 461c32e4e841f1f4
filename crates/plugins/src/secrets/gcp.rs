//! Google Cloud Secret Manager (`apisix/secret/gcp.lua`): the service account is
//! `auth_config`, or the JSON key file `auth_file` (read at each fetch, as APISIX does); its
//! access token (`support::cloud::gcp_token`, cached per `client_email#project_id` until a
//! minute before it expires) authorises `GET <entries_uri>/projects/<project_id>/secrets/
//! <name>/versions/latest:access`, whose `payload.data` (base64) is the value. A key
//! `<name>/<field>` reads the field of a secret holding a JSON object. `ssl_verify` applies
//! to both calls.

use base64::Engine;
use bytes::Bytes;
use ferrisix_plugin_api::http_client::HttpClient;
use http::{header, Method, Request};
use serde_json::Value;

use super::{json_field, now_secs, status_error, FetchError, CALL_TIMEOUT};
use crate::support::cloud::gcp_token::{Account, Token};

const DEFAULT_ENTRIES_URI: &str = "https://secretmanager.googleapis.com/v1";

/// The service account of a manager conf (`fetch_oauth_conf`) and its Secret Manager
/// endpoint (`entries_uri`, of `auth_config` or of the key file), with APISIX's messages.
pub fn account(conf: &Value) -> Result<(Account, String), String> {
    let entries = |auth: &Value| {
        auth.get("entries_uri")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_ENTRIES_URI)
            .to_owned()
    };
    if let Some(auth) = conf.get("auth_config") {
        return Ok((Account::from_auth(auth), entries(auth)));
    }
    let path = conf.get("auth_file").and_then(Value::as_str).unwrap_or("");
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("failed to read configuration, file: {path}, err: {e}"))?;
    let file: Value = serde_json::from_str(&text)
        .map_err(|e| format!("config parse failure, file: {path}, err: {e}"))?;
    for field in ["client_email", "private_key", "project_id"] {
        if !file.get(field).is_some_and(Value::is_string) {
            return Err(format!(
                "config parse failure, file: {path}, err: property \"auth_config\" validation failed: property \"{field}\" is required"
            ));
        }
    }
    Ok((Account::from_auth(&file), entries(&file)))
}

/// Where an account's token is cached.
pub fn token_key(account: &Account) -> String {
    format!("{}#{}", account.client_email, account.project_id)
}

fn ssl_verify(conf: &Value) -> bool {
    conf.get("ssl_verify")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// A new access token for `account` (`refresh_access_token`).
pub async fn exchange(http: &HttpClient, account: &Account, conf: &Value) -> Result<Token, String> {
    let now = now_secs();
    let body = account.exchange_body(now)?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(&account.token_uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Bytes::from(body))
        .map_err(|e| e.to_string())?;
    let resp = http
        .send_verified(req, CALL_TIMEOUT, ssl_verify(conf))
        .await
        .map_err(|e| e.to_string())?;
    if resp.status().as_u16() != 200 {
        return Err(String::from_utf8_lossy(resp.body()).into_owned());
    }
    Token::from_answer(resp.body(), now_secs())
}

/// The value of `key` (`<name>` or `<name>/<field>`) read with `token`.
pub async fn get(
    http: &HttpClient,
    conf: &Value,
    (account, entries): (&Account, &str),
    token: Option<&Token>,
    key: &str,
) -> Result<Option<Value>, FetchError> {
    let (main, sub) = match key.split_once('/') {
        Some((m, s)) => (m, Some(s)),
        None => (key, None),
    };
    if main.is_empty() {
        return Err(FetchError::Missing(format!(
            "can't find main key, key: {key}"
        )));
    }
    let fail = "failed to retrtive data from gcp secret manager: ";
    let Some(token) = token else {
        return Err(FetchError::Unavailable(format!(
            "{fail}failed to get google oauth token"
        )));
    };
    let uri = format!(
        "{entries}/projects/{}/secrets/{main}/versions/latest:access",
        account.project_id
    );
    let req = Request::builder()
        .method(Method::GET)
        .uri(&uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, token.authorization())
        .body(Bytes::new())
        .map_err(|e| FetchError::Missing(format!("{fail}{e}")))?;
    let resp = http
        .send_verified(req, CALL_TIMEOUT, ssl_verify(conf))
        .await
        .map_err(|e| FetchError::Unavailable(format!("{fail}{e}")))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status_error(
            status,
            format!("{fail}{}", String::from_utf8_lossy(resp.body())),
        ));
    }
    let body: Value = serde_json::from_slice(resp.body())
        .map_err(|e| FetchError::Missing(format!("{fail}failed to parse response data, {e}")))?;
    let data = body
        .get("payload")
        .and_then(|p| p.get("data"))
        .and_then(Value::as_str)
        .ok_or_else(|| FetchError::Missing(format!("{fail}invalid payload")))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| FetchError::Missing(format!("{fail}invalid payload: {e}")))?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    match sub {
        None => Ok(Some(Value::String(text))),
        Some(field) => json_field(&text, field),
    }
}
