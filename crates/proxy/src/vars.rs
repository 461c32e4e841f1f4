//! Request variables as nginx and APISIX name them (`uri`, `host`, `http_x_foo`, `arg_a`,
//! `cookie_c`, `remote_addr` ...), read lazily for `vars` route conditions.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use ferrisix_router::VarSource;
use http::request::Parts;
use percent_encoding::percent_decode_str;

pub struct RequestVars<'a> {
    pub parts: &'a Parts,
    pub uri: &'a str,
    pub host: Option<&'a str>,
    pub remote_addr: IpAddr,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl RequestVars<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        // `http_x_foo` names the header `x-foo`.
        let wanted = name.replace('_', "-");
        let mut values = self.parts.headers.get_all(wanted.as_str()).iter();
        let first = values.next()?;
        let first = String::from_utf8_lossy(first.as_bytes());
        match values.next() {
            None => Some(first),
            // nginx joins repeated headers (cookies with "; ", others with ", ").
            Some(_) => {
                let sep = if wanted == "cookie" { "; " } else { ", " };
                let all: Vec<String> = self
                    .parts
                    .headers
                    .get_all(wanted.as_str())
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                Some(Cow::Owned(all.join(sep)))
            }
        }
    }

    fn arg(&self, name: &str) -> Option<Cow<'_, str>> {
        let query = self.parts.uri.query()?;
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

    fn cookie(&self, name: &str) -> Option<Cow<'_, str>> {
        for header in self.parts.headers.get_all(http::header::COOKIE) {
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

impl VarSource for RequestVars<'_> {
    fn var(&self, name: &str) -> Option<Cow<'_, str>> {
        if let Some(h) = name.strip_prefix("http_") {
            return self.header(h);
        }
        if let Some(a) = name.strip_prefix("arg_") {
            return self.arg(a);
        }
        if let Some(c) = name.strip_prefix("cookie_") {
            return self.cookie(c);
        }
        Some(match name {
            "uri" => Cow::Borrowed(self.uri),
            "request_uri" => {
                Cow::Borrowed(self.parts.uri.path_and_query().map_or("/", |p| p.as_str()))
            }
            "host" => Cow::Borrowed(self.host?),
            "remote_addr" => Cow::Owned(self.remote_addr.to_string()),
            "remote_port" => Cow::Owned(self.peer.port().to_string()),
            "realip_remote_addr" => Cow::Owned(self.peer.ip().to_string()),
            "server_addr" => Cow::Owned(self.local.ip().to_string()),
            "server_port" => Cow::Owned(self.local.port().to_string()),
            "scheme" => Cow::Borrowed("http"),
            "request_method" => Cow::Borrowed(self.parts.method.as_str()),
            "args" | "query_string" => Cow::Borrowed(self.parts.uri.query()?),
            "is_args" => Cow::Borrowed(if self.parts.uri.query().is_some() {
                "?"
            } else {
                ""
            }),
            "server_protocol" => Cow::Owned(format!("{:?}", self.parts.version)),
            "content_type" => return self.header("content_type"),
            "content_length" => return self.header("content_length"),
            _ => return None,
        })
    }
}
