//! Request variables as nginx and APISIX name them (`uri`, `host`, `http_x_foo`, `arg_a`,
//! `cookie_c`, `remote_addr` ...), read lazily: for route `vars` conditions before any plugin
//! runs, and behind [`crate::PluginCtx`]'s variables afterwards.

use std::borrow::Cow;
use std::net::IpAddr;

use ferrisix_router::VarSource;
use http::HeaderMap;
use percent_encoding::percent_decode_str;

use crate::head::RequestHead;

/// The variables of one request head.
#[derive(Clone, Copy)]
pub struct RequestVars<'r> {
    pub head: &'r RequestHead<'r>,
    pub headers: &'r HeaderMap,
    /// `$remote_addr` after the realip rewrite (and any plugin's).
    pub remote_addr: IpAddr,
    /// `$remote_port` when a plugin (real-ip) set it; else the connection's.
    pub remote_port: Option<u16>,
}

impl<'r> RequestVars<'r> {
    /// `http_x_foo`: the header `x-foo`, repeated values joined as nginx joins them.
    pub fn header(&self, name: &str) -> Option<Cow<'r, str>> {
        header_var(self.headers, name)
    }

    /// `arg_name`: the first query argument `name`, `+` and percent-escapes decoded.
    pub fn arg(&self, name: &str) -> Option<Cow<'r, str>> {
        query_arg(self.head.uri.query()?, name)
    }

    pub fn cookie(&self, name: &str) -> Option<Cow<'r, str>> {
        for header in self.headers.get_all(http::header::COOKIE) {
            let Ok(text) = header.to_str() else { continue };
            for pair in text.split(';') {
                let (k, v) = pair.trim().split_once('=').unwrap_or((pair.trim(), ""));
                if k == name {
                    return Some(Cow::Owned(v.to_string()));
                }
            }
        }
        None
    }
}

/// `http_<name>` over a header map (`_` stands for `-`).
pub fn header_var<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, str>> {
    let wanted: Cow<'_, str> = if name.contains('_') {
        Cow::Owned(name.replace('_', "-"))
    } else {
        Cow::Borrowed(name)
    };
    let mut values = headers.get_all(wanted.as_ref()).iter();
    let first = values.next()?;
    let first = String::from_utf8_lossy(first.as_bytes());
    match values.next() {
        None => Some(first),
        // nginx joins repeated headers (cookies with "; ", others with ", ").
        Some(_) => {
            let sep = if wanted == "cookie" { "; " } else { ", " };
            let all: Vec<String> = headers
                .get_all(wanted.as_ref())
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            Some(Cow::Owned(all.join(sep)))
        }
    }
}

/// The first argument `name` of a query string, decoded as nginx's `$arg_` is not but
/// APISIX's `ctx.var.arg_` is (`+` is a space, `%xx` escapes).
pub fn query_arg<'q>(query: &'q str, name: &str) -> Option<Cow<'q, str>> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            let v = v.replace('+', " ");
            return Some(Cow::Owned(
                percent_decode_str(&v).decode_utf8_lossy().into_owned(),
            ));
        }
    }
    None
}

/// The first field `name` of an `application/x-www-form-urlencoded` body, key and value
/// decoded as `ngx.req.get_post_args` decodes them (`+` is a space, `%xx` escapes; a field
/// without `=` is empty).
pub fn form_arg(body: &[u8], name: &str) -> Option<String> {
    let decode = |s: &[u8]| {
        let spaced: Vec<u8> = s
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&spaced)
            .decode_utf8_lossy()
            .into_owned()
    };
    body.split(|&b| b == b'&').find_map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=');
        let (k, v) = match eq {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        (!k.is_empty() && decode(k) == name).then(|| decode(v))
    })
}

impl VarSource for RequestVars<'_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        self.get(name)
    }
}

