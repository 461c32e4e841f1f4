//! Admin key check (APISIX's `check_token`).

use ferrisix_config::settings::{AdminKey, AdminRole};
use http::{HeaderMap, Method};
use subtle::ConstantTimeEq;

use crate::args::nginx_arg;

/// Why a request was refused; the text is the 401's `description`.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Wrong,
    ViewerMethod,
}

impl Refusal {
    pub fn description(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing apikey",
            Refusal::Wrong => "wrong apikey",
            Refusal::ViewerMethod => "invalid method for role viewer",
        }
    }
}

/// The key a request presents: `?api_key=` first, then `X-API-KEY`, then the `x_api_key`
/// cookie. An empty `api_key=` still counts as presented (nginx gives `""`, which Lua treats
/// as a value).
pub fn presented_key<'a>(query: Option<&'a str>, headers: &'a HeaderMap) -> Option<&'a [u8]> {
    if let Some(v) = nginx_arg(query, "api_key") {
        return Some(v.as_bytes());
    }
    if let Some(v) = headers.get("x-api-key") {
        return Some(v.as_bytes());
    }
    cookie(headers, "x_api_key")
}

/// nginx's `$cookie_<name>`: the first cookie of that name (compared case-insensitively) over
/// every `Cookie` header.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers.get_all(http::header::COOKIE).iter().find_map(|h| {
        h.as_bytes().split(|b| *b == b';').find_map(|pair| {
            let pair = trim_start(pair);
            let eq = pair.iter().position(|b| *b == b'=')?;
            let (n, v) = (&pair[..eq], &pair[eq + 1..]);
            n.eq_ignore_ascii_case(name.as_bytes()).then_some(v)
        })
    })
}

fn trim_start(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(b.len());
    &b[start..]
}

/// Checks `presented` against `keys`. Every configured key is compared, each in constant time,
/// so the answer's timing does not tell which key or how much of it matched. Empty configured
/// keys never match (APISIX replaces them with generated ones at start).
pub fn check(keys: &[AdminKey], presented: Option<&[u8]>, method: &Method) -> Result<(), Refusal> {
    let presented = presented.ok_or(Refusal::Missing)?;
    let mut found: Option<AdminRole> = None;
    for key in keys {
        let equal: bool = key.key.as_bytes().ct_eq(presented).into();
        if equal && !key.key.is_empty() && found.is_none() {
            found = Some(key.role);
        }
    }
    match found {
        None => Err(Refusal::Wrong),
        Some(AdminRole::Viewer) if *method != Method::GET => Err(Refusal::ViewerMethod),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn keys() -> Vec<AdminKey> {
        vec![
            AdminKey {
                name: "admin".into(),
                key: "adminkey".into(),
                role: AdminRole::Admin,
            },
            AdminKey {
                name: "viewer".into(),
                key: "viewerkey".into(),
                role: AdminRole::Viewer,
            },
        ]
    }

    #[test]
    fn query_beats_header_beats_cookie() {
        let mut h = HeaderMap::new();
        h.insert("X-API-KEY", HeaderValue::from_static("adminkey"));
        h.insert("cookie", HeaderValue::from_static("a=b; X_API_KEY=c"));
        assert_eq!(
            presented_key(Some("api_key=wrong"), &h),
            Some(&b"wrong"[..])
        );
        assert_eq!(presented_key(Some("x=1"), &h), Some(&b"adminkey"[..]));
        h.remove("X-API-KEY");
        assert_eq!(presented_key(None, &h), Some(&b"c"[..]));
        assert_eq!(presented_key(None, &HeaderMap::new()), None);
    }

    #[test]
    fn roles() {
        let k = keys();
        assert_eq!(check(&k, None, &Method::GET), Err(Refusal::Missing));
        assert_eq!(check(&k, Some(b"nope"), &Method::GET), Err(Refusal::Wrong));
        assert_eq!(
            check(&k, Some(b"ADMINKEY"), &Method::GET),
            Err(Refusal::Wrong)
        );
        assert_eq!(check(&k, Some(b"adminkey"), &Method::PUT), Ok(()));
        assert_eq!(check(&k, Some(b"viewerkey"), &Method::GET), Ok(()));
        assert_eq!(
            check(&k, Some(b"viewerkey"), &Method::PUT),
            Err(Refusal::ViewerMethod)
        );
        let empty = vec![AdminKey {
            name: "x".into(),
            key: String::new(),
            role: AdminRole::Admin,
        }];
        assert_eq!(check(&empty, Some(b""), &Method::GET), Err(Refusal::Wrong));
    }
}
