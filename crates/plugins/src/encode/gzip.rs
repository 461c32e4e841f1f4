//! gzip (`apisix/plugins/gzip.lua`, nginx's gzip filter): compresses answers of `types` (or
//! every type with `"*"`) for clients whose `Accept-Encoding` takes gzip, at `comp_level`,
//! when the declared length is at least `min_length` and the request at least `http_version`;
//! `vary` adds `Vary: Accept-Encoding`. As nginx with `gzip_proxied off`, requests that came
//! through a proxy (`Via`) are not compressed, and only 200, 403 and 404 answers are. The body
//! streams through the compressor; `buffers` is accepted (nginx's output buffers) and has no
//! effect: output goes on as the compressor makes it.

use std::sync::Arc;

use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead};
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::{accepted, mark_encoded, Applies, EncodeBody};
use crate::support::encoding::Encoder;

pub const NAME: &str = "gzip";

pub static DEF: PluginDef = PluginDef::new(NAME, 995, schema, compile);

fn schema() -> Value {
    Applies::schema(json!({
        "comp_level": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
        "http_version": {"enum": [1.1, 1.0], "default": 1.1},
        "buffers": {
            "type": "object",
            "properties": {
                "number": {"type": "integer", "minimum": 1, "default": 32},
                "size": {"type": "integer", "minimum": 1, "default": 4096}
            },
            "default": {"number": 32, "size": 4096}
        },
        "vary": {"type": "boolean"}
    }))
}

#[derive(Debug)]
struct Gzip {
    applies: Applies,
    level: u32,
    vary: bool,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let conf = cx.filled();
    Ok(Arc::new(Gzip {
        applies: Applies::from_conf(&conf),
        level: conf["comp_level"].as_u64().unwrap_or(1) as u32,
        vary: conf["vary"].as_bool().unwrap_or(false),
    }))
}

impl Plugin for Gzip {
    fn phases(&self) -> Phases {
        Phases::HEADER_FILTER
    }

    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let accepted = accepted(ctx, "gzip", false);
        let proxied = ctx.headers().contains_key(header::VIA);
        let status_ok = matches!(
            resp.status(),
            StatusCode::OK | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
        );
        let head_only = ctx.method() == http::Method::HEAD;
        if !accepted
            || proxied
            || !status_ok
            || head_only
            || !self.applies.response(resp, ctx.head().version)
        {
            return;
        }
        mark_encoded(resp, "gzip");
        if self.vary {
            resp.headers_mut()
                .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        resp.add_encoding_filter(Box::new(EncodeBody {
            encoder: Some(Encoder::gzip(self.level)),
            flush: false,
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use bytes::Bytes;
    use ferrisix_config::validate::PluginCheck;
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::BodyEdits;
    use http::HeaderMap;

    use super::*;
    use crate::testing::Compiler;

    fn respond(
        conf: Value,
        req: TestRequest,
        ct: &str,
        len: Option<&str>,
    ) -> (HeaderMap, BodyEdits) {
        let mut req = req;
        let c = Compiler::new();
        let p = (DEF.compile)(&c.cx(NAME, &conf, "gz", None)).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        if let Some(l) = len {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_str(l).unwrap());
        }
        let (mut status, mut edits) = (StatusCode::OK, BodyEdits::default());
        let mut head = ResponseHead::new(&mut status, &mut headers, true, &mut edits);
        p.header_filter(&mut req.ctx(), &mut head);
        (headers, edits)
    }

    fn gz_req() -> TestRequest {
        TestRequest::get("/").header("accept-encoding", "gzip, br")
    }

    #[test]
    fn compresses_matching_answers() {
        let (h, edits) = respond(
            json!({"types": ["application/json"]}),
            gz_req(),
            "application/json; charset=utf-8",
            Some("100"),
        );
        assert_eq!(h[header::CONTENT_ENCODING], "gzip");
        assert!(!h.contains_key(header::CONTENT_LENGTH) && !h.contains_key(header::VARY));
        assert_eq!(h[header::ETAG], "W/\"abc\"");
        let mut filters = edits.filters;
        let body = "{\"k\": \"value value value value\"}".repeat(100);
        let mut packed = filters.run(Bytes::from(body.clone()), false).data.to_vec();
        packed.extend_from_slice(&filters.run(Bytes::new(), true).data);
        let mut plain = String::new();
        flate2::read::GzDecoder::new(&packed[..])
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(plain, body);
    }

    #[test]
    fn leaves_others_alone() {
        let conf = json!({"types": ["text/plain"], "min_length": 50, "vary": true});
        let none = |h: &HeaderMap| !h.contains_key(header::CONTENT_ENCODING);
        assert!(none(
            &respond(conf.clone(), TestRequest::get("/"), "text/plain", None).0
        ));
        assert!(none(&respond(conf.clone(), gz_req(), "text/html", None).0));
        assert!(none(
            &respond(conf.clone(), gz_req(), "text/plain", Some("49")).0
        ));
        assert!(none(
            &respond(
                conf.clone(),
                gz_req().header("via", "1.1 proxy"),
                "text/plain",
                None
            )
            .0
        ));
        assert!(none(
            &respond(
                conf.clone(),
                TestRequest::get("/").header("accept-encoding", "gzip;q=0"),
                "text/plain",
                None
            )
            .0
        ));
        let (h, _) = respond(conf.clone(), gz_req(), "text/plain", Some("50"));
        assert_eq!(h[header::VARY], "Accept-Encoding");
        // Every type with "*"; the default is text/html.
        assert!(!none(
            &respond(json!({"types": "*"}), gz_req(), "image/svg+xml", None).0
        ));
        assert!(!none(&respond(json!({}), gz_req(), "text/html", None).0));
        let r = crate::PluginRegistry::builtin();
        assert!(r.check(NAME, &json!({"comp_level": 10})).is_err());
        assert!(r.check(NAME, &json!({"types": "text/html"})).is_err());
        assert!(r.check(NAME, &json!({"http_version": 2})).is_err());
        assert!(r.check(NAME, &json!({"buffers": {"number": 0}})).is_err());
    }
}
