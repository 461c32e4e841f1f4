//! Active probes: resty.healthcheck's `run_single_check`, once per process.
//!
//! Healthy (and mostly healthy) targets are probed every `healthy.interval`, the others every
//! `unhealthy.interval`, the first round one interval after the checker starts; `concurrency`
//! probes run at a time. A round never overlaps the next: a slow round delays the following one
//! instead of piling probes up, which keeps the cost bounded whatever the node count. Every step
//! (connect, send, read the status line) is bounded by `timeout`; an answer that is not an HTTP
//! status line counts as an HTTP failure, as resty reports a missing status.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ferrisix_tls::UpstreamTls;
use futures_util::StreamExt;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};

use super::config::{ActiveConfig, ProbeType};
use super::target::{Counter, Target};
use super::{report_status, UpstreamChecker};

/// What one probe saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ProbeResult {
    Success,
    Status(u16),
    TcpFailure,
    Timeout,
}

pub(super) async fn run(checker: Weak<UpstreamChecker>) {
    let (healthy_every, unhealthy_every) = match checker.upgrade() {
        Some(c) => (
            c.config.active.healthy_interval,
            c.config.active.unhealthy_interval,
        ),
        None => return,
    };
    let start = Instant::now();
    let mut next_healthy = start + healthy_every;
    let mut next_unhealthy = start + unhealthy_every;
    loop {
        sleep_until(next_healthy.min(next_unhealthy)).await;
        let Some(checker) = checker.upgrade() else {
            return;
        };
        if checker.retired.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let (want_up, want_down) = (now >= next_healthy, now >= next_unhealthy);
        if want_up {
            next_healthy = now + healthy_every;
        }
        if want_down {
            next_unhealthy = now + unhealthy_every;
        }
        let due: Vec<Arc<Target>> = checker
            .targets()
            .iter()
            .filter(|t| if t.is_up() { want_up } else { want_down })
            .cloned()
            .collect();
        let active = &checker.config.active;
        futures_util::stream::iter(due)
            .for_each_concurrent(active.concurrency, |t| {
                let checker = &checker;
                async move {
                    let result = probe(active, checker.probe_tls.as_ref(), &t).await;
                    let limits = &active.limits;
                    let flipped = match result {
                        ProbeResult::Success => t.report(true, Counter::Success, limits.successes),
                        ProbeResult::Status(s) => report_status(&t, limits, s),
                        ProbeResult::TcpFailure => {
                            t.report(false, Counter::Tcp, limits.tcp_failures)
                        }
                        ProbeResult::Timeout => t.report(false, Counter::Timeout, limits.timeouts),
                    };
                    checker.log_flip(&t, flipped, "active");
                }
            })
            .await;
    }
}

/// One probe of `target`; `tls` is the client config of `type: https` probes.
pub(super) async fn probe(
    active: &ActiveConfig,
    tls: Option<&UpstreamTls>,
    target: &Target,
) -> ProbeResult {
    let limit = active.timeout;
    let addr = std::net::SocketAddr::new(target.ip, target.port);
    let stream = match timeout(limit, TcpStream::connect(addr)).await {
        Err(_) => return ProbeResult::Timeout,
        Ok(Err(_)) => return ProbeResult::TcpFailure,
        Ok(Ok(s)) => s,
    };
    match active.kind {
        ProbeType::Tcp => ProbeResult::Success,
        ProbeType::Http => http_probe(active, target, stream, limit).await,
        ProbeType::Https => {
            let Some(tls) = tls else {
                // Never without a config: `attach` makes one for every https checker.
                return ProbeResult::TcpFailure;
            };
            match tls_connect(tls, target, stream, limit).await {
                Ok(s) => http_probe(active, target, s, limit).await,
                Err(r) => r,
            }
        }
    }
}

