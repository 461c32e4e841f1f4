//! The request and the response's check against Debian's `openssl ocsp` (the responder reads
//! our request from a file and answers into one), with certificates made by `openssl` here;
//! the responder exchange against in-test HTTP servers.

use std::path::{Path, PathBuf};

use ferrisix_testkit::openssl_pki::{issue, openssl, self_signed};

use super::der::{self, Cert};
use super::*;

/// A CA (`ca.pem`, `ca.key`), another (`other.pem`), a leaf (`leaf.pem`, serial 0x1234) whose
/// AIA names `url`, and a delegated responder (`resp.pem`, with the OCSP-signing purpose;
/// `plain.pem`, without).
fn pki(dir: &Path, url: &str) {
    self_signed(dir, "ca.key", "ca.pem", "/CN=Test OCSP CA", true);
    self_signed(dir, "other.key", "other.pem", "/CN=Test OCSP CA", false);
    issue(
        dir,
        "leaf",
        "/CN=ocsp.test",
        &format!("subjectAltName=DNS:ocsp.test\nauthorityInfoAccess=OCSP;URI:{url}\n"),
        "0x1234",
    );
    issue(
        dir,
        "resp",
        "/CN=responder",
        "extendedKeyUsage=OCSPSigning\n",
        "0x99",
    );
    issue(
        dir,
        "plain",
        "/CN=responder",
        "extendedKeyUsage=serverAuth\n",
        "0x98",
    );
}

fn der_of(dir: &Path, pem: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(dir.join(pem)).unwrap();
    ferrisix_config::pem::parse_certs(&text).unwrap()[0]
        .as_ref()
        .to_vec()
}

/// The responder's answer to our request for the leaf, with `status` in the index (`V` or
/// `R`), signed by `signer`/`key`.
fn respond(dir: &Path, status: &str, signer: &str, key: &str) -> Vec<u8> {
    let revoked = if status == "R" { "260101000000Z" } else { "" };
    std::fs::write(
        dir.join("index.txt"),
        format!("{status}\t301231000000Z\t{revoked}\t1234\tunknown\t/CN=ocsp.test\n"),
    )
    .unwrap();
    let (leaf, ca) = (der_of(dir, "leaf.pem"), der_of(dir, "ca.pem"));
    let req = der::request(&Cert::parse(&leaf).unwrap(), &Cert::parse(&ca).unwrap());
    std::fs::write(dir.join("req.der"), req).unwrap();
    openssl(
        dir,
        &[
            "ocsp",
            "-index",
            "index.txt",
            "-CA",
            "ca.pem",
            "-rsigner",
            signer,
            "-rkey",
            key,
            "-reqin",
            "req.der",
            "-respout",
            "resp.der",
            "-ndays",
            "1",
        ],
    );
    std::fs::read(dir.join("resp.der")).unwrap()
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    pki(&path, "http://127.0.0.1:8888/ocsp");
    (dir, path)
}

#[test]
fn certificates_give_their_serial_names_key_and_responder() {
    let (_t, dir) = setup();
    let (leaf, ca, resp) = (
        der_of(&dir, "leaf.pem"),
        der_of(&dir, "ca.pem"),
        der_of(&dir, "resp.pem"),
    );
    let leaf = Cert::parse(&leaf).unwrap();
    let ca = Cert::parse(&ca).unwrap();
    assert_eq!(leaf.serial, [0x12, 0x34]);
    assert_eq!(leaf.ocsp_urls, ["http://127.0.0.1:8888/ocsp"]);
    assert_eq!(leaf.issuer, ca.subject);
    assert!(leaf.issued_by(&ca));
    assert!(!ca.issued_by(&leaf));
    assert!(!leaf.ocsp_signing);
    assert!(Cert::parse(&resp).unwrap().ocsp_signing);
    assert!(ca.ocsp_urls.is_empty());
}

/// openssl reads our request (it answers for serial 0x1234 of our CA), and our check accepts
/// its answer, giving its nextUpdate.
#[test]
fn a_good_answer_signed_by_the_issuer_passes() {
    let (_t, dir) = setup();
    let resp = respond(&dir, "V", "ca.pem", "ca.key");
    let (leaf, ca) = (der_of(&dir, "leaf.pem"), der_of(&dir, "ca.pem"));
    let (leaf, ca) = (Cert::parse(&leaf).unwrap(), Cert::parse(&ca).unwrap());
    let now = now_secs();
    let next = der::verify_response(&resp, &leaf, &ca, now).unwrap();
    let next = next.expect("-ndays sets nextUpdate");
    assert!(next > now && next <= now + 86_400 + 60, "{next} vs {now}");
    // Past its nextUpdate (and the five minutes of skew) it no longer passes.
    let e = der::verify_response(&resp, &leaf, &ca, next + 301).unwrap_err();
    assert_eq!(e, "OCSP_check_validity() failed: status expired");
    let e = der::verify_response(&resp, &leaf, &ca, 1_000_000).unwrap_err();
    assert_eq!(e, "OCSP_check_validity() failed: status not yet valid");
}

