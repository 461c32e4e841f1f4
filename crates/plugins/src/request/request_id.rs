//! request-id (`apisix/plugins/request-id.lua`): gives every request an id in `header_name`
//! (the client's own when it sent a non-empty one), sent upstream and, with
//! `include_in_response`, back to the client unless the response carries one already.
//! Algorithms: `uuid` (v4), `uuidv7`, `nanoid` (21 characters), `ksuid` (27 base62
//! characters) and `range_id` (`length` characters of `char_set`).

use std::fmt::Write;
use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead, Step};
use http::{HeaderName, HeaderValue};
use rand::{Rng, RngCore};
use serde_json::{json, Value};

pub const NAME: &str = "request-id";

pub static DEF: PluginDef = PluginDef::new(NAME, 12015, schema, compile);

const DEFAULT_CHAR_SET: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIGKLMNOPQRSTUVWXYZ0123456789";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header_name": {"type": "string", "default": "X-Request-Id"},
            "include_in_response": {"type": "boolean", "default": true},
            "algorithm": {
                "type": "string",
                "enum": ["uuid", "nanoid", "range_id", "ksuid", "uuidv7"],
                "default": "uuid"
            },
            "range_id": {
                "type": "object",
                "properties": {
                    "length": {"type": "integer", "minimum": 6, "default": 16},
                    "char_set": {"type": "string", "minLength": 6, "default": DEFAULT_CHAR_SET}
                },
                "default": {"length": 16, "char_set": DEFAULT_CHAR_SET}
            }
        }
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Algorithm {
    Uuid,
    UuidV7,
    Nanoid,
    Ksuid,
    Range { length: usize, chars: Vec<u8> },
}

#[derive(Debug)]
struct RequestId {
    header: HeaderName,
    include_in_response: bool,
    algorithm: Algorithm,
}

/// The id given to this request, for the response header.
struct GivenId(HeaderValue);

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let name = conf["header_name"].as_str().unwrap_or("X-Request-Id");
    let header = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("invalid header_name {name:?}"))?;
    let algorithm = match conf["algorithm"].as_str().unwrap_or("uuid") {
        "uuidv7" => Algorithm::UuidV7,
        "nanoid" => Algorithm::Nanoid,
        "ksuid" => Algorithm::Ksuid,
        "range_id" => {
            let r = &conf["range_id"];
            let chars = r["char_set"]
                .as_str()
                .unwrap_or(DEFAULT_CHAR_SET)
                .as_bytes()
                .to_vec();
            if chars.is_empty() {
                return Err("range_id.char_set is empty".into());
            }
            Algorithm::Range {
                length: r["length"].as_u64().unwrap_or(16) as usize,
                chars,
            }
        }
        _ => Algorithm::Uuid,
    };
    Ok(Arc::new(RequestId {
        header,
        include_in_response: conf["include_in_response"].as_bool().unwrap_or(true),
        algorithm,
    }))
}

fn hex_uuid(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{byte:02x}");
    }
    s
}

const NANOID_ALPHABET: &[u8] = b"-_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// KSUID's epoch (2014-05-13T16:53:20Z).
const KSUID_EPOCH: u64 = 1_400_000_000;

impl Algorithm {
    fn generate(&self, rng: &mut impl RngCore, unix_ms: u64) -> String {
        match self {
            Algorithm::Uuid => {
                let mut b = [0u8; 16];
                rng.fill_bytes(&mut b);
                b[6] = (b[6] & 0x0f) | 0x40;
                b[8] = (b[8] & 0x3f) | 0x80;
                hex_uuid(&b)
            }
            Algorithm::UuidV7 => {
                let mut b = [0u8; 16];
                rng.fill_bytes(&mut b);
                b[..6].copy_from_slice(&unix_ms.to_be_bytes()[2..]);
                b[6] = (b[6] & 0x0f) | 0x70;
                b[8] = (b[8] & 0x3f) | 0x80;
                hex_uuid(&b)
            }
            Algorithm::Nanoid => {
                let mut b = [0u8; 21];
                rng.fill_bytes(&mut b);
                b.iter()
                    .map(|x| NANOID_ALPHABET[(x & 63) as usize] as char)
                    .collect()
            }
            Algorithm::Ksuid => {
                let mut raw = [0u8; 20];
                let ts = (unix_ms / 1000).saturating_sub(KSUID_EPOCH) as u32;
                raw[..4].copy_from_slice(&ts.to_be_bytes());
                rng.fill_bytes(&mut raw[4..]);
                base62_27(raw)
            }
            Algorithm::Range { length, chars } => (0..*length)
                .map(|_| chars[rng.gen_range(0..chars.len())] as char)
                .collect(),
        }
    }
}

/// The 20 bytes of a KSUID as 27 base62 digits (big-endian, zero-padded).
fn base62_27(mut n: [u8; 20]) -> String {
    let mut digits = [b'0'; 27];
    for slot in digits.iter_mut().rev() {
        // n /= 62, keeping the remainder.
        let mut rem: u32 = 0;
        for byte in n.iter_mut() {
            let cur = (rem << 8) | u32::from(*byte);
            *byte = (cur / 62) as u8;
            rem = cur % 62;
        }
        *slot = BASE62[rem as usize];
    }
    String::from_utf8_lossy(&digits).into_owned()
}

