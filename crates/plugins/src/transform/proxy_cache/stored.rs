//! A stored answer, which headers go into one, and what the answer's own headers say about how
//! long it may be kept: APISIX's memory strategy reads `Cache-Control` and `Expires`
//! (`parse_resource_ttl`), nginx's proxy_cache (the disk strategy) reads those and
//! `X-Accel-Expires`, `Set-Cookie` and `Vary`.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// One stored answer.
#[derive(Debug)]
pub struct Stored {
    pub status: StatusCode,
    /// The headers served with it, as the upstream sent them less those never stored.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// When it was stored and until when it is fresh, in wall milliseconds.
    pub stored_ms: u64,
    pub expires_ms: u64,
    /// How long past `expires_ms` it may still be served (disk, nginx's reading of the
    /// answer's `stale-while-revalidate` and `stale-if-error`): while another request fetches
    /// it anew, and when the upstream fails.
    pub stale: StaleWindows,
}

/// The stale windows of an answer, in milliseconds past its expiry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaleWindows {
    pub updating_ms: u64,
    pub error_ms: u64,
}

/// What an entry costs besides its body and headers (its node, the key's copy, the counts).
const ENTRY_OVERHEAD: usize = 128;

impl Stored {
    /// The bytes it takes in a memory zone.
    pub fn weight(&self) -> usize {
        ENTRY_OVERHEAD
            + self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 16)
                .sum::<usize>()
    }
}

/// Headers that describe one connection or this gateway's view of the request, never stored
/// with an answer: the hop-by-hop ones, the length (set again for the stored body), the cache
/// status, and rate-limit counters (APISIX's `overwritable_header`).
pub fn storable(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailers"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "apisix-cache-status"
    ) && !name.as_str().contains("ratelimit-remaining")
}

/// `Cache-Control` and `Expires`, which `hide_cache_headers` hides.
pub fn is_cache_header(name: &HeaderName) -> bool {
    name == http::header::CACHE_CONTROL || name == http::header::EXPIRES
}

/// The directives of `Cache-Control` headers, as APISIX's memory strategy reads them: each
/// comma-separated item is a name (lower-cased) with an optional `=value`; a value that is a
/// number is kept as one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Directives {
    pub no_cache: bool,
    pub no_store: bool,
    pub private: bool,
    pub only_if_cached: bool,
    pub max_age: Option<f64>,
    pub s_maxage: Option<f64>,
    pub max_stale: Option<f64>,
    pub min_fresh: Option<f64>,
}

impl Directives {
    pub fn parse<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Directives {
        let mut d = Directives::default();
        for value in values {
            let Ok(text) = value.to_str() else { continue };
            for item in text.split(',') {
                let item = item.trim_start();
                if item.is_empty() {
                    continue;
                }
                let (name, arg) = match item.split_once('=') {
                    Some((n, a)) => (n, Some(a)),
                    None => (item, None),
                };
                let number = arg.and_then(|a| a.trim().parse::<f64>().ok());
                match name.to_ascii_lowercase().as_str() {
                    "no-cache" => d.no_cache = true,
                    "no-store" => d.no_store = true,
                    "private" => d.private = true,
                    "only-if-cached" => d.only_if_cached = true,
                    "max-age" => d.max_age = number,
                    "s-maxage" => d.s_maxage = number,
                    "max-stale" => d.max_stale = number,
                    "min-fresh" => d.min_fresh = number,
                    _ => {}
                }
            }
        }
        d
    }
}

/// The `Expires` date in wall milliseconds (the last one when there are several).
fn expires_ms(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get_all(http::header::EXPIRES).iter().next_back()?;
    let t = httpdate::parse_http_date(v.to_str().ok()?).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(d.as_millis()).ok()
}

