//! Test support for the store tests: the crate's etcd harness (`test_support::etcd`, a
//! throwaway etcd on random ports), short store settings, sample route and upstream values, a
//! polling helper, and a TCP proxy that can cut or black-hole connections to simulate network
//! failures.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrisix_config::settings::EtcdSettings;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

#[allow(unused_imports)] // Not every test file uses both.
pub use ferrisix_config::test_support::etcd::{Etcd, TlsFiles};

/// Store settings for tests: short timeouts so failures show quickly.
pub fn settings(endpoints: Vec<String>) -> EtcdSettings {
    EtcdSettings {
        host: endpoints,
        timeout: 2,
        watch_timeout: 4,
        startup_retry: 1,
        ..EtcdSettings::default()
    }
}

/// A route's value: `uri` proxied to a fixed upstream node.
pub fn route(uri: &str) -> Vec<u8> {
    format!(r#"{{"uri":"{uri}","upstream":{{"nodes":{{"127.0.0.1:1980":1}}}}}}"#).into_bytes()
}

/// An upstream's value, with one node.
pub fn upstream() -> Vec<u8> {
    br#"{"nodes":{"127.0.0.1:1":1}}"#.to_vec()
}

/// Polls `check` every 20 ms until it holds; panics with `what` after `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ProxyState {
    /// Refuse new connections and close existing ones.
    cut: bool,
    /// Connections with a smaller id forward nothing more but stay open.
    blackhole_before: u64,
}

/// A TCP proxy in front of one address.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<watch::Sender<ProxyState>>,
    next_id: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Must be called inside a Tokio runtime.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(watch::channel(ProxyState::default()).0);
        let next_id = Arc::new(AtomicU64::new(0));
        let (s, ids) = (Arc::clone(&state), Arc::clone(&next_id));
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                if s.borrow().cut {
                    continue; // dropped: closed at once
                }
                let id = ids.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(pump(id, conn, target, s.subscribe()));
            }
        });
        Proxy {
            addr,
            state,
            next_id,
            accept,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.state.send_modify(|s| s.cut = true);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.state.send_modify(|s| s.cut = false);
    }

    /// Existing connections stay open but forward nothing (a half-dead network path); new
    /// connections work.
    pub fn blackhole_existing(&self) {
        let next = self.next_id.load(Ordering::SeqCst);
        self.state.send_modify(|s| s.blackhole_before = next);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.send_modify(|s| s.cut = true);
    }
}

async fn pump(
    id: u64,
    client: tokio::net::TcpStream,
    target: SocketAddr,
    mut state: watch::Receiver<ProxyState>,
) {
    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let blackholed = {
        let forward = async {
            let up = async {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
                let _ = sw.shutdown().await;
            };
            let down = async {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
                let _ = cw.shutdown().await;
            };
            tokio::join!(up, down);
        };
        tokio::select! {
            _ = forward => return,
            s = state.wait_for(|s| s.cut || id < s.blackhole_before) => s.map(|s| !s.cut).unwrap_or(false),
        }
    };
    if blackholed {
        // Hold both sockets open, silent, until the proxy is cut or dropped.
        let _ = state.wait_for(|s| s.cut).await;
    }
    drop((cr, cw, sr, sw));
}

/// The path of a file in `dir`, for local copies.
pub fn copy_path(dir: &Path) -> PathBuf {
    dir.join("data/etcd-copy.json")
}
