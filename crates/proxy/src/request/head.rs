//! The request head checks nginx makes before anything else, answered as nginx answers them
//! (`ngx_http_parse_request_line`, `ngx_http_process_request_header`): the method and the
//! framing headers (Host, Content-Length, Transfer-Encoding), the request line's length, the
//! host ([`super::host`]), the path, and a declared body over `client_max_body_size`. They
//! yield `$uri`, `$host` and `$http_host`.
//!
//! The headers the checks read are found in one pass over the map ([`HeadHeaders`]); a
//! standard method costs one comparison.

use std::borrow::Cow;

use ferrisix_router::normalize_path;
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
#[cfg(test)]
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version};
use http_body::Body as _;

use super::host;
use crate::ctx::RequestCtx;
use crate::error::{ErrorKind, ProxyError};

/// nginx's `large_client_header_buffers 4 8k`: a longer request line is refused with 414.
const MAX_REQUEST_URI: usize = 8192;

/// Checks the head and fills in `$uri`, `$host` and `$http_host`; the error is the client's.
pub fn check(ctx: &mut RequestCtx<'_>) -> Result<(), ProxyError> {
    let head = &mut ctx.head;
    let found = HeadHeaders::scan(&ctx.headers);
    check_head(&head.method, head.version, &found).map_err(|status| {
        ProxyError::new(match status {
            StatusCode::METHOD_NOT_ALLOWED => ErrorKind::MethodNotAllowed,
            StatusCode::NOT_IMPLEMENTED => ErrorKind::UnknownCoding,
            _ => ErrorKind::BadRequest,
        })
    })?;
    let raw_uri_len = head.uri.path_and_query().map_or(0, |p| p.as_str().len());
    if raw_uri_len > MAX_REQUEST_URI {
        return Err(ErrorKind::UriTooLong.into());
    }
    host::resolve(head, found.host)?;
    head.path = match normalize_path(head.uri.path()) {
        Some(Cow::Borrowed(_)) => None,
        Some(Cow::Owned(p)) => Some(p),
        None => return Err(ErrorKind::BadRequest.into()),
    };
    // nginx's find-config phase, before any plugin (client-control included) runs: a declared
    // length over `client_max_body_size` is refused without reading the body.
    let max = ctx.conn.gateway.client_max_body_size;
    if max != 0 {
        let declared = ctx.body.as_ref().and_then(|b| b.size_hint().exact());
        if declared.is_some_and(|n| n > max) {
            return Err(ErrorKind::BodyTooLarge.into());
        }
    }
    Ok(())
}

/// [`check_head`] on a whole head (tests).
#[cfg(test)]
fn check_parts(parts: &Parts) -> Result<(), StatusCode> {
    check_head(
        &parts.method,
        parts.version,
        &HeadHeaders::scan(&parts.headers),
    )
}

/// The headers the head's checks read, found in one pass over the map: with the few headers
/// requests carry, one pass is cheaper than five hashed lookups.
#[derive(Debug, Default)]
pub struct HeadHeaders<'a> {
    /// The first Host value.
    pub host: Option<&'a HeaderValue>,
    hosts: u8,
    lengths: u8,
    /// The first Transfer-Encoding value.
    coding: Option<&'a HeaderValue>,
    codings: u8,
}

