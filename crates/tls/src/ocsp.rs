//! OCSP stapling (APISIX's `ocsp-stapling` plugin, `apisix/plugins/ocsp-stapling.lua`): for an
//! ssl whose `ocsp_stapling.enabled` is true, the status of each of its certificates is asked
//! of the responder named in the certificate's Authority Information Access extension (an
//! HTTP POST of `application/ocsp-request`), the answer is cached for `cache_ttl` seconds,
//! checked unless `skip_verify` (signed by the issuer or its delegated responder, status
//! `good`, within its validity) and stapled to the handshakes of clients that ask for it
//! (rustls sends `CertifiedKey::ocsp` when the ClientHello has `status_request`).
//!
//! APISIX fetches in the handshake that first needs the answer. Here the handshake never
//! waits and takes no lock: a task on the runtime given to [`OcspStapler::new`] fetches as
//! soon as the ssl is compiled and swaps the certificate's stapled copy in
//! ([`arc_swap::ArcSwap`], read by the certificate resolver), again when the cache time or
//! the response's `nextUpdate` comes, and every [`RETRY`] after a failure, logging APISIX's
//! `no ocsp response send: <why>`. The task ends when the ssl's compiled form is dropped (it
//! holds it weakly). So the first handshakes after an ssl is written may come before its
//! answer is fetched, and have none; a response that can no longer be checked is taken off.
//!
//! Not as APISIX: each certificate of an ssl (`cert` and every `certs` entry) gets its own
//! answer, where APISIX fetches one for the last one; the responder must be `http://`.

pub(crate) mod der;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use ferrisix_config::model::OcspStapling;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// After a failed fetch or check, the next try.
pub const RETRY: Duration = Duration::from_secs(10);

/// How long one exchange with a responder may take (lua-resty-http's default timeout).
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest responder answer read.
const MAX_RESPONSE: usize = 1 << 20;

/// A cached responder answer.
struct Cached {
    response: Vec<u8>,
    expires: Instant,
}

/// Fetches, checks and staples OCSP responses for the ssls that ask for it, on a runtime of
/// the gateway's (never a worker's). One per gateway; the cache is keyed by the certificate
/// chain, as APISIX's `ocsp-stapling` shared dict, and only the fetch tasks touch it.
pub struct OcspStapler {
    runtime: tokio::runtime::Handle,
    cache: Mutex<HashMap<u64, Cached>>,
}

impl std::fmt::Debug for OcspStapler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OcspStapler").finish_non_exhaustive()
    }
}