/// APISIX's `parse_resource_ttl` (the memory strategy with `cache_control`): `s-maxage`, else
/// `max-age`, else what is left until `Expires`, in milliseconds; 0 when none says.
pub fn resource_ttl_ms(cc: &Directives, headers: &HeaderMap, now_ms: u64) -> u64 {
    if let Some(secs) = cc.s_maxage.or(cc.max_age) {
        return (secs.max(0.0) * 1000.0) as u64;
    }
    expires_ms(headers).map_or(0, |e| e.saturating_sub(now_ms))
}

/// How long nginx's proxy_cache keeps an answer, from its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// The answer must not be stored.
    Never,
    /// Stored for this many milliseconds.
    For(u64),
    /// The headers say nothing: `proxy_cache_valid` (the zones' `cache_ttl`) applies.
    Default,
}

/// nginx's reading of an upstream answer for its cache: `X-Accel-Expires` first (seconds, or
/// `@` and a Unix time), then `Cache-Control` (`no-cache`, `no-store`, `private` forbid
/// storing, `s-maxage` or `max-age` set the time, 0 forbids), then `Expires` (a past date
/// forbids); a `Set-Cookie`, `Vary: *` or a `Vary` longer than nginx keeps forbids storing
/// whatever they say.
#[cfg(test)]
pub fn nginx_freshness(headers: &HeaderMap, now_ms: u64) -> Freshness {
    nginx_caching(headers, now_ms).0
}

/// [`nginx_freshness`] and the stale windows of `Cache-Control`'s extensions:
/// `stale-while-revalidate=N` (both windows) and `stale-if-error=N` (the error window), read
/// whenever `Cache-Control` allows storing, even after `X-Accel-Expires` set the time; a value
/// that is not a number forbids storing, as nginx reads it.
pub fn nginx_caching(headers: &HeaderMap, now_ms: u64) -> (Freshness, StaleWindows) {
    let none = StaleWindows::default();
    if headers.contains_key(http::header::SET_COOKIE) {
        return (Freshness::Never, none);
    }
    if nginx_vary(headers) == Err(()) {
        return (Freshness::Never, none);
    }
    let mut fresh = None;
    if let Some(v) = headers.get("x-accel-expires").and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if let Some(at) = v.strip_prefix('@') {
            if let Ok(at) = at.parse::<u64>() {
                let at_ms = at.saturating_mul(1000);
                fresh = Some(if at_ms <= now_ms {
                    Freshness::Never
                } else {
                    Freshness::For(at_ms - now_ms)
                });
            }
        } else if let Ok(secs) = v.parse::<u64>() {
            fresh = Some(if secs == 0 {
                Freshness::Never
            } else {
                Freshness::For(secs.saturating_mul(1000))
            });
        }
    }
    if fresh == Some(Freshness::Never) {
        return (Freshness::Never, none);
    }
    let mut windows = none;
    let cc: Vec<&HeaderValue> = headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .collect();
    if !cc.is_empty() {
        let text = cc
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",")
            .to_ascii_lowercase();
        // nginx's reading: the number runs to `,`, `;`, a space or the end; anything else in
        // it makes the answer not cacheable.
        let number = |name: &str| -> Option<Result<u64, ()>> {
            let at = text.find(name)? + name.len();
            let mut n: u64 = 0;
            for c in text[at..].chars() {
                match c {
                    ',' | ';' | ' ' => break,
                    '0'..='9' => {
                        n = n
                            .saturating_mul(10)
                            .saturating_add(u64::from(c as u8 - b'0'))
                    }
                    _ => return Some(Err(())),
                }
            }
            Some(Ok(n))
        };
        if fresh.is_none() {
            if ["no-cache", "no-store", "private"]
                .iter()
                .any(|d| text.contains(d))
            {
                return (Freshness::Never, none);
            }
            match number("s-maxage=").or_else(|| number("max-age=")) {
                Some(Err(())) | Some(Ok(0)) => return (Freshness::Never, none),
                Some(Ok(secs)) => fresh = Some(Freshness::For(secs.saturating_mul(1000))),
                None => {}
            }
        }
        match number("stale-while-revalidate=") {
            Some(Err(())) => return (Freshness::Never, none),
            Some(Ok(secs)) => {
                windows.updating_ms = secs.saturating_mul(1000);
                windows.error_ms = windows.updating_ms;
            }
            None => {}
        }
        match number("stale-if-error=") {
            Some(Err(())) => return (Freshness::Never, none),
            Some(Ok(secs)) => windows.error_ms = secs.saturating_mul(1000),
            None => {}
        }
    }
    if let Some(f) = fresh {
        return (f, windows);
    }
    if headers.contains_key(http::header::EXPIRES) {
        return match expires_ms(headers) {
            Some(e) if e > now_ms => (Freshness::For(e - now_ms), windows),
            _ => (Freshness::Never, none),
        };
    }
    (Freshness::Default, windows)
}

