//! Log servers for the loggers' tests: an HTTP server (plain or TLS) that hands over every
//! request it gets, and a TLS acceptor for raw TCP servers, with the test certificate of
//! `tests/data/tls` (`server.crt`: 127.0.0.1 and localhost, signed by the test CA).

use std::borrow::Cow;
use std::sync::Arc;

use ferrisix_plugin_api::{LogCtx, LogVars, Plugin};
use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

const CERT: &str = include_str!("../../../../../tests/data/tls/server.crt");
const KEY: &str = include_str!("../../../../../tests/data/tls/server.key");
const CA: &str = include_str!("../../../../../tests/data/tls/ca.crt");

/// One request a test server got.
#[derive(Clone, Debug)]
pub(crate) struct Captured {
    /// The request line and headers as sent.
    pub head: String,
    pub body: Vec<u8>,
}

impl Captured {
    /// The head lower-cased (header names and values compared without case).
    pub fn lower(&self) -> String {
        self.head.to_lowercase()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `HTTP/1.1 <status>` with `body`.
pub(crate) fn answer(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The test CA, for `ssl_verify` that succeeds.
pub(crate) fn test_ca() -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(ferrisix_config::pem::parse_certs(CA).unwrap());
    Arc::new(roots)
}

/// A TLS acceptor presenting `server.crt`.
pub(crate) fn tls_acceptor() -> TlsAcceptor {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        ferrisix_config::pem::parse_certs(CERT).unwrap(),
        ferrisix_config::pem::parse_key(KEY).unwrap(),
    )
    .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

type Answer = fn(&Captured) -> Vec<u8>;

/// An HTTP/1.1 server on 127.0.0.1 answering each request with `answer`'s whole response.
pub(crate) async fn http_server(answer: Answer) -> (u16, mpsc::UnboundedReceiver<Captured>) {
    server(answer, None).await
}

/// The same over TLS.
pub(crate) async fn https_server(answer: Answer) -> (u16, mpsc::UnboundedReceiver<Captured>) {
    server(answer, Some(tls_acceptor())).await
}

async fn server(
    answer: Answer,
    tls: Option<TlsAcceptor>,
) -> (u16, mpsc::UnboundedReceiver<Captured>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve(s, answer, tx).await,
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(s).await {
                            serve(s, answer, tx).await;
                        }
                    }
                }
            });
        }
    });
    (port, rx)
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    answer: Answer,
    tx: mpsc::UnboundedSender<Captured>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len: usize = head
                .to_lowercase()
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() < end + 4 + len {
                break;
            }
            let req: Vec<u8> = buf.drain(..end + 4 + len).collect();
            let got = Captured {
                head,
                body: req[end + 4..].to_vec(),
            };
            let resp = answer(&got);
            let _ = tx.send(got);
            if s.write_all(&resp).await.is_err() {
                return;
            }
        }
    }
}

/// The next request, within 5 s.
pub(crate) async fn next(rx: &mut mpsc::UnboundedReceiver<Captured>) -> Captured {
    tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
        .await
        .expect("a request within 5 s")
        .expect("the server runs")
}

/// The log phase of `POST /x?n=<n>` on route `r1`, answered 200, with the variables `p` asks
/// for.
pub(crate) fn log_ctx(p: &dyn Plugin, n: usize) -> LogCtx {
    struct V(String);
    impl ferrisix_router::VarSource for V {
        fn var(&self, name: &str) -> Option<Cow<'_, str>> {
            match name {
                "route_id" => Some("r1".into()),
                "request_uri" => Some(Cow::Borrowed(&self.0)),
                "request" => Some(format!("POST {} HTTP/1.1", self.0).into()),
                _ => None,
            }
        }
    }
    LogCtx {
        status: 200,
        vars: LogVars::capture(p.log_needs().vars.unwrap(), &V(format!("/x?n={n}"))),
        ..Default::default()
    }
}

/// [`log_ctx`] with a Host header and a JSON body (`{"a":1}`), for the loggers that send the
/// request as it came (`meta_format: origin`).
pub(crate) fn log_ctx_with_request(p: &dyn Plugin, n: usize) -> LogCtx {
    let mut headers = http::HeaderMap::new();
    headers.insert("host", http::HeaderValue::from_static("gw.test"));
    LogCtx {
        request_headers: Some(headers),
        request_body: Some(bytes::Bytes::from_static(b"{\"a\":1}")),
        ..log_ctx(p, n)
    }
}
