//! The session cookie of the login plugins (openid-connect, authz-casdoor), as
//! lua-resty-session 4 (which they use under APISIX) writes it: `<name>=<header><payload>`, both base64url without padding.
//!
//! The header (82 bytes, little-endian integers) is the cookie type (1), flags (2), a random
//! 32-byte session id, the creation time (5), the rolling offset (4), the payload's encoded
//! size (3), the AES-GCM tag (16), the idling offset (3) and a MAC (16). The payload is the
//! session data, `[[{...}, "default"]]` as JSON, encrypted with AES-256-GCM under a key and IV
//! derived by HKDF-SHA256 from SHA-256(`session.secret`) and the session id
//! (`encryption:<sid>`), the header's first 47 bytes as associated data. The MAC is
//! HMAC-SHA256 of the header before it, keyed by HKDF (`authentication:<sid>`), truncated.
//! A cookie that does not decode, whose MAC or tag does not verify (tampered, or written
//! with another secret), or whose timeouts have passed opens no session.
//!
//! Timeouts as lua-resty-session's: `absolute_timeout` since creation, `rolling_timeout`
//! since the session was last saved (saving gives it a new id), `idling_timeout` since last
//! use (a use more than a minute after the last one rewrites the header's idling offset,
//! "touch"; a use past three quarters of the rolling timeout saves anew). 0 disables one.
//! The cookie itself carries no `Expires`: it is a browser-session cookie, as
//! lua-resty-session's (without its "remember me" cookie, which APISIX does not configure).
//! Larger data is split over `<name>`, `<name>2`, ... up to nine cookies of 4096 bytes.
//! ferrisix never compresses the data (lua-resty-session deflates data above 1 kB and reads
//! both); its cookies open in lua-resty-session and the other way round when uncompressed.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::{aead, digest, hkdf, hmac, rand::SecureRandom};
use serde_json::{json, Map, Value};

const SID: usize = 32;
const TAG_AT: usize = 1 + 2 + SID + 5 + 4 + 3; // 47: what the AEAD binds
const TOUCH_AT: usize = TAG_AT + 16; // 63
const MAC_AT: usize = TOUCH_AT + 3; // 66
const HEADER: usize = MAC_AT + 16; // 82
/// base64url length of the 82-byte header.
const HEADER_ENCODED: usize = (HEADER * 4).div_ceil(3);
const MAX_COOKIE: usize = 4096;
const MAX_COOKIES: usize = 9;
const TOUCH_THRESHOLD: u64 = 60;
const EXPIRE: &str = "; Expires=Thu, 01 Jan 1970 00:00:01 GMT; Max-Age=0";

/// The `session` options of the plugin's conf.
#[derive(Clone)]
pub struct SessionConf {
    pub name: String,
    /// `; Domain=..; Path=..; SameSite=..[; Secure][; HttpOnly]`.
    flags: String,
    ikm: [u8; 32],
    /// Earlier keys (`secret_fallbacks`) a cookie may still be sealed with.
    fallbacks: Vec<[u8; 32]>,
    pub idling_timeout: u64,
    pub rolling_timeout: u64,
    pub absolute_timeout: u64,
}

impl std::fmt::Debug for SessionConf {
    /// The key material is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionConf")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What an opened session's cookie said, kept to touch or save it.
#[derive(Clone, Debug)]
struct Meta {
    sid: [u8; SID],
    creation: u64,
    rolling_offset: u64,
    idling_offset: u64,
    header: Vec<u8>,
    /// The key the cookie was sealed with (the secret's, or a fallback's).
    ikm: [u8; 32],
    /// The payload as it came (encoded), for a touch that rewrites only the header.
    payload: String,
    chunks: usize,
}

/// A session: its data, and the cookie it came from (none for a new one).
#[derive(Clone, Debug, Default)]
pub struct Session {
    pub data: Map<String, Value>,
    meta: Option<Meta>,
    /// The request's time (epoch seconds) the session was opened at.
    opened_at: u64,
}

impl Session {
    pub fn present(&self) -> bool {
        self.meta.is_some()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.data.get(key).filter(|v| !v.is_null())
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn set(&mut self, key: &str, value: Value) {
        if value.is_null() {
            self.data.remove(key);
        } else {
            self.data.insert(key.to_owned(), value);
        }
    }
}

/// Reads a `Cookie` header's pairs (the first of a name wins, as nginx's `$cookie_<name>`).
pub fn cookie<'a>(headers: impl Iterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    headers
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

fn put_le(out: &mut Vec<u8>, value: u64, size: usize) {
    out.extend_from_slice(&value.to_le_bytes()[..size]);
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn hkdf(ikm: &[u8; 32], usage: &str, sid: &[u8], out: &mut [u8]) -> Result<(), String> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(ikm);
    let info = [usage.as_bytes(), b":", sid];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| "unable to derive session key".to_owned())
}

fn mac(ikm: &[u8; 32], sid: &[u8], msg: &[u8]) -> Result<[u8; 16], String> {
    let mut key = [0u8; 32];
    hkdf(ikm, "authentication", sid, &mut key)?;
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), msg);
    let mut out = [0u8; 16];
    out.copy_from_slice(&tag.as_ref()[..16]);
    Ok(out)
}