#[test]
fn revoked_unsigned_and_foreign_answers_fail() {
    let (_t, dir) = setup();
    let (leaf_der, ca_der) = (der_of(&dir, "leaf.pem"), der_of(&dir, "ca.pem"));
    let (leaf, ca) = (
        Cert::parse(&leaf_der).unwrap(),
        Cert::parse(&ca_der).unwrap(),
    );
    let now = now_secs();
    let revoked = respond(&dir, "R", "ca.pem", "ca.key");
    assert_eq!(
        der::verify_response(&revoked, &leaf, &ca, now).unwrap_err(),
        "certificate status \"revoked\" in the OCSP response"
    );
    // Signed by a CA of the same name but another key.
    let forged = respond(&dir, "V", "other.pem", "other.key");
    let e = der::verify_response(&forged, &leaf, &ca, now).unwrap_err();
    assert!(e.starts_with("OCSP_basic_verify() failed"), "{e}");
    // A delegated responder needs the OCSP-signing purpose.
    let delegated = respond(&dir, "V", "resp.pem", "resp.key");
    assert!(der::verify_response(&delegated, &leaf, &ca, now).is_ok());
    let plain = respond(&dir, "V", "plain.pem", "plain.key");
    assert_eq!(
        der::verify_response(&plain, &leaf, &ca, now).unwrap_err(),
        "OCSP_basic_verify() failed: the responder's certificate is not for OCSP signing"
    );
    // An answer about another certificate (the CA's own serial).
    let other = Cert::parse(&ca_der).unwrap();
    let e = der::verify_response(&delegated, &other, &ca, now).unwrap_err();
    assert_eq!(e, "certificate id not found in OCSP response");
    // Not an OCSP response at all; an unsuccessful one (tryLater).
    assert!(der::verify_response(b"\x30\x03\x0a\x01", &leaf, &ca, now).is_err());
    assert_eq!(
        der::verify_response(b"\x30\x03\x0a\x01\x03", &leaf, &ca, now).unwrap_err(),
        "OCSP response not successful (3)"
    );
}

#[test]
fn times_and_lengths_read_as_der_has_them() {
    assert_eq!(
        der::generalized_time(b"20261207060000Z").unwrap(),
        1_796_623_200
    );
    assert_eq!(der::generalized_time(b"19700101000001.5Z").unwrap(), 1);
    assert!(der::generalized_time(b"20261207060000").is_err());
    let long = vec![7u8; 300];
    let t = der::tlv(0x04, &long);
    assert_eq!(&t[..4], &[0x04, 0x82, 0x01, 0x2c]);
    let read = der::Reader::new(&t).next().unwrap();
    assert_eq!(read.content.len(), 300);
    assert!(der::Reader::new(&t[..100]).next().is_err());
}

/// An HTTP server answering each connection with `answer`, giving the requests it read.
async fn responder(
    answer: &'static [u8],
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ocsp", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            // The head, then the body its Content-Length announces.
            loop {
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                got.extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(got);
            let _ = s.write_all(answer).await;
        }
    });
    (url, rx)
}

