//! A request for plugins' unit tests: owns what the proxy would own and hands out the
//! [`PluginCtx`] a phase gets.

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};

use crate::ctx::{PluginCtx, RequestBody, RequestState, RouteInfo};
use crate::head::{ConnFacts, RequestHead};

/// A request as the proxy would hold it.
pub struct TestRequest {
    pub method: Method,
    pub uri: Uri,
    pub path: String,
    pub host: Option<String>,
    pub headers: HeaderMap,
    pub conn: ConnFacts,
    pub route: Option<RouteInfo>,
    pub state: RequestState,
}

impl TestRequest {
    /// `GET uri` from 127.0.0.1 to 127.0.0.1:9080.
    pub fn get(uri: &str) -> TestRequest {
        TestRequest::new(Method::GET, uri)
    }

    pub fn new(method: Method, uri: &str) -> TestRequest {
        let uri: Uri = uri.parse().expect("a valid test URI");
        let conn = ConnFacts::new(
            "127.0.0.1:40000".parse().expect("address"),
            "127.0.0.1:9080".parse().expect("address"),
            false,
        );
        TestRequest {
            method,
            path: uri.path().to_owned(),
            uri,
            host: None,
            headers: HeaderMap::new(),
            state: RequestState::new(conn.peer.ip()),
            conn,
            route: None,
        }
    }

    /// A request of `method` with a body already read (what a plugin's `read_body` gets).
    pub fn with_body(method: Method, uri: &str, body: &str) -> TestRequest {
        let mut r = TestRequest::new(method, uri);
        r.state
            .set_body(RequestBody::Buffered(Bytes::copy_from_slice(
                body.as_bytes(),
            )));
        r
    }

    /// `POST uri` with `body`.
    pub fn post(uri: &str, body: &str) -> TestRequest {
        TestRequest::with_body(Method::POST, uri, body)
    }

    /// The body as it would go upstream, when it is held whole.
    pub fn sent_body(&self) -> Option<Bytes> {
        self.state.body().buffered().cloned()
    }

    pub fn header(mut self, name: &'static str, value: &str) -> TestRequest {
        self.headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_str(value).expect("a valid header value"),
        );
        self
    }

    /// The client address (`$remote_addr`).
    pub fn from(mut self, ip: &str) -> TestRequest {
        let ip: IpAddr = ip.parse().expect("an address");
        self.state = RequestState::new(ip);
        self
    }

    pub fn route(mut self, route: RouteInfo) -> TestRequest {
        self.route = Some(route);
        self
    }

    /// The view a phase gets.
    pub fn ctx(&mut self) -> PluginCtx<'_> {
        let head = RequestHead {
            method: &self.method,
            uri: &self.uri,
            version: Version::HTTP_11,
            path: &self.path,
            host: self.host.as_deref(),
            conn: &self.conn,
        };
        PluginCtx::new(
            head,
            &mut self.headers,
            self.route.as_ref(),
            &mut self.state,
        )
    }
}
