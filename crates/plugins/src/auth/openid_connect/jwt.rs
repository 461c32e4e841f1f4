//! Bearer token verification as lua-resty-openidc's `jwt_verify` does it (over lua-resty-jwt):
//! the token is loaded (`invalid jwt: ...`), an unsigned token is refused unless
//! `accept_none_alg`, its algorithm must be `token_signing_alg_values_expected` when that is
//! set, its signature is checked (`HS*` with the client secret, others with the public key
//! or the provider's JWKS key of its `kid`), the `iss` claim must be one of the valid issuers,
//! and `exp` plus `iat_slack` must not be past (`JWT expired`). The errors read as
//! lua-resty-openidc's.

use std::sync::Arc;

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};

/// A loaded token: its header, its claims and the text the signature covers.
pub struct Loaded<'t> {
    pub header: Map<String, Value>,
    pub claims: Map<String, Value>,
    pub signed: &'t str,
    pub signature: &'t str,
}

fn b64_json(part: &str) -> Option<Map<String, Value>> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()?;
    match serde_json::from_slice(&raw).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// lua-resty-jwt's `load_jwt`: three dot-separated parts, the first two base64url JSON objects.
pub fn load(token: &str) -> Result<Loaded<'_>, String> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("invalid jwt: invalid jwt string".into());
    };
    let header = b64_json(h).ok_or_else(|| format!("invalid jwt: invalid header: {h}"))?;
    let claims = b64_json(p).ok_or_else(|| format!("invalid jwt: invalid payload: {p}"))?;
    Ok(Loaded {
        header,
        claims,
        signed: &token[..h.len() + 1 + p.len()],
        signature: s,
    })
}

/// The algorithm a token names, when the verifier supports it.
pub fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// The configured `public_key` as the key of `alg`'s family.
pub fn pem_key(pem: &str, alg: Algorithm) -> Option<DecodingKey> {
    let pem = pem.as_bytes();
    match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => DecodingKey::from_rsa_pem(pem).ok(),
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(pem).ok(),
        Algorithm::EdDSA => DecodingKey::from_ed_pem(pem).ok(),
        _ => None,
    }
}

/// Gives the key that checks a token of an algorithm and header.
pub type KeyFor<'a> =
    dyn Fn(Algorithm, &Map<String, Value>) -> Result<Arc<DecodingKey>, String> + 'a;

/// What verification needs besides the token.
pub struct Verify<'a> {
    pub expected_alg: Option<&'a str>,
    pub accept_none_alg: bool,
    /// `HS*` tokens' secret (the client secret).
    pub symmetric: Option<&'a [u8]>,
    pub valid_issuers: &'a [String],
    pub iat_slack: i64,
    pub now: i64,
}

/// Checks the signature with the key `key_for` gives for the token's algorithm and header
/// (`None`: no key), then the claims; the token's claims when it passes.
pub fn verify(
    token: &str,
    opts: &Verify<'_>,
    key_for: &KeyFor<'_>,
) -> Result<Map<String, Value>, String> {
    let loaded = load(token)?;
    let alg = loaded
        .header
        .get("alg")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if alg == "none" || (loaded.signature.is_empty() && alg.is_empty()) {
        if !opts.accept_none_alg {
            return Err("token uses \"none\" alg but accept_none_alg is not enabled".into());
        }
        return check_claims(loaded.claims, opts);
    }
    if let Some(expected) = opts.expected_alg {
        if alg != expected {
            return Err(format!("token is signed by unexpected algorithm \"{alg}\""));
        }
    }
    let Some(algorithm) = algorithm(alg) else {
        return Err(format!(
            "jwt signature verification failed: Unsupported algorithm {alg}"
        ));
    };
    let key = if alg.starts_with("HS") {
        match opts.symmetric {
            Some(secret) => Arc::new(DecodingKey::from_secret(secret)),
            None => {
                return Err("jwt signature verification failed: secret not set".into());
            }
        }
    } else {
        key_for(algorithm, &loaded.header)
            .map_err(|e| format!("jwt signature verification failed: {e}"))?
    };
    let ok =
        jsonwebtoken::crypto::verify(loaded.signature, loaded.signed.as_bytes(), &key, algorithm)
            .unwrap_or(false);
    if !ok {
        return Err("jwt signature verification failed: signature mismatch".into());
    }
    check_claims(loaded.claims, opts)
}

