//! The request's host: `$http_host` (the Host header, `:authority`, or the host of an
//! absolute-form request line) and `$host` (its host part, lower-cased, without the port),
//! checked as nginx checks them.

use std::borrow::Cow;

use http::header::HeaderValue;
use http::Version;

use crate::ctx::{ClientHead, HostName};
use crate::error::{ErrorKind, ProxyError};

/// The host part of a Host header value, lower-cased, without the port; `None` if invalid.
/// Byte loops, not `str` searches: every request runs this, and a `..` substring search and a
/// reverse char search set up searchers that cost more than the short host they scan
/// (`benches/e2e/instructions.py` counts the difference).
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

/// Fills in `$http_host` and `$host` from the Host header (`host_header`, the first one) or the
/// request line; a missing host is refused for HTTP/1.1, an invalid one always.
pub fn resolve(head: &mut ClientHead, host_header: Option<&HeaderValue>) -> Result<(), ProxyError> {
    let bad = || ProxyError::new(ErrorKind::BadRequest);
    let host_text = match host_header.map(HeaderValue::to_str) {
        Some(Ok(h)) => Some(h),
        Some(Err(_)) => return Err(bad()),
        None => None,
    };
    // HTTP/2 carries the host in :authority; an absolute-form request line overrides Host.
    head.host_value = match head.uri.authority() {
        Some(a) => {
            // nginx validates the Host header even when the request line names the host.
            if host_text.is_some_and(|h| host_without_port(h).is_none()) {
                return Err(bad());
            }
            Some(HeaderValue::from_str(a.as_str()).map_err(|_| bad())?)
        }
        None => host_header.cloned(),
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