impl Plugin for RequestId {
    fn phases(&self) -> Phases {
        if self.include_in_response {
            Phases::REWRITE | Phases::HEADER_FILTER
        } else {
            Phases::REWRITE
        }
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        let sent = ctx
            .headers()
            .get(&self.header)
            .filter(|v| !v.is_empty())
            .cloned();
        let id = match sent {
            Some(v) => v,
            None => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let text = self.algorithm.generate(&mut rand::thread_rng(), now);
                // Every generated id is ASCII from the alphabets above (or the conf's
                // char_set, which may not be: then the request goes on without one).
                let Ok(v) = HeaderValue::from_str(&text) else {
                    tracing::warn!("request-id: char_set makes ids that are no header value");
                    return Step::CONTINUE;
                };
                ctx.headers_mut().insert(self.header.clone(), v.clone());
                v
            }
        };
        if self.include_in_response {
            ctx.insert(GivenId(id));
        }
        Step::CONTINUE
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let has = resp
            .headers()
            .get(&self.header)
            .is_some_and(|v| !v.is_empty());
        if has {
            return;
        }
        if let Some(GivenId(id)) = ctx.get::<GivenId>() {
            let id = id.clone();
            resp.headers_mut().insert(self.header.clone(), id);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::BodyEdits;
    use http::{HeaderMap, StatusCode};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;
    use crate::testing::Compiler;

    fn run(conf: Value, req: &mut TestRequest, resp_headers: &mut HeaderMap) {
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "rid", None)).unwrap();
        let mut ctx = req.ctx();
        let _ = p.rewrite(&mut ctx);
        if p.phases().contains(Phases::HEADER_FILTER) {
            let (mut status, mut edits) = (StatusCode::OK, BodyEdits::default());
            let mut head = ResponseHead::new(&mut status, resp_headers, true, &mut edits);
            p.header_filter(&mut ctx, &mut head);
        }
    }

    #[test]
    fn generates_or_keeps_and_answers() {
        let mut req = TestRequest::get("/");
        let mut resp = HeaderMap::new();
        run(json!({}), &mut req, &mut resp);
        let id = req.headers["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_eq!(resp["x-request-id"], id.as_str());
        // The client's id is kept; an empty one is replaced.
        let mut req = TestRequest::get("/").header("x-request-id", "client-1");
        let mut resp = HeaderMap::new();
        run(json!({}), &mut req, &mut resp);
        assert_eq!(resp["x-request-id"], "client-1");
        let mut req = TestRequest::get("/").header("x-request-id", "");
        run(json!({}), &mut req, &mut HeaderMap::new());
        assert_eq!(req.headers["x-request-id"].len(), 36);
        // The upstream's own id wins in the response.
        let mut req = TestRequest::get("/");
        let mut resp = HeaderMap::new();
        resp.insert("x-request-id", HeaderValue::from_static("up"));
        run(json!({}), &mut req, &mut resp);
        assert_eq!(resp["x-request-id"], "up");
        // Not in the response; another header name.
        let mut req = TestRequest::get("/");
        let mut resp = HeaderMap::new();
        run(
            json!({"include_in_response": false, "header_name": "X-Trace"}),
            &mut req,
            &mut resp,
        );
        assert!(req.headers.contains_key("x-trace") && resp.is_empty());
        let _ = Bytes::new();
    }

    #[test]
    fn algorithms() {
        let mut rng = SmallRng::seed_from_u64(7);
        let ms = 1_700_000_000_123;
        let v7 = Algorithm::UuidV7.generate(&mut rng, ms);
        assert!(v7.starts_with("018bcfe5-687b-7"), "{v7}");
        let n = Algorithm::Nanoid.generate(&mut rng, ms);
        assert_eq!(n.len(), 21);
        assert!(n.bytes().all(|b| NANOID_ALPHABET.contains(&b)));
        let k = Algorithm::Ksuid.generate(&mut rng, ms);
        assert_eq!(k.len(), 27);
        assert_eq!(base62_27([0; 20]), "0".repeat(27));
        assert_eq!(base62_27([0xff; 20]), "aWgEPTl1tmebfsQzFP4bxwgy80V");
        let r = Algorithm::Range {
            length: 8,
            chars: b"abcdef".to_vec(),
        }
        .generate(&mut rng, ms);
        assert_eq!(r.len(), 8);
        assert!(r.bytes().all(|b| b"abcdef".contains(&b)));
        let reg = crate::PluginRegistry::builtin();
        assert!(reg
            .check(
                NAME,
                &json!({"algorithm": "range_id", "range_id": {"length": 5}})
            )
            .unwrap_err()
            .contains("length"));
        assert!(reg.check(NAME, &json!({"algorithm": "x"})).is_err());
    }
}
