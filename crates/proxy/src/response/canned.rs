//! Answers the gateway produces itself: APISIX's JSON error line and nginx's HTML error pages.

use bytes::Bytes;
use ferrisix_plugin_api::Exit;
use http::header::{CONTENT_TYPE, SERVER};
use http::{HeaderValue, Response, StatusCode};

use crate::error::ProxyError;
use crate::response::body::ResponseBody;

/// `{"error_msg":"404 Route Not Found"}\n`, sent as text/plain as APISIX does (nginx's
/// `default_type` with `charset utf-8`), not as JSON.
pub fn route_not_found(server: &HeaderValue) -> Response<ResponseBody> {
    text_response(
        StatusCode::NOT_FOUND,
        Bytes::from_static(b"{\"error_msg\":\"404 Route Not Found\"}\n"),
        server,
    )
}

pub fn text_response(
    status: StatusCode,
    body: Bytes,
    server: &HeaderValue,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(SERVER, server.clone());
    resp
}

/// The reason phrase nginx puts in its built-in error pages (it differs from the RFC's for a
/// few codes, and clients that scrape the page see nginx's).
fn nginx_reason(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "Authorization Required",
        405 => "Not Allowed",
        408 => "Request Time-out",
        413 => "Request Entity Too Large",
        414 => "Request-URI Too Large",
        416 => "Requested Range Not Satisfiable",
        503 => "Service Temporarily Unavailable",
        504 => "Gateway Time-out",
        _ => status.canonical_reason().unwrap_or("Unknown"),
    }
}

/// The answer for a plugin's exit: its body as text (or nginx's page without one), then its
/// headers, each replacing the gateway's own.
pub fn exit_response(exit: Exit, server: &HeaderValue) -> Response<ResponseBody> {
    let mut resp = match exit.body {
        Some(body) => text_response(exit.status, body, server),
        None if has_nginx_page(exit.status) => error_page(exit.status, server),
        // `ngx.exit(status)` for a status nginx has no page for (every 2xx, 304, 418, 422,
        // 506 ...) sends the head alone.
        None => {
            let mut resp = Response::new(ResponseBody::full(Bytes::new()));
            *resp.status_mut() = exit.status;
            resp.headers_mut().insert(SERVER, server.clone());
            resp
        }
    };
    let mut set: Vec<&http::HeaderName> = Vec::new();
    for (name, value) in &exit.headers {
        if set.contains(&name) {
            resp.headers_mut().append(name.clone(), value.clone());
        } else {
            set.push(name);
            resp.headers_mut().insert(name.clone(), value.clone());
        }
    }
    resp
}

/// A plugin's answer in place of the upstream: the exit's status and headers, and `body`
/// relayed as it arrives.
pub fn exit_stream_response(
    exit: Exit,
    body: ferrisix_plugin_api::PendingBody,
    server: &HeaderValue,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::stream(body));
    *resp.status_mut() = exit.status;
    resp.headers_mut().insert(SERVER, server.clone());
    for (name, value) in exit.headers {
        resp.headers_mut().append(name, value);
    }
    resp
}

/// Whether nginx has a built-in page for `status` (its `ngx_http_error_pages` table): 301-303,
/// 307, 308, 400-416, 421, 429, 494-498 and 500-505, 507. For any other status an exit without
/// a body sends no body at all.
fn has_nginx_page(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        301..=303 | 307 | 308 | 400..=416 | 421 | 429 | 494..=498 | 500..=505 | 507
    )
}

/// nginx's page for a request that ends in `error`.
pub fn error_response(error: ProxyError, server: &HeaderValue) -> Response<ResponseBody> {
    error_page(error.status(), server)
}

/// nginx's HTML error page for `status`.
pub fn error_page(status: StatusCode, server: &HeaderValue) -> Response<ResponseBody> {
    let reason = nginx_reason(status);
    let code = status.as_u16();
    let body = format!(
        "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>{}</center>\r\n</body>\r\n</html>\r\n",
        server.to_str().unwrap_or("ferrisix")
    );
    let mut resp = Response::new(ResponseBody::full(Bytes::from(body)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(SERVER, server.clone());
    resp
}

/// A gateway error to a gRPC client: APISIX's status (502, 504 ...) with `grpc-status` and
/// `grpc-message` in the headers (a trailers-only answer), which gRPC clients read before the
/// HTTP status: 14 UNAVAILABLE for a failed upstream, 4 DEADLINE_EXCEEDED for a timeout.
pub fn grpc_error(status: StatusCode, server: &HeaderValue) -> Response<ResponseBody> {
    let (code, message) = match status.as_u16() {
        504 => ("4", "upstream timed out"),
        429 => ("8", "too many requests"),
        401 => ("16", "unauthenticated"),
        403 => ("7", "permission denied"),
        404 => ("12", "not found"),
        _ => ("14", "upstream unavailable"),
    };
    let mut resp = Response::new(ResponseBody::full(Bytes::new()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(code));
    h.insert("grpc-message", HeaderValue::from_static(message));
    h.insert(SERVER, server.clone());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn not_found_is_the_36_byte_json_line() {
        let server = HeaderValue::from_static("ferrisix");
        let resp = route_not_found(&server);
        assert_eq!(resp.status(), 404);
        assert_eq!(resp.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 36);
    }

    #[tokio::test]
    async fn exits_carry_their_headers() {
        let server = HeaderValue::from_static("ferrisix");
        let exit = Exit::body(StatusCode::OK, "{}")
            .with_header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .with_header(
                http::HeaderName::from_static("x-a"),
                HeaderValue::from_static("1"),
            )
            .with_header(
                http::HeaderName::from_static("x-a"),
                HeaderValue::from_static("2"),
            );
        let resp = exit_response(exit, &server);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(resp.headers().get_all("x-a").iter().count(), 2);
        let resp = exit_response(Exit::status(StatusCode::FORBIDDEN), &server);
        assert_eq!(resp.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
    }

    #[tokio::test]
    async fn exits_without_a_body_get_a_page_only_where_nginx_has_one() {
        let server = HeaderValue::from_static("ferrisix");
        for (code, page) in [
            (200, false),
            (204, false),
            (301, true),
            (304, false),
            (307, true),
            (403, true),
            (407, true),
            (418, false),
            (422, false),
            (429, true),
            (499, false),
            (503, true),
            (506, false),
            (507, true),
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            let exit = Exit {
                status,
                body: None,
                headers: Vec::new(),
            };
            let resp = exit_response(exit, &server);
            assert_eq!(resp.status(), status);
            assert_eq!(resp.headers().contains_key(CONTENT_TYPE), page, "{code}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(!body.is_empty(), page, "{code}: {body:?}");
        }
    }

    #[tokio::test]
    async fn error_page_names_the_status() {
        let server = HeaderValue::from_static("ferrisix");
        let resp = error_page(StatusCode::GATEWAY_TIMEOUT, &server);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains("<h1>504 Gateway Time-out</h1>"));
        // nginx's own words where they differ from the RFC's reason phrase.
        let resp = error_page(StatusCode::UNAUTHORIZED, &server);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains("<title>401 Authorization Required</title>"));
    }
}
