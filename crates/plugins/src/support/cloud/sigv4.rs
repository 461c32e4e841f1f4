//! AWS Signature Version 4 (as `resty.aws`'s request signer and APISIX's aws-lambda sign):
//! `X-Amz-Date` (and `X-Amz-Security-Token` with temporary credentials) added, the canonical
//! request (method, normalised path, the query pairs URI-encoded and sorted, every header but
//! `Connection` lower-cased and trimmed, their names, the body's SHA-256) hashed into the
//! string to sign for `<date>/<region>/<service>/aws4_request`, signed with the key derived
//! from the secret key, and sent as `Authorization: AWS4-HMAC-SHA256
//! Credential=<access key>/<scope>, SignedHeaders=..., Signature=...`.

use ferrisix_plugin_api::clock::CivilTime;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use ring::{digest, hmac};

const ALGO: &str = "AWS4-HMAC-SHA256";

/// Credentials and where they sign for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    /// A temporary credential's session token, sent as `X-Amz-Security-Token`.
    pub session_token: Option<String>,
    pub region: String,
    pub service: String,
}

/// The parts of a request the signature covers.
pub struct Request<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a mut HeaderMap,
    pub body: &'a [u8],
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(data: &[u8]) -> String {
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
pub fn amz_dates(secs: u64) -> (String, String) {
    let t = CivilTime::from_unix_secs(secs);
    let date = format!("{:04}{:02}{:02}", t.year, t.month, t.day);
    (
        format!("{date}T{:02}{:02}{:02}Z", t.hour, t.minute, t.second),
        date,
    )
}

/// The signature of the string to sign, with the key derived from `secret_key`.
pub fn signature(
    secret_key: &str,
    datestamp: &str,
    region: &str,
    service: &str,
    sts: &str,
) -> String {
    let k_date = hmac256(format!("AWS4{secret_key}").as_bytes(), datestamp);
    let k_region = hmac256(&k_date, region);
    let k_service = hmac256(&k_region, service);
    let k_signing = hmac256(&k_service, "aws4_request");
    hex(&hmac256(&k_signing, sts))
}

/// The canonical request of `req` (its headers as they are) and the names it signs.
pub fn canonical_request(req: &Request<'_>) -> (String, String) {
    let uri = canonical_uri(req.path);
    let qs = canonical_query(req.query);
    let mut names: Vec<&str> = req
        .headers
        .keys()
        .map(HeaderName::as_str)
        .filter(|k| *k != "connection")
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut canonical_headers = String::new();
    for name in &names {
        let values: Vec<String> = req
            .headers
            .get_all(*name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
            .collect();
        canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let signed_headers = names.join(";");
    (
        format!(
            "{}\n{uri}\n{qs}\n{canonical_headers}\n{signed_headers}\n{}",
            req.method.as_str().to_uppercase(),
            sha256_hex(req.body)
        ),
        signed_headers,
    )
}

/// Signs `req` with `creds` at `secs` (Unix seconds): adds `X-Amz-Date`, the session token if
/// any, and `Authorization`. Answers the canonical query string, which the request should be
/// sent with (the order signed).
pub fn sign(req: &mut Request<'_>, creds: &Credentials, secs: u64) -> String {
    let (amzdate, datestamp) = amz_dates(secs);
    req.headers.insert(
        HeaderName::from_static("x-amz-date"),
        HeaderValue::from_str(&amzdate).expect("digits make a header value"),
    );
    if let Some(token) = &creds.session_token {
        if let Ok(v) = HeaderValue::from_str(token) {
            req.headers
                .insert(HeaderName::from_static("x-amz-security-token"), v);
        }
    }
    let (canonical, signed_headers) = canonical_request(req);
    let scope = format!(
        "{datestamp}/{}/{}/aws4_request",
        creds.region, creds.service
    );
    let string_to_sign = format!(
        "{ALGO}\n{amzdate}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let signature = signature(
        &creds.secret_key,
        &datestamp,
        &creds.region,
        &creds.service,
        &string_to_sign,
    );
    let authorization = format!(
        "{ALGO} Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key
    );
    if let Ok(v) = HeaderValue::from_str(&authorization) {
        req.headers.insert(http::header::AUTHORIZATION, v);
    }
    canonical_query(req.query)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The credentials of AWS's SigV4 test suite.
    fn suite() -> Credentials {
        Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            region: "us-east-1".into(),
            service: "service".into(),
        }
    }

    /// 2015-08-30T12:36:00Z, the suite's time.
    const SUITE_TIME: u64 = 1_440_938_160;

    fn signed(method: Method, query: Option<&str>, creds: &Credentials) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("example.amazonaws.com"));
        let mut req = Request {
            method: &method,
            path: "/",
            query,
            headers: &mut headers,
            body: b"",
        };
        sign(&mut req, creds, SUITE_TIME);
        headers
    }

    /// AWS's published SigV4 test vectors (aws-sig-v4-test-suite): get-vanilla,
    /// get-vanilla-query-order-key-case, post-vanilla. (The session token's signing is
    /// checked by `tests/e2e/secrets.rs`'s store, which signs again on its own.)
    #[test]
    fn aws_test_suite_vectors() {
        let h = signed(Method::GET, None, &suite());
        assert_eq!(h["x-amz-date"], "20150830T123600Z");
        assert_eq!(
            h["authorization"],
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        let sig = |h: &HeaderMap| {
            let a = h["authorization"].to_str().unwrap();
            a.rsplit_once("Signature=").unwrap().1.to_owned()
        };
        let h = signed(Method::GET, Some("Param2=value2&Param1=value1"), &suite());
        assert_eq!(
            sig(&h),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        let h = signed(Method::POST, None, &suite());
        assert_eq!(
            sig(&h),
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
}
