//! Google service-account access tokens (`apisix/utils/google-cloud-oauth.lua`): a JWT
//! (RS256, signed with the account's `private_key`; `iss` the `client_email`, `aud` the
//! `token_uri`, `scope` the scopes joined by spaces, an hour's validity) exchanged at
//! `token_uri` for an access token with the JWT-bearer grant
//! (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<jwt>`), kept until a
//! minute before it expires. google-cloud-logging and the `gcp` secret manager use it.

use serde_json::{json, Value};

pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
pub const DEFAULT_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// A service account (`google-cloud-oauth.lua`'s object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub client_email: String,
    pub private_key: String,
    pub project_id: String,
    pub token_uri: String,
    /// The scopes, joined by spaces.
    pub scope: String,
}

impl Account {
    /// The account of an `auth_config` object (or of a JSON key file's contents): `scope`
    /// (or `scopes`) a string or a list, `token_uri` defaulted.
    pub fn from_auth(auth: &Value) -> Account {
        let text = |k: &str| auth.get(k).and_then(Value::as_str).map(str::to_owned);
        let scope = match auth.get("scopes").or_else(|| auth.get("scope")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            _ => DEFAULT_SCOPE.into(),
        };
        Account {
            client_email: text("client_email").unwrap_or_default(),
            private_key: text("private_key").unwrap_or_default(),
            project_id: text("project_id").unwrap_or_default(),
            token_uri: text("token_uri").unwrap_or_else(|| DEFAULT_TOKEN_URI.into()),
            scope,
        }
    }

    /// The signed JWT asserting the account at `now` (seconds).
    pub fn assertion(&self, now: u64) -> Result<String, String> {
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.private_key.as_bytes())
            .map_err(|e| format!("invalid private_key: {e}"))?;
        let claims = json!({
            "iss": self.client_email,
            "aud": self.token_uri,
            "scope": self.scope,
            "iat": now,
            "exp": now + 3600,
        });
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &key,
        )
        .map_err(|e| format!("failed to sign the jwt: {e}"))
    }

    /// The form body of the token exchange at `now`, for a `POST` to `token_uri` with
    /// `Content-Type: application/x-www-form-urlencoded`.
    pub fn exchange_body(&self, now: u64) -> Result<String, String> {
        Ok(format!(
            "grant_type={}&assertion={}",
            form_escape(JWT_BEARER),
            form_escape(&self.assertion(now)?)
        ))
    }
}

/// An access token and when it expires (seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub value: String,
    /// `token_type` (`Bearer` when absent).
    pub kind: Option<String>,
    pub expires_at: u64,
}

impl Token {
    /// The token endpoint's JSON answer read at `now`.
    pub fn from_answer(body: &[u8], now: u64) -> Result<Token, String> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| format!("failed to parse google oauth response data: {e}"))?;
        let value = v
            .get("access_token")
            .and_then(Value::as_str)
            .ok_or("failed to parse google oauth response data: no access_token")?;
        Ok(Token {
            value: value.to_owned(),
            kind: v
                .get("token_type")
                .and_then(Value::as_str)
                .map(str::to_owned),
            expires_at: now + v.get("expires_in").and_then(Value::as_u64).unwrap_or(0),
        })
    }

    /// Whether it may still be used at `now` (`generate_access_token` renews a minute before
    /// expiry).
    pub fn fresh(&self, now: u64) -> bool {
        now + 60 <= self.expires_at
    }

    /// The `Authorization` header's value.
    pub fn authorization(&self) -> String {
        format!(
            "{} {}",
            self.kind.as_deref().unwrap_or("Bearer"),
            self.value
        )
    }
}

/// `ngx.encode_args`' escaping of a form value.
pub fn form_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIVATE: &str = include_str!("../../../../../tests/data/tls/dual-rsa.key");
    const PUBLIC: &str = include_str!("../../../../../tests/data/tls/dual-rsa.pub");

    #[test]
    fn assertion_verifies_with_the_public_key_and_tokens_expire() {
        let account = Account::from_auth(&json!({
            "client_email": "sa@p.iam.gserviceaccount.com", "private_key": PRIVATE,
            "project_id": "p", "scope": ["a", "b"]
        }));
        assert_eq!(account.token_uri, DEFAULT_TOKEN_URI);
        assert_eq!(account.scope, "a b");
        let now = 1_700_000_000;
        let jwt = account.assertion(now).unwrap();
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUBLIC.as_bytes()).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        v.set_audience(&[DEFAULT_TOKEN_URI]);
        v.validate_exp = false;
        let claims = jsonwebtoken::decode::<Value>(&jwt, &key, &v)
            .unwrap()
            .claims;
        assert_eq!(claims["iss"], "sa@p.iam.gserviceaccount.com");
        assert_eq!(claims["exp"], now + 3600);
        assert!(account.exchange_body(now).unwrap().starts_with(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=ey"
        ));
        let t = Token::from_answer(br#"{"access_token":"t","expires_in":3600}"#, now).unwrap();
        assert_eq!(t.authorization(), "Bearer t");
        assert!(t.fresh(now + 3539) && !t.fresh(now + 3541));
        assert!(Token::from_answer(b"{}", now).is_err());
        let bad = Account {
            private_key: "nope".into(),
            ..account
        };
        assert!(bad
            .assertion(now)
            .unwrap_err()
            .starts_with("invalid private_key"));
    }
}