fn aead_key(ikm: &[u8; 32], sid: &[u8]) -> Result<(aead::LessSafeKey, aead::Nonce), String> {
    let mut bytes = [0u8; 44];
    hkdf(ikm, "encryption", sid, &mut bytes)?;
    let key = aead::UnboundKey::new(&aead::AES_256_GCM, &bytes[..32])
        .map_err(|_| "unable to derive session key".to_owned())?;
    let nonce = aead::Nonce::try_assume_unique_for_key(&bytes[32..])
        .map_err(|_| "unable to derive session key".to_owned())?;
    Ok((aead::LessSafeKey::new(key), nonce))
}

/// How many cookies a payload of `size` encoded bytes takes (lua-resty-session's count).
fn chunks(name_len: usize, size: usize) -> Option<usize> {
    let mut needed = name_len + 1 + HEADER_ENCODED + size;
    if needed <= MAX_COOKIE {
        return Some(1);
    }
    for i in 2..=MAX_COOKIES {
        needed += name_len + 2;
        if needed > MAX_COOKIE * MAX_COOKIES {
            return None;
        }
        if needed <= MAX_COOKIE * i {
            return Some(i);
        }
    }
    None
}

impl SessionConf {
    /// The conf's `session` object (`cookie.lifetime` is the deprecated name of
    /// `absolute_timeout`, used when that is not set, as APISIX maps it).
    pub fn new(conf: &Value) -> SessionConf {
        let s = |k: &str| conf.get(k).and_then(Value::as_str);
        let n = |k: &str, default: u64| {
            conf.get(k)
                .and_then(Value::as_i64)
                .map_or(default, |v| v.max(0) as u64)
        };
        let lifetime = conf
            .get("cookie")
            .and_then(|c| c.get("lifetime"))
            .and_then(Value::as_i64);
        let absolute = match (conf.get("absolute_timeout"), lifetime) {
            (Some(Value::Number(_)), _) | (_, None) => n("absolute_timeout", 86_400),
            (_, Some(l)) => {
                tracing::warn!(
                    "session.cookie.lifetime is deprecated; use session.absolute_timeout instead"
                );
                l.max(0) as u64
            }
        };
        let mut flags = String::new();
        if let Some(d) = s("cookie_domain").filter(|d| !d.is_empty() && *d != "localhost") {
            flags.push_str("; Domain=");
            flags.push_str(d);
        }
        flags.push_str("; Path=");
        flags.push_str(s("cookie_path").unwrap_or("/"));
        flags.push_str("; SameSite=");
        flags.push_str(s("cookie_same_site").unwrap_or("Lax"));
        if conf.get("cookie_secure").and_then(Value::as_bool) == Some(true) {
            flags.push_str("; Secure");
        }
        if conf.get("cookie_http_only").and_then(Value::as_bool) != Some(false) {
            flags.push_str("; HttpOnly");
        }
        let key = |secret: &str| {
            let digest = digest::digest(&digest::SHA256, secret.as_bytes());
            let mut ikm = [0u8; 32];
            ikm.copy_from_slice(digest.as_ref());
            ikm
        };
        let fallbacks = conf
            .get("secret_fallbacks")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).map(key).collect())
            .unwrap_or_default();
        SessionConf {
            name: s("cookie_name").unwrap_or("session").to_owned(),
            flags,
            ikm: key(s("secret").unwrap_or("")),
            fallbacks,
            idling_timeout: n("idling_timeout", 900),
            rolling_timeout: n("rolling_timeout", 3600),
            absolute_timeout: n("absolute_timeout", absolute),
        }
    }

    /// A session named `name` with lua-resty-session's defaults, keyed by `ikm` (the plugins
    /// that configure no secret: a key of the gateway's own).
    pub fn with_ikm(name: &str, ikm: [u8; 32]) -> SessionConf {
        let mut conf = SessionConf::new(&json!({"cookie_name": name}));
        conf.ikm = ikm;
        conf
    }

    /// Opens the session of a request's `Cookie` headers (see [`SessionConf::open`]).
    pub fn open_request(&self, headers: &http::HeaderMap, now: u64) -> (Session, Option<String>) {
        let cookies: Vec<&str> = headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        self.open(cookies.iter().copied(), now)
    }

    /// Opens the request's session; a new empty one (and why) when there is none or it is
    /// not valid.
    pub fn open<'a>(
        &self,
        cookies: impl Iterator<Item = &'a str> + Clone,
        now: u64,
    ) -> (Session, Option<String>) {
        match self.try_open(cookies, now) {
            Ok(s) => (s, None),
            Err(e) => (
                Session {
                    opened_at: now,
                    ..Session::default()
                },
                Some(e),
            ),
        }
    }

    fn try_open<'a>(
        &self,
        cookies: impl Iterator<Item = &'a str> + Clone,
        now: u64,
    ) -> Result<Session, String> {
        let value = cookie(cookies.clone(), &self.name).ok_or("missing session cookie")?;
        let header_b64 = value
            .get(..HEADER_ENCODED)
            .ok_or("invalid session header")?;
        let header = URL_SAFE_NO_PAD
            .decode(header_b64)
            .map_err(|_| "unable to base64url decode session header")?;
        if header.len() != HEADER || header[0] != 1 {
            return Err("invalid session cookie type".into());
        }
        if le(&header[1..3]) & 0x0001 != 0 {
            return Err("invalid session flags".into());
        }
        let mut sid = [0u8; SID];
        sid.copy_from_slice(&header[3..35]);
        let creation = le(&header[35..40]);
        let absolute = now.saturating_sub(creation);
        if self.absolute_timeout != 0 && absolute > self.absolute_timeout {
            return Err("session absolute timeout exceeded".into());
        }
        let rolling_offset = le(&header[40..44]);
        let rolling = now.saturating_sub(creation).saturating_sub(rolling_offset);
        if self.rolling_timeout != 0 && rolling > self.rolling_timeout {
            return Err("session rolling timeout exceeded".into());
        }
        let size = le(&header[44..47]) as usize;
        let idling_offset = le(&header[TOUCH_AT..MAC_AT]);
        if self.idling_timeout != 0 && rolling.saturating_sub(idling_offset) > self.idling_timeout {
            return Err("session idling timeout exceeded".into());
        }
        // Constant-time comparisons: the MAC is the cookie's authentication.
        let mut ikm = None;
        for key in std::iter::once(&self.ikm).chain(&self.fallbacks) {
            let expected = mac(key, &sid, &header[..MAC_AT])?;
            if bool::from(subtle::ConstantTimeEq::ct_eq(
                &expected[..],
                &header[MAC_AT..HEADER],
            )) {
                ikm = Some(*key);
                break;
            }
        }
        let ikm = ikm.ok_or("invalid session message authentication code")?;
        let count = chunks(self.name.len(), size).ok_or("cookie size limit exceeded")?;
        let mut payload = value[HEADER_ENCODED..].to_owned();
        for i in 2..=count {
            let part = cookie(cookies.clone(), &format!("{}{i}", self.name))
                .ok_or("missing session cookie chunk")?;
            payload.push_str(part);
        }
        if payload.len() != size {
            return Err("invalid session payload".into());
        }
        let mut data = URL_SAFE_NO_PAD
            .decode(&payload)
            .map_err(|_| "unable to base64url decode session data")?;
        if le(&header[1..3]) & 0x0010 != 0 {
            // Deflated by lua-resty-session: ferrisix does not inflate.
            return Err("unable to inflate session data".into());
        }
        data.extend_from_slice(&header[TAG_AT..TOUCH_AT]);
        let (key, nonce) = aead_key(&ikm, &sid)?;
        let plain = key
            .open_in_place(nonce, aead::Aad::from(&header[..TAG_AT]), &mut data)
            .map_err(|_| "unable to decrypt session data")?;
        let parsed: Value =
            serde_json::from_slice(plain).map_err(|_| "unable to json decode session data")?;
        let data = parsed
            .as_array()
            .and_then(|list| {
                list.iter()
                    .find(|e| e.get(1).and_then(Value::as_str) == Some("default"))
            })
            .and_then(|e| e.get(0))
            .and_then(Value::as_object)
            .cloned()
            .ok_or("missing session audience")?;
        Ok(Session {
            data,
            meta: Some(Meta {
                sid,
                creation,
                rolling_offset,
                idling_offset,
                header,
                ikm,
                payload,
                chunks: count,
            }),
            opened_at: now,
        })
    }

    /// Writes the session under a new id: its `Set-Cookie` values.
    pub fn save(&self, session: &mut Session, now: u64) -> Result<Vec<String>, String> {
        let mut sid = [0u8; SID];
        ring::rand::SystemRandom::new()
            .fill(&mut sid)
            .map_err(|_| "unable to generate session id")?;
        let (creation, rolling_offset) = match &session.meta {
            Some(m) => (m.creation, now.saturating_sub(m.creation)),
            None => (now, 0),
        };
        let plain = serde_json::to_vec(&json!([[Value::Object(session.data.clone()), "default"]]))
            .map_err(|e| e.to_string())?;
        let size = plain.len().div_ceil(3) * 4 - (3 - plain.len() % 3) % 3;
        let count = chunks(self.name.len(), size).ok_or("cookie size limit exceeded")?;
        let mut header = Vec::with_capacity(HEADER);
        header.push(1);
        put_le(&mut header, 0, 2);
        header.extend_from_slice(&sid);
        put_le(&mut header, creation, 5);
        put_le(&mut header, rolling_offset, 4);
        put_le(&mut header, size as u64, 3);
        let (key, nonce) = aead_key(&self.ikm, &sid)?;
        let mut data = plain;
        let tag = key
            .seal_in_place_separate_tag(nonce, aead::Aad::from(&header[..]), &mut data)
            .map_err(|_| "unable to encrypt session data")?;
        header.extend_from_slice(tag.as_ref());
        put_le(&mut header, 0, 3);
        let m = mac(&self.ikm, &sid, &header)?;
        header.extend_from_slice(&m);
        let payload = URL_SAFE_NO_PAD.encode(&data);
        let mut out = Vec::new();
        self.write(&header, &payload, count, &mut out);
        // Chunks the earlier cookie had and this one does not are expired.
        if let Some(old) = &session.meta {
            for i in count + 1..=old.chunks {
                out.push(format!("{}{i}={}{EXPIRE}", self.name, self.flags));
            }
        }
        session.meta = Some(Meta {
            sid,
            creation,
            rolling_offset,
            idling_offset: 0,
            header,
            ikm: self.ikm,
            payload,
            chunks: count,
        });
        Ok(out)
    }

    fn write(&self, header: &[u8], payload: &str, count: usize, out: &mut Vec<String>) {
        let header = URL_SAFE_NO_PAD.encode(header);
        if count == 1 {
            out.push(format!("{}={header}{payload}{}", self.name, self.flags));
            return;
        }
        let first = (MAX_COOKIE - HEADER_ENCODED - self.name.len() - 1).min(payload.len());
        out.push(format!(
            "{}={header}{}{}",
            self.name,
            &payload[..first],
            self.flags
        ));
        let mut rest = &payload[first..];
        for i in 2..=count {
            let take = (MAX_COOKIE - self.name.len() - 2).min(rest.len());
            out.push(format!("{}{i}={}{}", self.name, &rest[..take], self.flags));
            rest = &rest[take..];
        }
    }

    /// lua-resty-session's `refresh` when a session is opened: past three quarters of the
    /// rolling timeout the session is saved anew; else, past the touch threshold of idling,
    /// the header's idling offset is rewritten. The cookies to set, if any.
    pub fn refresh(&self, session: &mut Session) -> Result<Vec<String>, String> {
        let now = session.opened_at;
        let Some(meta) = session.meta.clone() else {
            return Ok(Vec::new());
        };
        if self.rolling_timeout == 0 && self.idling_timeout == 0 {
            return Ok(Vec::new());
        }
        let rolling = now
            .saturating_sub(meta.creation)
            .saturating_sub(meta.rolling_offset);
        if self.rolling_timeout > 0 && rolling > self.rolling_timeout * 3 / 4 {
            return self.save(session, now);
        }
        if self.idling_timeout > 0 && rolling.saturating_sub(meta.idling_offset) > TOUCH_THRESHOLD {
            let idling_offset = rolling.min(0xff_ffff);
            let mut header = meta.header[..TOUCH_AT].to_vec();
            put_le(&mut header, idling_offset, 3);
            let m = mac(&meta.ikm, &meta.sid, &header)?;
            header.extend_from_slice(&m);
            let first = if meta.chunks == 1 {
                meta.payload.clone()
            } else {
                let n = (MAX_COOKIE - HEADER_ENCODED - self.name.len() - 1).min(meta.payload.len());
                meta.payload[..n].to_owned()
            };
            let out = vec![format!(
                "{}={}{first}{}",
                self.name,
                URL_SAFE_NO_PAD.encode(&header),
                self.flags
            )];
            if let Some(m) = session.meta.as_mut() {
                m.idling_offset = idling_offset;
                m.header = header;
            }
            return Ok(out);
        }
        Ok(Vec::new())
    }

    /// Ends the session: cookies that expire it (and its chunks) in the browser.
    pub fn destroy(&self, session: &mut Session) -> Vec<String> {
        let chunks = session.meta.as_ref().map_or(1, |m| m.chunks);
        let mut out = vec![format!("{}={}{EXPIRE}", self.name, self.flags)];
        for i in 2..=chunks {
            out.push(format!("{}{i}={}{EXPIRE}", self.name, self.flags));
        }
        session.meta = None;
        session.data.clear();
        out
    }
}

