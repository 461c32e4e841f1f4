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

use ferrisix_plugin_api::{CompileCtx, Plugin, PluginDef};
use serde_json::{json, Value};

use http::{HeaderName, HeaderValue};

use super::generic_upstream::{self, Call};
use crate::support::cloud::sigv4;

pub const NAME: &str = "aws-lambda";

pub static DEF: PluginDef = PluginDef {
    encrypt_fields: &[
        "authorization.apikey",
        "authorization.iam.accesskey",
        "authorization.iam.secretkey",
    ],
    ..PluginDef::new(NAME, -1899, schema, compile)
};

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

/// Signs `call` with `iam` at `secs` (the request processor's SigV4 step, shared with the
/// secret managers in `support::cloud::sigv4`); the query is sent as it was signed.
pub fn sign(call: &mut Call, iam: &Iam, secs: u64) {
    let creds = sigv4::Credentials {
        access_key: iam.accesskey.clone(),
        secret_key: iam.secretkey.clone(),
        session_token: None,
        region: iam.region.clone(),
        service: iam.service.clone(),
    };
    let mut req = sigv4::Request {
        method: &call.method,
        path: &call.path,
        query: call.query.as_deref(),
        headers: &mut call.headers,
        body: &call.body,
    };
    let qs = sigv4::sign(&mut req, &creds, secs);
    call.query = (!qs.is_empty()).then_some(qs);
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
            .find(|t| sigv4::amz_dates(*t).0 == date)
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