/// The certificate pairs a resolver serves, each swappable for a copy with a stapled answer.
pub type KeySlots = [ArcSwap<CertifiedKey>];

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl OcspStapler {
    pub fn new(runtime: tokio::runtime::Handle) -> Arc<OcspStapler> {
        Arc::new(OcspStapler {
            runtime,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps `slots[index]` stapled as `conf` asks, until `slots` is dropped.
    pub(crate) fn staple(
        self: &Arc<Self>,
        ssl_id: String,
        conf: OcspStapling,
        slots: Weak<KeySlots>,
        index: usize,
    ) {
        let me = self.clone();
        tracing::debug!(ssl = %ssl_id, index, "ocsp: stapling");
        self.runtime.spawn(async move {
            let mut stapled_until: Option<u64> = None;
            loop {
                let Some(chain) = slots.upgrade().map(|s| s[index].load().cert.clone()) else {
                    return;
                };
                let wait = match me.answer(&chain, &conf).await {
                    Ok((response, next_update, refresh)) => {
                        let Some(s) = slots.upgrade() else { return };
                        let current = s[index].load_full();
                        if current.ocsp.as_deref() != Some(response.as_slice()) {
                            let mut stapled =
                                CertifiedKey::new(current.cert.clone(), current.key.clone());
                            stapled.ocsp = Some(response);
                            s[index].store(Arc::new(stapled));
                            tracing::info!(ssl = %ssl_id, "ocsp response stapled");
                        }
                        stapled_until = next_update;
                        refresh
                    }
                    Err(e) => {
                        tracing::error!(ssl = %ssl_id, "no ocsp response send: {e}");
                        // A response past its nextUpdate (or one that no longer checks) is
                        // taken off rather than stapled stale.
                        let stale = stapled_until.is_none_or(|n| n < now_secs());
                        if stale {
                            if let Some(s) = slots.upgrade() {
                                let current = s[index].load_full();
                                if current.ocsp.is_some() {
                                    let bare = CertifiedKey::new(
                                        current.cert.clone(),
                                        current.key.clone(),
                                    );
                                    s[index].store(Arc::new(bare));
                                }
                            }
                            stapled_until = None;
                        }
                        RETRY
                    }
                };
                tokio::time::sleep(wait).await;
            }
        });
    }

    /// The answer for `chain`: from the cache or the responder, checked unless `skip_verify`;
    /// with its `nextUpdate` and when to ask again.
    async fn answer(
        &self,
        chain: &[CertificateDer<'static>],
        conf: &OcspStapling,
    ) -> Result<(Vec<u8>, Option<u64>, Duration), String> {
        let key = crate::store::fingerprint(&chain.iter().map(|c| c.as_ref()).collect::<Vec<_>>());
        let leaf_der = chain.first().ok_or("no certificate")?;
        let leaf =
            der::Cert::parse(leaf_der).map_err(|e| format!("failed to get ocsp url: {e}"))?;
        let cached = {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .get(&key)
                .filter(|c| c.expires > Instant::now())
                .map(|c| (c.response.clone(), c.expires))
        };
        let (response, expires) = match cached {
            Some(c) => c,
            None => {
                let url = leaf.ocsp_urls.first().ok_or(
                    "failed to get ocsp url: cert not contains authority_information_access extension",
                )?;
                let issuer_der = chain
                    .get(1)
                    .ok_or("failed to create ocsp request: no issuer certificate in chain")?;
                let issuer = der::Cert::parse(issuer_der)
                    .map_err(|e| format!("failed to create ocsp request: {e}"))?;
                let request = der::request(&leaf, &issuer);
                let response = fetch(url, &request).await?;
                let expires = Instant::now() + Duration::from_secs(conf.cache_ttl);
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                cache.retain(|_, c| c.expires > Instant::now());
                cache.insert(
                    key,
                    Cached {
                        response: response.clone(),
                        expires,
                    },
                );
                (response, expires)
            }
        };
        let mut next_update = None;
        if !conf.skip_verify {
            let checked = chain
                .get(1)
                .ok_or_else(|| "no issuer certificate in chain".to_string())
                .and_then(|i| der::Cert::parse(i))
                .and_then(|issuer| der::verify_response(&response, &leaf, &issuer, now_secs()));
            match checked {
                Ok(n) => next_update = n,
                Err(e) => {
                    // Fetched again at the next try, rather than checked again in vain.
                    self.cache
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    return Err(format!("failed to validate ocsp response: {e}"));
                }
            }
        }
        let mut refresh = expires.saturating_duration_since(Instant::now());
        if let Some(n) = next_update {
            refresh = refresh.min(Duration::from_secs(n.saturating_sub(now_secs())));
        }
        Ok((response, next_update, refresh.max(Duration::from_secs(1))))
    }
}

/// POSTs `request` to the responder at `url` (`http://host[:port]/path`) and returns the
/// body of its 200 answer, with APISIX's messages for what goes wrong.
async fn fetch(url: &str, request: &[u8]) -> Result<Vec<u8>, String> {
    let query = |e: String| format!("ocsp responder query failed: {e}");
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| query(format!("{url}: only http:// responders are supported")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok() && !authority.ends_with(']'));
    let addr = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/ocsp-request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            request.len()
        );
        conn.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        conn.write_all(request).await.map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = conn.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&chunk[..n]);
            if raw.len() > MAX_RESPONSE {
                return Err("answer too large".to_string());
            }
            if let Some(body) = complete_body(&raw)? {
                return Ok((status_of(&raw)?, body));
            }
        }
        // Closed: without a declared length or chunks, what came after the head is the body.
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("connection closed before the answer's head ended")?;
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        if head.contains("\ncontent-length:") || head.contains("\ntransfer-encoding:") {
            return Err("connection closed before the answer ended".to_string());
        }
        Ok((status_of(&raw)?, raw[end + 4..].to_vec()))
    };
    let (status, body) = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| query("timeout".into()))?
        .map_err(query)?;
    if status != 200 {
        return Err(format!(
            "ocsp responder returns bad http status code: {status}"
        ));
    }
    if body.is_empty() {
        return Err("ocsp responder returns empty body".into());
    }
    Ok(body)
}

fn status_of(raw: &[u8]) -> Result<u16, String> {
    let line = raw.split(|b| *b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {:?}", text.trim()))
}

/// The body once the answer in `raw` is complete: by `Content-Length` or by the last chunk;
/// with neither, `None` until the connection closes.
fn complete_body(raw: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let body = &raw[end + 4..];
    let header = |name: &str| {
        head.lines()
            .skip(1)
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if let Some(len) = header("content-length:") {
        let len: usize = len.parse().map_err(|_| "bad content-length".to_string())?;
        return Ok((body.len() >= len).then(|| body[..len].to_vec()));
    }
    if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        let mut out = Vec::new();
        let mut rest = body;
        loop {
            let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let size_text = String::from_utf8_lossy(&rest[..eol]);
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| "bad chunk size".to_string())?;
            rest = &rest[eol + 2..];
            if size == 0 {
                return Ok(Some(out));
            }
            // A size past the answer's limit would only overflow.
            if size > MAX_RESPONSE {
                return Err("chunk too large".to_string());
            }
            if rest.len() < size + 2 {
                return Ok(None);
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