/// nginx's `Vary` for its cache: the last `Vary` header's value (`Ok(None)` when there is
/// none); `Err` when the answer must not be stored (`*`, or longer than the 128 bytes a cache
/// file keeps).
pub fn nginx_vary(headers: &HeaderMap) -> Result<Option<&str>, ()> {
    let Some(v) = headers.get_all(http::header::VARY).iter().next_back() else {
        return Ok(None);
    };
    let v = v.to_str().map_err(|_| ())?;
    if v == "*" || v.len() > 128 {
        return Err(());
    }
    Ok((!v.is_empty()).then_some(v))
}

/// APISIX's memory strategy's reading of `Vary` (`parse_vary_list`): the request headers it
/// names, lower-cased and sorted, empty when there are none; `None` when one is `*` (never
/// reusable). Several `Vary` headers read as one list, as nginx's `$upstream_http_vary` joins
/// them.
pub fn vary_list(headers: &HeaderMap) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for v in headers.get_all(http::header::VARY) {
        for item in String::from_utf8_lossy(v.as_bytes()).split(',') {
            match item.trim() {
                "" => {}
                "*" => return None,
                name => out.push(name.to_ascii_lowercase()),
            }
        }
    }
    out.sort();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn directives_as_apisix_reads_them() {
        let h = headers(&[
            ("cache-control", "No-Cache, max-age=60"),
            ("cache-control", " only-if-cached,min-fresh=5, max-stale=x"),
        ]);
        let d = Directives::parse(h.get_all("cache-control").iter());
        assert!(d.no_cache && d.only_if_cached && !d.no_store && !d.private);
        assert_eq!(
            (d.max_age, d.min_fresh, d.max_stale),
            (Some(60.0), Some(5.0), None)
        );
    }

    #[test]
    fn resource_ttl() {
        let now = 1_700_000_000_000;
        let cc = |t| Directives::parse([HeaderValue::from_static(t)].iter());
        let none = HeaderMap::new();
        assert_eq!(
            resource_ttl_ms(&cc("max-age=10, s-maxage=20"), &none, now),
            20_000
        );
        assert_eq!(resource_ttl_ms(&cc("max-age=10"), &none, now), 10_000);
        assert_eq!(resource_ttl_ms(&cc("public"), &none, now), 0);
        let exp = headers(&[("expires", "Tue, 14 Nov 2023 22:13:40 GMT")]);
        assert_eq!(resource_ttl_ms(&cc("public"), &exp, now), 20_000);
    }

    #[test]
    fn nginx_reads_the_answers_headers() {
        let now = 1_700_000_000_000;
        let f = |pairs: &[(&'static str, &'static str)]| nginx_freshness(&headers(pairs), now);
        assert_eq!(f(&[]), Freshness::Default);
        assert_eq!(
            f(&[("cache-control", "public, max-age=30")]),
            Freshness::For(30_000)
        );
        assert_eq!(
            f(&[("cache-control", "s-maxage=5, max-age=30")]),
            Freshness::For(5_000)
        );
        assert_eq!(f(&[("cache-control", "max-age=0")]), Freshness::Never);
        assert_eq!(
            f(&[("cache-control", "private, max-age=30")]),
            Freshness::Never
        );
        assert_eq!(f(&[("cache-control", "no-store")]), Freshness::Never);
        assert_eq!(
            f(&[("x-accel-expires", "7"), ("cache-control", "no-cache")]),
            Freshness::For(7_000)
        );
        assert_eq!(f(&[("x-accel-expires", "0")]), Freshness::Never);
        assert_eq!(
            f(&[("expires", "Tue, 14 Nov 2023 22:13:40 GMT")]),
            Freshness::For(20_000)
        );
        assert_eq!(
            f(&[("expires", "Tue, 14 Nov 2000 22:13:40 GMT")]),
            Freshness::Never
        );
        assert_eq!(f(&[("expires", "0")]), Freshness::Never);
        assert_eq!(f(&[("set-cookie", "a=1")]), Freshness::Never);
        assert_eq!(f(&[("vary", "*")]), Freshness::Never);
        // nginx refuses only a `Vary` that is exactly `*`.
        assert_eq!(f(&[("vary", "Accept, *")]), Freshness::Default);
        let long: &'static str = Box::leak("a".repeat(129).into_boxed_str());
        assert_eq!(f(&[("vary", long)]), Freshness::Never);
        assert_eq!(
            nginx_vary(&headers(&[("vary", "accept"), ("vary", "Accept-Encoding")])),
            Ok(Some("Accept-Encoding"))
        );
        assert_eq!(nginx_vary(&headers(&[])), Ok(None));
    }

    #[test]
    fn nginx_stale_extensions() {
        let now = 1_700_000_000_000;
        let c = |pairs: &[(&'static str, &'static str)]| nginx_caching(&headers(pairs), now);
        let w = |updating_ms, error_ms| StaleWindows {
            updating_ms,
            error_ms,
        };
        assert_eq!(
            c(&[("cache-control", "max-age=5, stale-while-revalidate=30")]),
            (Freshness::For(5_000), w(30_000, 30_000))
        );
        assert_eq!(
            c(&[(
                "cache-control",
                "max-age=5, stale-while-revalidate=30, stale-if-error=60"
            )]),
            (Freshness::For(5_000), w(30_000, 60_000))
        );
        assert_eq!(
            c(&[("cache-control", "stale-if-error=60")]),
            (Freshness::Default, w(0, 60_000))
        );
        // Read after X-Accel-Expires set the time, which also overrides `no-cache`.
        assert_eq!(
            c(&[
                ("x-accel-expires", "9"),
                ("cache-control", "no-cache, stale-if-error=3")
            ]),
            (Freshness::For(9_000), w(0, 3_000))
        );
        assert_eq!(
            c(&[("cache-control", "max-age=5, stale-if-error=x")]).0,
            Freshness::Never
        );
        assert_eq!(c(&[("cache-control", "max-age=5x")]).0, Freshness::Never);
    }

    #[test]
    fn apisix_vary_lists() {
        assert_eq!(
            vary_list(&headers(&[
                ("vary", "X-B, accept-encoding"),
                ("vary", " x-a ")
            ])),
            Some(vec!["accept-encoding".into(), "x-a".into(), "x-b".into()])
        );
        assert_eq!(vary_list(&headers(&[("vary", "Accept, *")])), None);
        assert_eq!(vary_list(&headers(&[])), Some(vec![]));
    }

    #[test]
    fn stored_headers() {
        for kept in ["content-type", "etag", "x-ratelimit-limit", "cache-control"] {
            assert!(storable(&HeaderName::from_static(kept)), "{kept}");
        }
        for dropped in [
            "connection",
            "content-length",
            "apisix-cache-status",
            "x-ratelimit-remaining",
            "transfer-encoding",
        ] {
            assert!(!storable(&HeaderName::from_static(dropped)), "{dropped}");
        }
    }
}
