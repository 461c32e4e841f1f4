//! The request head checks nginx makes before anything else (the method and framing headers,
//! see `request_head`; the request line's length, the Host, the path), and the `$uri` and
//! `$host` they yield.

use std::borrow::Cow;

use ferrisix_router::normalize_path;
use http::header::HeaderValue;
use http::{StatusCode, Version};
use http_body::Body as _;

use crate::ctx::{HostName, RequestCtx};
use crate::error::{ErrorKind, ProxyError};
use crate::request_head::{self, HeadHeaders};

/// nginx's `large_client_header_buffers 4 8k`: a longer request line is refused with 414.
const MAX_REQUEST_URI: usize = 8192;

/// The host part of a Host header value, lower-cased, without the port; `None` if invalid.
/// Byte loops, not `str` searches: every request runs this (a `..` substring search and a
/// reverse char search cost ~400 instructions on a short host).
pub fn host_without_port(raw: &str) -> Option<Cow<'_, str>> {
    let bytes = raw.as_bytes();
    let host = if bytes.first() == Some(&b'[') {
        let end = bytes.iter().position(|&b| b == b']')?;
        let rest = &bytes[end + 1..];
        if !(rest.is_empty() || rest[0] == b':' && rest[1..].iter().all(u8::is_ascii_digit)) {
            return None;
        }
        &raw[..=end]
    } else {
        match bytes.iter().rposition(|&b| b == b':') {
            Some(i) if bytes[i + 1..].iter().all(u8::is_ascii_digit) => &raw[..i],
            Some(_) => return None,
            None => raw,
        }
    };
    // nginx refuses hosts with characters outside this set (and `..`, or a leading dot path).
    let mut upper = false;
    let mut prev = 0u8;
    for &b in host.as_bytes() {
        if !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':'))
            || b == b'.' && prev == b'.'
        {
            return None;
        }
        upper |= b.is_ascii_uppercase();
        prev = b;
    }
    let host = host.trim_end_matches('.');
    if upper {
        Some(Cow::Owned(host.to_ascii_lowercase()))
    } else {
        Some(Cow::Borrowed(host))
    }
}

/// Checks the head and fills in `$uri`, `$host` and `$http_host`; the error is the client's.
pub fn check(ctx: &mut RequestCtx<'_>) -> Result<(), ProxyError> {
    let bad = || ProxyError::new(ErrorKind::BadRequest);
    let head = &mut ctx.head;
    let found = HeadHeaders::scan(&ctx.headers);
    request_head::check_head(&head.method, head.version, &found).map_err(|status| {
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
    let host_header = match found.host.map(HeaderValue::to_str) {
        Some(Ok(h)) => Some(h),
        Some(Err(_)) => return Err(bad()),
        None => None,
    };
    // HTTP/2 carries the host in :authority; an absolute-form request line overrides Host.
    head.host_value = match head.uri.authority() {
        Some(a) => {
            // nginx validates the Host header even when the request line names the host.
            if host_header.is_some_and(|h| host_without_port(h).is_none()) {
                return Err(bad());
            }
            Some(HeaderValue::from_str(a.as_str()).map_err(|_| bad())?)
        }
        None => found.host.cloned(),
    };
    let host_raw = match &head.host_value {
        Some(v) => Some(v.to_str().map_err(|_| bad())?),
        None => None,
    };
    if host_raw.is_none() && head.version == Version::HTTP_11 {
        // nginx: "client sent HTTP/1.1 request without "Host" header".
        return Err(bad());
    }
    head.host = match host_raw {
        Some(raw) if !raw.is_empty() => match host_without_port(raw).ok_or_else(bad)? {
            Cow::Borrowed(h) => HostName::Prefix(h.len()),
            Cow::Owned(h) => HostName::Owned(h),
        },
        _ => HostName::Absent,
    };
    head.path = match normalize_path(head.uri.path()).ok_or_else(bad)? {
        Cow::Borrowed(_) => None,
        Cow::Owned(p) => Some(p),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_parsing() {
        assert_eq!(
            host_without_port("Foo.COM:8080").as_deref(),
            Some("foo.com")
        );
        assert_eq!(host_without_port("[::1]:80").as_deref(), Some("[::1]"));
        assert_eq!(host_without_port("a.com").as_deref(), Some("a.com"));
        assert_eq!(host_without_port("a.com.").as_deref(), Some("a.com"));
        assert_eq!(host_without_port("bad host"), None);
        assert_eq!(host_without_port("a/b"), None);
        assert_eq!(host_without_port("a.com:x"), None);
    }

    /// The straightforward `str` version, which the byte loops must agree with.
    fn reference(raw: &str) -> Option<Cow<'_, str>> {
        let host = if raw.starts_with('[') {
            let end = raw.find(']')?;
            let rest = &raw[end + 1..];
            if !(rest.is_empty()
                || rest
                    .strip_prefix(':')
                    .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
            {
                return None;
            }
            &raw[..=end]
        } else {
            match raw.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
                Some(_) => return None,
                None => raw,
            }
        };
        // nginx refuses hosts with characters outside this set (and `..`, or a leading dot path).
        let valid = host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':')
        }) && !host.contains("..");
        if !valid {
            return None;
        }
        let host = host.trim_end_matches('.');
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            Some(Cow::Owned(host.to_ascii_lowercase()))
        } else {
            Some(Cow::Borrowed(host))
        }
    }

    #[test]
    fn byte_loops_agree_with_the_str_version() {
        let parts = [
            "", "a", "A", ".", "..", ":", "[", "]", "::1", "[::1]", "8080", "-", "_", "/", " ",
            "é", "b.c", "X.Y", "a..b",
        ];
        let mut n = 0;
        for a in parts {
            for b in parts {
                for c in parts {
                    let raw = format!("{a}{b}{c}");
                    assert_eq!(host_without_port(&raw), reference(&raw), "{raw:?}");
                    n += 1;
                }
            }
        }
        assert_eq!(n, parts.len().pow(3));
    }
}