/// Puts `Set-Cookie` values on the response.
pub fn set_cookies(ctx: &mut ferrisix_plugin_api::PluginCtx<'_>, cookies: Vec<String>) {
    for c in cookies {
        if let Ok(v) = http::HeaderValue::from_str(&c) {
            ctx.response_headers_mut()
                .append(http::header::SET_COOKIE, v);
        }
    }
}

/// The gateway's own session key, for the plugins that configure no secret (authz-casdoor):
/// random, made once per gateway, as lua-resty-session makes its default key at start.
pub struct GatewaySessionKey(pub [u8; 32]);

impl ferrisix_plugin_api::SharedState for GatewaySessionKey {
    fn create(_: &ferrisix_plugin_api::PluginServices) -> Self {
        let mut key = [0u8; 32];
        // Should the system's generator fail, the all-zero key would be a known one: std's
        // randomly seeded hasher keys stand in.
        if ring::rand::SystemRandom::new().fill(&mut key).is_err() {
            use std::hash::{BuildHasher, Hasher};
            for chunk in key.chunks_mut(8) {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u8(0);
                chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
            }
        }
        GatewaySessionKey(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf() -> SessionConf {
        SessionConf::new(&json!({"secret": "0123456789abcdef", "idling_timeout": 100,
            "rolling_timeout": 1000, "absolute_timeout": 5000}))
    }

    fn pair(set_cookie: &str) -> String {
        set_cookie.split(';').next().unwrap().to_owned()
    }

    #[test]
    fn round_trip_and_attributes() {
        let c = conf();
        let mut s = Session::default();
        s.set("state", json!("abc"));
        let cookies = c.save(&mut s, 1_000_000).unwrap();
        assert_eq!(cookies.len(), 1);
        assert!(cookies[0].starts_with("session="));
        assert!(cookies[0].ends_with("; Path=/; SameSite=Lax; HttpOnly"));
        let header = pair(&cookies[0]);
        let (opened, err) = c.open(std::iter::once(header.as_str()), 1_000_010);
        assert_eq!(err, None);
        assert_eq!(opened.get_str("state"), Some("abc"));
    }

    #[test]
    fn tampered_foreign_and_expired_cookies_open_nothing() {
        let c = conf();
        let mut s = Session::default();
        s.set("authenticated", json!(true));
        let good = pair(&c.save(&mut s, 1_000_000).unwrap()[0]);
        // A flipped payload character.
        let mut bad = good.clone().into_bytes();
        let last = bad.len() - 2;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        assert!(c.open(std::iter::once(bad.as_str()), 1_000_001).1.is_some());
        // Another secret.
        let other = SessionConf::new(&json!({"secret": "fedcba9876543210"}));
        let (s2, err) = other.open(std::iter::once(good.as_str()), 1_000_001);
        assert!(!s2.present());
        assert_eq!(
            err.as_deref(),
            Some("invalid session message authentication code")
        );
        // Idle past 100 s, then past the absolute 5000 s.
        assert_eq!(
            c.open(std::iter::once(good.as_str()), 1_000_101)
                .1
                .as_deref(),
            Some("session idling timeout exceeded")
        );
        let lax = SessionConf::new(&json!({"secret": "0123456789abcdef", "idling_timeout": 0,
            "rolling_timeout": 0, "absolute_timeout": 50}));
        assert!(lax
            .open(std::iter::once(good.as_str()), 1_000_049)
            .1
            .is_none());
        assert_eq!(
            lax.open(std::iter::once(good.as_str()), 1_000_051)
                .1
                .as_deref(),
            Some("session absolute timeout exceeded")
        );
    }

    #[test]
    fn touch_extends_idling_and_large_data_is_chunked() {
        let c = conf();
        let mut s = Session::default();
        s.set("big", json!("x".repeat(6000)));
        let cookies = c.save(&mut s, 1_000_000).unwrap();
        assert_eq!(cookies.len(), 2);
        assert!(cookies[1].starts_with("session2="));
        let jar = cookies
            .iter()
            .map(|c| pair(c))
            .collect::<Vec<_>>()
            .join("; ");
        let (mut opened, err) = c.open(std::iter::once(jar.as_str()), 1_000_090);
        assert_eq!(err, None);
        assert_eq!(opened.get_str("big").map(str::len), Some(6000));
        // 90 s idle: touched, so 90 s later it is still open.
        let touched = c.refresh(&mut opened).unwrap();
        assert_eq!(touched.len(), 1);
        let jar = format!("{}; {}", pair(&touched[0]), pair(&cookies[1]));
        assert_eq!(c.open(std::iter::once(jar.as_str()), 1_000_180).1, None);
    }

    #[test]
    fn fallback_secrets_open_older_cookies() {
        let old = SessionConf::new(&json!({"secret": "old-secret"}));
        let mut s = Session::default();
        s.set("userinfo", json!("{}"));
        let cookie = pair(&old.save(&mut s, 1_000_000).unwrap()[0]);
        let new =
            SessionConf::new(&json!({"secret": "new-secret", "secret_fallbacks": ["old-secret"]}));
        let (mut opened, err) = new.open(std::iter::once(cookie.as_str()), 1_000_001);
        assert_eq!(err, None);
        // Saved again under the current secret: no longer readable with the old one alone.
        let resaved = pair(&new.save(&mut opened, 1_000_002).unwrap()[0]);
        assert!(old
            .open(std::iter::once(resaved.as_str()), 1_000_003)
            .1
            .is_some());
        let newest = SessionConf::new(&json!({"secret": "new-secret"}));
        assert!(newest
            .open(std::iter::once(resaved.as_str()), 1_000_003)
            .1
            .is_none());
    }

    #[test]
    fn deprecated_lifetime_and_destroy() {
        let c = SessionConf::new(
            &json!({"secret": "0123456789abcdef", "cookie": {"lifetime": 7},
            "cookie_name": "sid", "cookie_secure": true, "cookie_domain": "example.com"}),
        );
        assert_eq!(c.absolute_timeout, 7);
        let mut s = Session::default();
        let gone = c.destroy(&mut s);
        assert_eq!(
            gone,
            vec!["sid=; Domain=example.com; Path=/; SameSite=Lax; Secure; HttpOnly; Expires=Thu, 01 Jan 1970 00:00:01 GMT; Max-Age=0"]
        );
    }
}