impl<'r> RequestVars<'r> {
    /// A variable, borrowing the request where it can.
    pub fn get(&self, name: &str) -> Option<Cow<'r, str>> {
        if let Some(h) = name.strip_prefix("http_") {
            return self.header(h);
        }
        if let Some(a) = name.strip_prefix("arg_") {
            return self.arg(a);
        }
        if let Some(c) = name.strip_prefix("cookie_") {
            return self.cookie(c);
        }
        let head = self.head;
        Some(match name {
            "uri" => Cow::Borrowed(head.path),
            "request_uri" => Cow::Borrowed(head.uri.path_and_query().map_or("/", |p| p.as_str())),
            "host" => Cow::Borrowed(head.host?),
            "remote_addr" => Cow::Owned(self.remote_addr.to_string()),
            "remote_port" => Cow::Owned(
                self.remote_port
                    .unwrap_or(head.conn.remote_port())
                    .to_string(),
            ),
            // Empty (unset) where no PROXY header named them, as nginx's.
            "proxy_protocol_addr" => Cow::Owned(head.conn.proxy_protocol?.source.ip().to_string()),
            "proxy_protocol_port" => {
                Cow::Owned(head.conn.proxy_protocol?.source.port().to_string())
            }
            "proxy_protocol_server_addr" => {
                Cow::Owned(head.conn.proxy_protocol?.destination.ip().to_string())
            }
            "proxy_protocol_server_port" => {
                Cow::Owned(head.conn.proxy_protocol?.destination.port().to_string())
            }
            "realip_remote_port" => Cow::Owned(head.conn.peer.port().to_string()),
            "realip_remote_addr" => Cow::Owned(head.conn.peer.ip().to_string()),
            "server_addr" => Cow::Owned(head.conn.local.ip().to_string()),
            "server_port" => Cow::Owned(head.conn.local.port().to_string()),
            "scheme" => Cow::Borrowed(head.conn.scheme()),
            "request_method" => Cow::Borrowed(head.method.as_str()),
            "args" | "query_string" => Cow::Borrowed(head.uri.query()?),
            "is_args" => Cow::Borrowed(if head.uri.query().is_some() { "?" } else { "" }),
            "server_protocol" => Cow::Owned(format!("{:?}", head.version)),
            "content_type" => return self.header("content_type"),
            "content_length" => return self.header("content_length"),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Method, Uri, Version};

    use super::*;
    use crate::head::ConnFacts;

    #[test]
    fn nginx_variables() {
        let mut conn = ConnFacts::new(
            "10.0.0.1:5555".parse().unwrap(),
            "127.0.0.1:9080".parse().unwrap(),
            false,
        );
        conn.proxy_protocol = Some(crate::head::ProxiedAddrs {
            source: "198.51.100.7:56324".parse().unwrap(),
            destination: "[2001:db8::1]:443".parse().unwrap(),
        });
        let uri: Uri = "/a%20b?x=1+2&y=%41".parse().unwrap();
        let head = RequestHead {
            method: &Method::POST,
            uri: &uri,
            version: Version::HTTP_11,
            path: "/a b",
            host: Some("example.com"),
            conn: &conn,
        };
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("cookie", HeaderValue::from_static("c=3; d=4"));
        let vars = RequestVars {
            head: &head,
            headers: &headers,
            remote_addr: "1.2.3.4".parse().unwrap(),
            remote_port: None,
        };
        let v = |n: &str| vars.var(n).map(Cow::into_owned);
        assert_eq!(v("http_x_a").as_deref(), Some("1, 2"));
        assert_eq!(v("arg_x").as_deref(), Some("1 2"));
        assert_eq!(v("arg_y").as_deref(), Some("A"));
        assert_eq!(v("cookie_d").as_deref(), Some("4"));
        assert_eq!(v("uri").as_deref(), Some("/a b"));
        assert_eq!(v("request_uri").as_deref(), Some("/a%20b?x=1+2&y=%41"));
        assert_eq!(v("remote_addr").as_deref(), Some("1.2.3.4"));
        assert_eq!(v("realip_remote_addr").as_deref(), Some("10.0.0.1"));
        assert_eq!(v("server_port").as_deref(), Some("9080"));
        assert_eq!(v("is_args").as_deref(), Some("?"));
        assert_eq!(v("nope"), None);
        assert_eq!(v("proxy_protocol_addr").as_deref(), Some("198.51.100.7"));
        assert_eq!(v("proxy_protocol_port").as_deref(), Some("56324"));
        assert_eq!(
            v("proxy_protocol_server_addr").as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(v("proxy_protocol_server_port").as_deref(), Some("443"));
        // The realip rewrite did not take the header's address: the peer's port stays.
        assert_eq!(v("remote_port").as_deref(), Some("5555"));
        let mut from_header = conn;
        from_header.client_from_proxy_protocol = true;
        let head = RequestHead {
            conn: &from_header,
            ..head
        };
        let vars = RequestVars {
            head: &head,
            ..vars
        };
        assert_eq!(vars.var("remote_port").as_deref(), Some("56324"));
        let plain = ConnFacts::new(conn.peer, conn.local, false);
        let head = RequestHead {
            conn: &plain,
            ..head
        };
        let vars = RequestVars {
            head: &head,
            ..vars
        };
        assert_eq!(vars.var("proxy_protocol_addr"), None);
    }

    #[test]
    fn form_fields_decoded_as_get_post_args() {
        let body = b"a=1&name=jack+doe&b%20c=%41%zz&flag&name=second";
        assert_eq!(form_arg(body, "name").as_deref(), Some("jack doe"));
        assert_eq!(form_arg(body, "b c").as_deref(), Some("A%zz"));
        assert_eq!(form_arg(body, "flag").as_deref(), Some(""));
        assert_eq!(form_arg(body, "x"), None);
    }
}
