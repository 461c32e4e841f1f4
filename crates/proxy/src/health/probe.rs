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

use futures_util::StreamExt;
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
                    let result = probe(active, &t).await;
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

/// One probe of `target`.
pub(super) async fn probe(active: &ActiveConfig, target: &Target) -> ProbeResult {
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
        ProbeType::Https => match tls::connect(active, target, stream, limit).await {
            Ok(s) => http_probe(active, target, s, limit).await,
            Err(r) => r,
        },
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

mod tls {
    //! The TLS handshake of `type: https` probes (SNI: the Host header or hostname, as resty
    //! sends; certificate verified against the system roots unless
    //! `https_verify_certificate` is false).

    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use tokio::net::TcpStream;
    use tokio::time::timeout;
    use tokio_rustls::rustls;

    use super::{ActiveConfig, ProbeResult, Target};

    fn config(verify: bool) -> Arc<rustls::ClientConfig> {
        static VERIFYING: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        static TRUSTING: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        let provider = || Arc::new(rustls::crypto::ring::default_provider());
        if verify {
            VERIFYING
                .get_or_init(|| {
                    let mut roots = rustls::RootCertStore::empty();
                    for cert in rustls_native_certs::load_native_certs().certs {
                        let _ = roots.add(cert);
                    }
                    Arc::new(
                        rustls::ClientConfig::builder_with_provider(provider())
                            .with_safe_default_protocol_versions()
                            .expect("ring supports the default versions")
                            .with_root_certificates(roots)
                            .with_no_client_auth(),
                    )
                })
                .clone()
        } else {
            TRUSTING
                .get_or_init(|| {
                    Arc::new(
                        rustls::ClientConfig::builder_with_provider(provider())
                            .with_safe_default_protocol_versions()
                            .expect("ring supports the default versions")
                            .dangerous()
                            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
                            .with_no_client_auth(),
                    )
                })
                .clone()
        }
    }

    pub(super) async fn connect(
        active: &ActiveConfig,
        target: &Target,
        stream: TcpStream,
        limit: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ProbeResult> {
        let sni = target.host_header.as_deref().unwrap_or(&target.hostname);
        let name = rustls::pki_types::ServerName::try_from(sni.to_string())
            .map_err(|_| ProbeResult::TcpFailure)?;
        let connector = tokio_rustls::TlsConnector::from(config(active.https_verify_certificate));
        match timeout(limit, connector.connect(name, stream)).await {
            Err(_) => Err(ProbeResult::Timeout),
            // resty reports a failed handshake as a TCP failure.
            Ok(Err(_)) => Err(ProbeResult::TcpFailure),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// `https_verify_certificate: false`: any certificate is accepted; signatures are still
    /// checked so the handshake itself is sound.
    #[derive(Debug)]
    struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

    impl rustls::client::danger::ServerCertVerifier for NoVerify {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
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
}
