//! error-page (`apisix/plugins/error-page.lua`): the gateway's own error answers (not the
//! upstream's) of status 404, 500, 502 and 503 replaced by the pages of the plugin's metadata.
//!
//! The conf is empty; `plugin_metadata/error-page` holds `enable` (default off) and
//! `error_404`, `error_500`, `error_502`, `error_503`, each a `body` (default: APISIX's HTML
//! page for the status) and a `content_type` (default `text/html`). In `header_filter`, an
//! answer that did not come from the upstream, with one of those statuses and a non-empty
//! page, gets the page as its body with its `Content-Type` and `Content-Length`. The metadata
//! is read when the plugin compiles: changing it recompiles the routes using the plugin.

use std::sync::Arc;

use bytes::Bytes;
use ferrisix_config::schema;
use ferrisix_plugin_api::{CompileCtx, Phases, Plugin, PluginCtx, PluginDef, ResponseHead};
use http::header::{self, HeaderValue};
use serde_json::{json, Value};

pub const NAME: &str = "error-page";

pub static DEF: PluginDef = PluginDef {
    metadata_schema: Some(metadata_schema),
    ..PluginDef::new(NAME, 450, conf_schema, compile)
};

/// The statuses a page may be set for.
const STATUSES: [u16; 4] = [404, 500, 502, 503];

fn page(title: &str) -> String {
    format!(
        "<html>\n<head><title>{title}</title></head>\n<body>\n<center><h1>{title}</h1></center>\n<hr><center>Apache APISIX</center>\n</body>\n</html>"
    )
}

fn conf_schema() -> Value {
    json!({})
}

fn metadata_schema() -> Value {
    let entry = |title: &str| {
        json!({
            "type": "object",
            "properties": {
                "body": {"type": "string", "default": page(title)},
                "content_type": {"type": "string", "default": "text/html"}
            }
        })
    };
    json!({
        "type": "object",
        "properties": {
            "enable": {"type": "boolean", "default": false},
            "error_404": entry("404 Not Found"),
            "error_500": entry("500 Internal Server Error"),
            "error_502": entry("502 Bad Gateway"),
            "error_503": entry("503 Service Unavailable")
        }
    })
}

#[derive(Debug)]
struct Page {
    status: u16,
    body: Bytes,
    content_type: HeaderValue,
}

#[derive(Debug)]
struct ErrorPage {
    /// Empty unless the metadata enables pages.
    pages: Vec<Page>,
}

fn compile(cx: &CompileCtx<'_>) -> Result<Arc<dyn Plugin>, String> {
    let mut pages = Vec::new();
    if let Some(meta) = cx.metadata {
        let mut meta = meta.clone();
        // Stored metadata passed this schema: filling in its defaults cannot fail.
        let _ = schema::validate_and_fill(&metadata_schema(), &mut meta);
        if meta["enable"].as_bool() == Some(true) {
            for status in STATUSES {
                let entry = &meta[format!("error_{status}").as_str()];
                let body = entry["body"].as_str().unwrap_or_default();
                if body.is_empty() {
                    continue;
                }
                let ct = entry["content_type"].as_str().unwrap_or("text/html");
                pages.push(Page {
                    status,
                    body: Bytes::from(body.to_owned()),
                    content_type: HeaderValue::from_str(ct)
                        .map_err(|_| format!("invalid content_type: {ct}"))?,
                });
            }
        }
    }
    Ok(Arc::new(ErrorPage { pages }))
}

impl Plugin for ErrorPage {
    fn phases(&self) -> Phases {
        if self.pages.is_empty() {
            Phases::NONE
        } else {
            Phases::HEADER_FILTER
        }
    }

    fn header_filter(&self, _ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        if resp.from_upstream() {
            return;
        }
        let status = resp.status().as_u16();
        let Some(p) = self.pages.iter().find(|p| p.status == status) else {
            return;
        };
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, p.content_type.clone());
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(p.body.len()));
        h.remove(header::CONTENT_ENCODING);
        resp.replace_body(p.body.clone());
    }
}

#[cfg(test)]
mod tests {
    use ferrisix_plugin_api::testing::TestRequest;
    use ferrisix_plugin_api::BodyEdits;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::testing::Compiler;

    /// The answer `meta` makes of a `status` answer (`upstream`: the upstream's): its
    /// Content-Type, Content-Length and replacement body.
    fn answer(
        meta: Option<Value>,
        status: u16,
        upstream: bool,
    ) -> (Option<String>, Option<String>, Option<String>) {
        let c = Compiler::new();
        let conf = json!({});
        let p = (DEF.compile)(&c.cx(NAME, &conf, "ep", meta.as_ref())).unwrap();
        let mut req = TestRequest::get("/");
        let mut ctx = req.ctx();
        let mut code = StatusCode::from_u16(status).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let mut edits = BodyEdits::default();
        if p.phases().contains(Phases::HEADER_FILTER) {
            let mut head = ResponseHead::new(&mut code, &mut headers, upstream, &mut edits);
            p.header_filter(&mut ctx, &mut head);
        }
        let h = |n: header::HeaderName| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        (
            h(header::CONTENT_TYPE),
            h(header::CONTENT_LENGTH),
            edits
                .replacement
                .map(|b| String::from_utf8(b.to_vec()).unwrap()),
        )
    }

    #[test]
    fn gateway_errors_get_the_metadata_pages() {
        let plain = (Some("text/plain".to_owned()), None, None);
        assert_eq!(
            answer(None, 404, false),
            plain,
            "no metadata: nothing to do"
        );
        let off = json!({"error_404": {"body": "x"}});
        assert_eq!(answer(Some(off), 404, false), plain, "off by default");
        let meta = json!({"enable": true, "error_404": {},
            "error_502": {"body": "{\"e\":502}", "content_type": "application/json"},
            "error_503": {"body": ""}});
        let (ct, len, body) = answer(Some(meta.clone()), 404, false);
        let body = body.unwrap();
        assert!(
            body.contains("<h1>404 Not Found</h1>"),
            "APISIX's default: {body}"
        );
        assert_eq!(ct.as_deref(), Some("text/html"));
        assert_eq!(len, Some(body.len().to_string()));
        assert_eq!(
            answer(Some(meta.clone()), 502, false),
            (
                Some("application/json".into()),
                Some("9".into()),
                Some("{\"e\":502}".into())
            )
        );
        // The upstream's own errors, an empty page, a status without a page: unchanged.
        assert_eq!(answer(Some(meta.clone()), 502, true), plain);
        assert_eq!(answer(Some(meta.clone()), 503, false), plain);
        assert_eq!(answer(Some(meta.clone()), 500, false), plain);
        assert_eq!(answer(Some(meta), 403, false), plain);
    }
}