impl<'a> HeadHeaders<'a> {
    pub fn scan(headers: &'a HeaderMap) -> HeadHeaders<'a> {
        let mut found = HeadHeaders::default();
        for (name, value) in headers {
            if *name == HOST {
                found.host.get_or_insert(value);
                found.hosts = found.hosts.saturating_add(1);
            } else if *name == CONTENT_LENGTH {
                found.lengths = found.lengths.saturating_add(1);
            } else if *name == TRANSFER_ENCODING {
                found.coding.get_or_insert(value);
                found.codings = found.codings.saturating_add(1);
            }
        }
        found
    }
}

/// `Err(status)` when nginx would refuse the head before any location (or Lua) runs.
pub fn check_head(
    method: &Method,
    version: Version,
    headers: &HeadHeaders<'_>,
) -> Result<(), StatusCode> {
    check_method(method)?;

    // "client sent duplicate host header" / "client sent invalid host header" (an empty value
    // has no host in it).
    if let Some(host) = headers.host {
        if headers.hosts > 1 || host.is_empty() {
            return Err(StatusCode::BAD_REQUEST);
        }
    }

    let has_length = headers.lengths > 0;
    if headers.lengths > 1 {
        // "client sent duplicate header line" (hyper accepts repeated equal values).
        return Err(StatusCode::BAD_REQUEST);
    }

    if let Some(coding) = headers.coding {
        if headers.codings > 1 || version < Version::HTTP_11 {
            // A duplicate header line; "client sent HTTP/1.0 request with Transfer-Encoding".
            return Err(StatusCode::BAD_REQUEST);
        }
        if !coding.as_bytes().eq_ignore_ascii_case(b"chunked") {
            // "client sent unknown Transfer-Encoding": hyper would decode `gzip, chunked` as
            // chunked and silently drop the gzip coding.
            return Err(StatusCode::NOT_IMPLEMENTED);
        }
        if has_length {
            // "client sent Content-Length and Transfer-Encoding headers at the same time".
            return Err(StatusCode::BAD_REQUEST);
        }
    }
    Ok(())
}

/// nginx parses a method as upper-case letters, `_` and `-` (anything else is "client sent
/// invalid method", 400) and refuses TRACE and CONNECT with 405. Other upper-case tokens
/// (WebDAV's, made-up ones) are proxied.
fn check_method(method: &Method) -> Result<(), StatusCode> {
    if *method == Method::GET || *method == Method::POST {
        return Ok(());
    }
    if *method == Method::TRACE || *method == Method::CONNECT {
        return Err(StatusCode::METHOD_NOT_ALLOWED);
    }
    let valid = method
        .as_str()
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(StatusCode::BAD_REQUEST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[(&str, &str)], method: &str, version: Version) -> Parts {
        let mut b = http::Request::builder()
            .method(method)
            .uri("/")
            .version(version);
        for (k, v) in raw {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn status(raw: &[(&str, &str)]) -> Result<(), StatusCode> {
        check_parts(&head(raw, "GET", Version::HTTP_11))
    }

    /// Issue 8, finding 10: TRACE is 405, lower-case and non-token methods are 400.
    #[test]
    fn methods_as_nginx() {
        let m = |name: &str| check_parts(&head(&[("host", "a")], name, Version::HTTP_11));
        for ok in [
            "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND", "MY_VERB",
            "X-Y",
        ] {
            assert_eq!(m(ok), Ok(()), "{ok}");
        }
        assert_eq!(m("TRACE"), Err(StatusCode::METHOD_NOT_ALLOWED));
        assert_eq!(m("CONNECT"), Err(StatusCode::METHOD_NOT_ALLOWED));
        for bad in ["get", "Get", "G.T", "GET1", "PO!ST"] {
            assert_eq!(m(bad), Err(StatusCode::BAD_REQUEST), "{bad}");
        }
    }

    /// Issue 8, finding 6: a duplicate or empty Host is 400.
    #[test]
    fn host_must_be_one_non_empty_value() {
        assert_eq!(status(&[("host", "a.com")]), Ok(()));
        assert_eq!(
            status(&[]),
            Ok(()),
            "HTTP/1.1 without Host is refused by the handler"
        );
        assert_eq!(
            status(&[("host", "a.com"), ("host", "a.com")]),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(&[("host", "a.com"), ("host", "b.com")]),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(status(&[("host", "")]), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn one_pass_finds_what_the_lookups_found() {
        let parts = head(
            &[
                ("user-agent", "x"),
                ("x-custom", "1"),
                ("host", "first.com"),
                ("accept", "*/*"),
                ("transfer-encoding", "chunked"),
                ("content-length", "3"),
                ("host", "second.com"),
            ],
            "POST",
            Version::HTTP_11,
        );
        let found = HeadHeaders::scan(&parts.headers);
        assert_eq!(found.host, parts.headers.get("host"));
        assert_eq!(found.host.unwrap(), "first.com");
        assert_eq!((found.hosts, found.lengths, found.codings), (2, 1, 1));
        assert_eq!(found.coding.unwrap(), "chunked");
        let empty = HeaderMap::new();
        let found = HeadHeaders::scan(&empty);
        assert!(found.host.is_none() && found.coding.is_none());
    }

    /// Issue 8, finding 8: only `chunked` is a known transfer coding.
    #[test]
    fn transfer_codings_other_than_chunked_are_501() {
        assert_eq!(
            status(&[("host", "a"), ("transfer-encoding", "chunked")]),
            Ok(())
        );
        assert_eq!(
            status(&[("host", "a"), ("transfer-encoding", "Chunked")]),
            Ok(())
        );
        for coding in [
            "gzip, chunked",
            "gzip",
            "chunked, chunked",
            "identity",
            "deflate,chunked",
        ] {
            assert_eq!(
                status(&[("host", "a"), ("transfer-encoding", coding)]),
                Err(StatusCode::NOT_IMPLEMENTED),
                "{coding}"
            );
        }
        assert_eq!(
            status(&[
                ("host", "a"),
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked")
            ]),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(&[
                ("host", "a"),
                ("transfer-encoding", "chunked"),
                ("content-length", "3")
            ]),
            Err(StatusCode::BAD_REQUEST)
        );
        let http10 = head(
            &[("transfer-encoding", "chunked")],
            "POST",
            Version::HTTP_10,
        );
        assert_eq!(check_parts(&http10), Err(StatusCode::BAD_REQUEST));
        assert_eq!(
            status(&[
                ("host", "a"),
                ("content-length", "3"),
                ("content-length", "3")
            ]),
            Err(StatusCode::BAD_REQUEST)
        );
    }
}