fn check_claims(
    claims: Map<String, Value>,
    opts: &Verify<'_>,
) -> Result<Map<String, Value>, String> {
    if !opts.valid_issuers.is_empty() {
        match claims.get("iss") {
            None | Some(Value::Null) => {
                return Err("jwt signature verification failed: 'iss' claim is required.".into())
            }
            Some(iss) => {
                let text = match iss {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if !opts.valid_issuers.iter().any(|v| iss.as_str() == Some(v)) {
                    return Err(format!(
                        "jwt signature verification failed: Claim 'iss' ('{text}') returned failure"
                    ));
                }
            }
        }
    }
    if let Some(exp) = claims.get("exp").and_then(Value::as_f64) {
        if exp + (opts.iat_slack as f64) < opts.now as f64 {
            return Err("JWT expired".into());
        }
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    use super::*;

    fn hs(claims: Value, alg: Algorithm, secret: &[u8]) -> String {
        encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn opts<'a>(issuers: &'a [String]) -> Verify<'a> {
        Verify {
            expected_alg: None,
            accept_none_alg: false,
            symmetric: Some(&b"s3cret"[..]),
            valid_issuers: issuers,
            iat_slack: 120,
            now: 1_000_000,
        }
    }

    fn no_key(_: Algorithm, _: &Map<String, Value>) -> Result<Arc<DecodingKey>, String> {
        Err("no key".into())
    }

    #[test]
    fn loads_verifies_and_checks_claims() {
        let issuers = vec!["me".to_owned()];
        let o = opts(&issuers);
        let good = hs(
            json!({"iss": "me", "exp": 1_000_100}),
            Algorithm::HS256,
            b"s3cret",
        );
        assert_eq!(verify(&good, &o, &no_key).unwrap()["iss"], "me");
        let forged = hs(json!({"iss": "me"}), Algorithm::HS256, b"other");
        assert!(verify(&forged, &o, &no_key)
            .unwrap_err()
            .starts_with("jwt signature verification failed"));
        let evil = hs(json!({"iss": "evil"}), Algorithm::HS256, b"s3cret");
        assert_eq!(
            verify(&evil, &o, &no_key).unwrap_err(),
            "jwt signature verification failed: Claim 'iss' ('evil') returned failure"
        );
        // Within the slack, then past it.
        let late = hs(
            json!({"iss": "me", "exp": 999_950}),
            Algorithm::HS256,
            b"s3cret",
        );
        assert!(verify(&late, &o, &no_key).is_ok());
        let expired = hs(
            json!({"iss": "me", "exp": 999_000}),
            Algorithm::HS256,
            b"s3cret",
        );
        assert_eq!(verify(&expired, &o, &no_key).unwrap_err(), "JWT expired");
        assert_eq!(
            verify("nope", &o, &no_key).unwrap_err(),
            "invalid jwt: invalid jwt string"
        );
        // alg none is refused; an unexpected algorithm too.
        let enc = |v: Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let none = format!(
            "{}.{}.",
            enc(json!({"alg": "none"})),
            enc(json!({"iss": "me"}))
        );
        assert!(verify(&none, &o, &no_key)
            .unwrap_err()
            .contains("accept_none_alg"));
        let mut strict = opts(&issuers);
        strict.expected_alg = Some("RS256");
        assert_eq!(
            verify(&good, &strict, &no_key).unwrap_err(),
            "token is signed by unexpected algorithm \"HS256\""
        );
        // An asymmetric token without a key.
        let rs_header = format!("{}.{}.c2ln", enc(json!({"alg": "RS256"})), enc(json!({})));
        assert!(verify(&rs_header, &o, &no_key)
            .unwrap_err()
            .contains("no key"));
    }
}