#[tokio::test]
async fn the_responder_exchange_posts_the_request_and_reads_the_answer() {
    let (url, mut seen) = responder(b"HTTP/1.1 200 OK\r\nContent-Type: application/ocsp-response\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").await;
    assert_eq!(fetch(&url, b"REQ").await.unwrap(), b"abcde");
    let req = String::from_utf8(seen.recv().await.unwrap()).unwrap();
    assert!(req.starts_with("POST /ocsp HTTP/1.1\r\n"), "{req}");
    assert!(
        req.contains("Content-Type: application/ocsp-request\r\n"),
        "{req}"
    );
    assert!(req.ends_with("\r\n\r\nREQ"), "{req}");

    let (url, _) = responder(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n").await;
    assert_eq!(
        fetch(&url, b"REQ").await.unwrap_err(),
        "ocsp responder returns bad http status code: 500"
    );
    let (url, _) = responder(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    assert_eq!(
        fetch(&url, b"REQ").await.unwrap_err(),
        "ocsp responder returns empty body"
    );
    let e = fetch("https://127.0.0.1:1/", b"REQ").await.unwrap_err();
    assert!(e.starts_with("ocsp responder query failed: "), "{e}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("http://127.0.0.1:{port}/");
    let e = fetch(&closed, b"REQ").await.unwrap_err();
    assert!(e.starts_with("ocsp responder query failed: "), "{e}");
}

/// Without an AIA responder or an issuer in the chain, APISIX's messages.
#[tokio::test]
async fn a_chain_without_responder_or_issuer_is_named() {
    let (_t, dir) = setup();
    let stapler = OcspStapler::new(tokio::runtime::Handle::current());
    let conf = OcspStapling {
        enabled: true,
        skip_verify: false,
        cache_ttl: 3600,
    };
    let ca = CertificateDer::from(der_of(&dir, "ca.pem"));
    let leaf = CertificateDer::from(der_of(&dir, "leaf.pem"));
    assert_eq!(
        stapler
            .answer(std::slice::from_ref(&ca), &conf)
            .await
            .unwrap_err(),
        "failed to get ocsp url: cert not contains authority_information_access extension"
    );
    assert_eq!(
        stapler.answer(&[leaf], &conf).await.unwrap_err(),
        "failed to create ocsp request: no issuer certificate in chain"
    );
}

/// A responder's good answer is checked and cached: asked again, the stapler does not ask the
/// responder, and it asks again no later than the answer's nextUpdate or `cache_ttl`. An
/// answer that fails the check is not kept: the next try asks again.
#[tokio::test]
async fn answers_are_cached_and_refreshed_before_they_expire() {
    let (_t, dir) = setup();
    let good: &'static [u8] = Box::leak(respond(&dir, "V", "ca.pem", "ca.key").into_boxed_slice());
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/ocsp-response\r\nContent-Length: {}\r\n\r\n",
        good.len()
    );
    let answer: &'static [u8] = Box::leak([head.as_bytes(), good].concat().into_boxed_slice());
    let (url, mut asked) = responder(answer).await;
    // A leaf whose AIA names this responder.
    std::fs::write(
        dir.join("x.ext"),
        format!("authorityInfoAccess=OCSP;URI:{url}\n"),
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "0x1234",
            "-days",
            "30",
            "-extfile",
            "x.ext",
            "-out",
            "here.pem",
        ],
    );
    let chain = [
        CertificateDer::from(der_of(&dir, "here.pem")),
        CertificateDer::from(der_of(&dir, "ca.pem")),
    ];
    let stapler = OcspStapler::new(tokio::runtime::Handle::current());
    let conf = OcspStapling {
        enabled: true,
        skip_verify: false,
        cache_ttl: 3600,
    };
    let (resp, next, refresh) = stapler.answer(&chain, &conf).await.unwrap();
    assert_eq!(resp, good);
    let next = next.expect("the answer has a nextUpdate");
    assert!(refresh <= Duration::from_secs(next.saturating_sub(now_secs()) + 1));
    assert!(refresh <= Duration::from_secs(3600) && refresh >= Duration::from_secs(1));
    assert!(asked.recv().await.is_some());
    let (again, _, _) = stapler.answer(&chain, &conf).await.unwrap();
    assert_eq!(again, good);
    assert!(
        asked.try_recv().is_err(),
        "the second answer came from the cache"
    );

    // The same answer for another CA's view of the chain fails the check, and is dropped.
    let foreign = [
        CertificateDer::from(der_of(&dir, "here.pem")),
        CertificateDer::from(der_of(&dir, "other.pem")),
    ];
    let e = stapler.answer(&foreign, &conf).await.unwrap_err();
    assert!(e.starts_with("failed to validate ocsp response: "), "{e}");
    assert!(asked.recv().await.is_some());
    assert!(stapler.answer(&foreign, &conf).await.is_err());
    assert!(
        asked.recv().await.is_some(),
        "asked again after a failed check"
    );
    // skip_verify: stapled as it came.
    let skip = OcspStapling {
        skip_verify: true,
        ..conf
    };
    let (unchecked, next, _) = stapler.answer(&foreign, &skip).await.unwrap();
    assert_eq!((unchecked.as_slice(), next), (good, None));
}

#[test]
fn answers_that_do_not_parse_are_errors_not_panics() {
    let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    let huge = [&head[..], b"ffffffffffffffff\r\nab"].concat();
    assert!(complete_body(&huge).is_err());
    let partial = [&head[..], b"5\r\nab"].concat();
    assert_eq!(complete_body(&partial).unwrap(), None);
    assert!(complete_body(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
    assert!(status_of(b"garbage").is_err());
    for bad in [
        &b""[..],
        b"\x30",
        b"\x30\x85\x01\x01\x01\x01\x01",
        b"\x30\x02\x02\x01",
        b"\x1f\x00",
    ] {
        assert!(Cert::parse(bad).is_err());
    }
}
