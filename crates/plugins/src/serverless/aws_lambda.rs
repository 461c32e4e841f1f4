//! aws-lambda (`apisix/plugins/aws-lambda.lua`): the request sent to an AWS Lambda function
//! behind API Gateway (`function_uri`), as the generic function call does, authorised by
//! `authorization.apikey` (sent as `x-api-key` unless the client sent one) or, with
//! `authorization.iam`, by AWS Signature Version 4: `X-Amz-Date` added, the canonical
//! request (method, normalised path, the query pairs URI-encoded and sorted, every header
//! but `Connection` lower-cased and trimmed, their names, the body's SHA-256) hashed into
//! the string to sign for `<date>/<aws_region>/<service>/aws4_request`, signed with the
//! key derived from `secretkey`, and sent as `Authorization: AWS4-HMAC-SHA256
//! Credential=<accesskey>/<scope>, SignedHeaders=..., Signature=...`, the query sent as it
//! was signed. A client's own `Authorization` is left as it is.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ferrisix_plugin_api::clock::CivilTime;
use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use http::{HeaderName, HeaderValue};
use ring::{digest, hmac};
use serde_json::{json, Value};

use super::generic_upstream::{self, Call};

pub const NAME: &str = "aws-lambda";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &[
        "authorization.apikey",
        "authorization.iam.accesskey",
        "authorization.iam.secretkey",
    ],
    ..PluginDef::new(NAME, -1899, schema, compile)
};

const ALGO: &str = "AWS4-HMAC-SHA256";

fn schema() -> Value {
    generic_upstream::schema(Some(json!({
        "type": "object",
        "properties": {
            "apikey": {"type": "string"},
            "iam": {
                "type": "object",
                "properties": {
                    "accesskey": {"type": "string", "description": "access key id from from aws iam console"},
                    "secretkey": {"type": "string", "description": "secret access key from from aws iam console"},
                    "aws_region": {"type": "string", "default": "us-east-1",
                        "description": "the aws region that is receiving the request"},
                    "service": {"type": "string", "default": "execute-api",
                        "description": "the service that is receiving the request"}
                },
                "required": ["accesskey", "secretkey"]
            }
        }
    })))
}

/// IAM credentials and where they sign for.
#[derive(Clone, Debug)]
pub struct Iam {
    pub accesskey: String,
    pub secretkey: String,
    pub region: String,
    pub service: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac256(key: &[u8], msg: &str) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg.as_bytes())
        .as_ref()
        .to_vec()
}