async fn http_probe<S>(
    active: &ActiveConfig,
    target: &Target,
    stream: S,
    limit: Duration,
) -> ProbeResult
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let host = target.host_header.as_deref().unwrap_or(&target.hostname);
    let mut headers = String::new();
    for h in &active.req_headers {
        headers.push_str(h);
        headers.push_str("\r\n");
    }
    let body = &active.http_req_body;
    if !body.is_empty() {
        headers.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    let request = format!(
        "{} {} HTTP/1.1\r\nConnection: close\r\n{headers}Host: {host}\r\n\r\n{body}",
        active.http_method, active.http_path
    );
    let mut stream = BufReader::new(stream);
    match timeout(limit, stream.get_mut().write_all(request.as_bytes())).await {
        Err(_) => return ProbeResult::Timeout,
        Ok(Err(_)) => return ProbeResult::TcpFailure,
        Ok(Ok(())) => {}
    }
    let mut line = Vec::with_capacity(64);
    // A status line longer than this is garbage anyway.
    let mut limited = (&mut stream).take(4096);
    match timeout(limit, limited.read_until(b'\n', &mut line)).await {
        Err(_) => ProbeResult::Timeout,
        Ok(Err(_)) | Ok(Ok(0)) => ProbeResult::TcpFailure,
        Ok(Ok(_)) => ProbeResult::Status(parse_status_line(&line)),
    }
}

use tokio::io::AsyncReadExt as _;

/// `^HTTP/\d+\.\d+\s+(\d+)` (case-insensitive); 0 when the line is not a status line.
pub(super) fn parse_status_line(line: &[u8]) -> u16 {
    let Ok(text) = std::str::from_utf8(line) else {
        return 0;
    };
    let Some(rest) = text.get(..5).filter(|p| p.eq_ignore_ascii_case("http/")) else {
        return 0;
    };
    let rest = &text[rest.len()..];
    let major = rest.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &rest[major..];
    let Some(rest) = rest.strip_prefix('.').filter(|_| major > 0) else {
        return 0;
    };
    let minor = rest.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &rest[minor..];
    let spaces = rest.bytes().take_while(u8::is_ascii_whitespace).count();
    if minor == 0 || spaces == 0 {
        return 0;
    }
    let rest = &rest[spaces..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    rest[..digits]
        .parse::<u32>()
        .ok()
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(0)
}

/// A Host header may carry a port (`upstream_host`); the SNI is the name alone.
fn without_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (h.ends_with(']') || !h.contains(':')) =>
        {
            h
        }
        _ => host,
    }
}

/// The TLS handshake of a `type: https` probe: SNI is the Host header the probe sends (the
/// node's domain, `upstream_host`, or `checks.active.host`); an address sends none, as
/// resty.healthcheck's `sslhandshake(nil, hostname)` sends none for an address. The config
/// verifies against `apisix.ssl.ssl_trusted_certificate` unless `https_verify_certificate` is
/// false (see [`super::probe_tls`]).
async fn tls_connect(
    tls: &UpstreamTls,
    target: &Target,
    stream: TcpStream,
    limit: Duration,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ProbeResult> {
    let host = match target.host_header.as_deref() {
        Some(h) => without_port(h),
        None => target.hostname.as_str(),
    };
    let name = ferrisix_tls::upstream::server_name(host)
        .unwrap_or_else(|| ServerName::IpAddress(target.ip.into()));
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    match timeout(limit, connector.connect(name, stream)).await {
        Err(_) => Err(ProbeResult::Timeout),
        // resty reports a failed handshake (a certificate that does not verify included) as a
        // TCP failure.
        Ok(Err(e)) => {
            tracing::debug!(target = %target.ip, sni = host, error = %e, "health check TLS handshake failed");
            Err(ProbeResult::TcpFailure)
        }
        Ok(Ok(s)) => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r\n"), 200);
        assert_eq!(parse_status_line(b"http/1.0 503\r\n"), 503);
        assert_eq!(parse_status_line(b"SSH-2.0-OpenSSH\r\n"), 0);
        assert_eq!(parse_status_line(b"HTTP/1.1200\r\n"), 0);
        assert_eq!(parse_status_line(b"HTTP/2 200\r\n"), 0);
    }

    #[test]
    fn sni_from_a_host_header() {
        assert_eq!(without_port("example.com:8443"), "example.com");
        assert_eq!(without_port("example.com"), "example.com");
        assert_eq!(without_port("[::1]:443"), "[::1]");
        assert_eq!(without_port("::1"), "::1");
    }
}