/// SigV4's URI encoding: everything but `A-Z a-z 0-9 - _ . ~` as `%XX`.
fn uri_encode(s: &[u8]) -> String {
    s.iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `ngx.unescape_uri` with `+` as a space, as `get_uri_args` decodes arguments.
fn unescape(s: &str) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The canonical query string: each argument's name and value decoded, URI-encoded, the
/// pairs sorted by name then value (an argument without a value has an empty one).
pub fn canonical_query(query: Option<&str>) -> String {
    let mut pairs: Vec<(String, String)> = query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let name = unescape(k);
            (!name.is_empty()).then(|| (uri_encode(&name), uri_encode(&unescape(v))))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `pl.path.normpath` for the canonical URI: empty and `.` segments dropped, `..` taking
/// the one before; then no trailing `/` and a leading one.
pub fn canonical_uri(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `YYYYMMDDTHHMMSSZ` and `YYYYMMDD` of `secs`.
fn amz_dates(secs: u64) -> (String, String) {
    let t = CivilTime::from_unix_secs(secs);
    let date = format!("{:04}{:02}{:02}", t.year, t.month, t.day);
    (
        format!("{date}T{:02}{:02}{:02}Z", t.hour, t.minute, t.second),
        date,
    )
}

/// Signs `call` with `iam` at `secs` (the request processor's SigV4 step).
pub fn sign(call: &mut Call, iam: &Iam, secs: u64) {
    let (amzdate, datestamp) = amz_dates(secs);
    call.headers.insert(
        HeaderName::from_static("x-amz-date"),
        HeaderValue::from_str(&amzdate).expect("digits make a header value"),
    );
    let uri = canonical_uri(&call.path);
    let qs = canonical_query(call.query.as_deref());
    call.query = (!qs.is_empty()).then(|| qs.clone());
    let mut names: Vec<&str> = call
        .headers
        .keys()
        .map(HeaderName::as_str)
        .filter(|k| *k != "connection")
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut canonical_headers = String::new();
    for name in &names {
        let values: Vec<String> = call
            .headers
            .get_all(*name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
            .collect();
        canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let signed_headers = names.join(";");
    let canonical_request = format!(
        "{}\n{uri}\n{qs}\n{canonical_headers}\n{signed_headers}\n{}",
        call.method.as_str().to_uppercase(),
        sha256_hex(&call.body)
    );
    let scope = format!("{datestamp}/{}/{}/aws4_request", iam.region, iam.service);
    let string_to_sign = format!(
        "{ALGO}\n{amzdate}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let k_date = hmac256(format!("AWS4{}", iam.secretkey).as_bytes(), &datestamp);
    let k_region = hmac256(&k_date, &iam.region);
    let k_service = hmac256(&k_region, &iam.service);
    let k_signing = hmac256(&k_service, "aws4_request");
    let signature = hex(&hmac256(&k_signing, &string_to_sign));
    let authorization = format!(
        "{ALGO} Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        iam.accesskey
    );
    if let Ok(v) = HeaderValue::from_str(&authorization) {
        call.headers.insert(http::header::AUTHORIZATION, v);
    }
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    let auth = conf.get("authorization");
    let apikey = auth
        .and_then(|a| a.get("apikey"))
        .and_then(Value::as_str)
        .map(HeaderValue::from_str)
        .transpose()
        .map_err(|_| "invalid authorization.apikey".to_string())?;
    let iam = auth.and_then(|a| a.get("iam")).map(|i| {
        let text = |k: &str, d: &str| i.get(k).and_then(Value::as_str).unwrap_or(d).to_owned();
        Iam {
            accesskey: text("accesskey", ""),
            secretkey: text("secretkey", ""),
            region: text("aws_region", "us-east-1"),
            service: text("service", "execute-api"),
        }
    });
    generic_upstream::compile(
        cx,
        NAME,
        Box::new(move |call: &mut Call| {
            if !call.headers.contains_key("x-api-key") {
                if let Some(key) = &apikey {
                    call.headers
                        .insert(HeaderName::from_static("x-api-key"), key.clone());
                    return;
                }
            }
            let Some(iam) = &iam else { return };
            if call.headers.contains_key(http::header::AUTHORIZATION) {
                return;
            }
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            sign(call, iam, now);
        }),
    )
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use http::{HeaderMap, Method};

    use super::super::generic_upstream::testing::{call, echo, platform, seen};
    use super::*;
    use crate::testing::Compiler;

    /// The credentials of AWS's SigV4 test suite.
    fn suite_iam() -> Iam {
        Iam {
            accesskey: "AKIDEXAMPLE".into(),
            secretkey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            region: "us-east-1".into(),
            service: "service".into(),
        }
    }

    /// 2015-08-30T12:36:00Z, the suite's time.
    const SUITE_TIME: u64 = 1_440_938_160;

    fn suite_call(method: Method, path: &str, query: Option<&str>) -> Call {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("example.amazonaws.com"));
        Call {
            method,
            path: path.into(),
            query: query.map(Into::into),
            headers,
            body: Bytes::new(),
        }
    }

    fn signature(call: &Call) -> String {
        let auth = call.headers["authorization"].to_str().unwrap();
        auth.rsplit_once("Signature=").unwrap().1.to_owned()
    }

    /// AWS's published SigV4 test vectors (aws-sig-v4-test-suite).
    #[test]
    fn aws_test_suite_vectors() {
        // get-vanilla
        let mut c = suite_call(Method::GET, "/", None);
        sign(&mut c, &suite_iam(), SUITE_TIME);
        assert_eq!(c.headers["x-amz-date"], "20150830T123600Z");
        assert_eq!(
            c.headers["authorization"],
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        // get-vanilla-query-order-key-case
        let mut c = suite_call(Method::GET, "/", Some("Param2=value2&Param1=value1"));
        sign(&mut c, &suite_iam(), SUITE_TIME);
        assert_eq!(
            signature(&c),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        assert_eq!(c.query.as_deref(), Some("Param1=value1&Param2=value2"));
        // post-vanilla
        let mut c = suite_call(Method::POST, "/", None);
        sign(&mut c, &suite_iam(), SUITE_TIME);
        assert_eq!(
            signature(&c),
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        );
    }

    #[test]
    fn canonical_parts() {
        assert_eq!(canonical_uri("/a//b/./c/../d/"), "/a/b/d");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(
            canonical_query(Some("b=2&a=x+y&a=%2F&flag&c=%7E")),
            "a=%2F&a=x%20y&b=2&c=~&flag="
        );
    }

    #[tokio::test]
    async fn api_key_and_iam_authorization() {
        let addr = platform(echo).await;
        let c = Compiler::new();
        let conf = json!({"function_uri": format!("http://{addr}/default/fn"),
            "authorization": {"apikey": "k-123"}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "aws-1", None)).unwrap();
        let e = call(&*p, TestRequest::get("/aws?x=1")).await;
        assert_eq!(e.status, 200);
        let s = seen(&e);
        assert_eq!(s["headers"]["x-api-key"], "k-123");
        assert_eq!(s["path"], "/default/fn");
        assert_eq!(s["query"], "x=1");
        assert_eq!(s["headers"]["host"], "127.0.0.1");
        // A client's key is kept.
        let e = call(&*p, TestRequest::get("/aws").header("x-api-key", "mine")).await;
        assert_eq!(seen(&e)["headers"]["x-api-key"], "mine");

        let conf = json!({"function_uri": format!("http://{addr}/default/fn"),
            "authorization": {"iam": {"accesskey": "AKID", "secretkey": "SECRET", "aws_region": "eu-west-1", "service": "lambda"}}});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "aws-2", None)).unwrap();
        let e = call(&*p, TestRequest::get("/aws?b=2&a=1")).await;
        let s = seen(&e);
        // What was sent verifies: rebuild the call from what the platform saw and sign it
        // again with the same date.
        let auth = s["headers"]["authorization"].as_str().unwrap().to_owned();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKID/"),
            "{auth}"
        );
        assert!(
            auth.contains(
                "/eu-west-1/lambda/aws4_request, SignedHeaders=host;x-amz-date, Signature="
            ),
            "{auth}"
        );
        assert_eq!(s["query"], "a=1&b=2");
        let date = s["headers"]["x-amz-date"].as_str().unwrap();
        let iam = Iam {
            accesskey: "AKID".into(),
            secretkey: "SECRET".into(),
            region: "eu-west-1".into(),
            service: "lambda".into(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let at = (now - 10..=now)
            .find(|t| amz_dates(*t).0 == date)
            .expect("signed within the last seconds");
        let mut again = suite_call(Method::GET, "/default/fn", Some("a=1&b=2"));
        again
            .headers
            .insert("host", HeaderValue::from_static("127.0.0.1"));
        sign(&mut again, &iam, at);
        assert_eq!(again.headers["authorization"], auth.as_str());
    }

    #[test]
    fn schema_messages() {
        let r = crate::PluginRegistry::builtin();
        let pre = "failed to check the configuration of plugin aws-lambda err: ";
        assert_eq!(
            r.check(NAME, &json!({})).unwrap_err(),
            format!("{pre}property \"function_uri\" is required")
        );
        assert_eq!(
            r.check(NAME, &json!({"function_uri": "https://x.execute-api.us-east-1.amazonaws.com/default/f",
                "authorization": {"iam": {"accesskey": "a"}}}))
                .unwrap_err(),
            format!("{pre}property \"authorization\" validation failed: property \"iam\" validation failed: property \"secretkey\" is required")
        );
        assert!(r
            .check(NAME, &json!({"function_uri": "https://a/b", "timeout": 99}))
            .is_err());
        let info = r.get(NAME).unwrap();
        assert_eq!(info.priority, -1899);
    }
}
