//! APISIX's per-request client-certificate rules (`apisix/init.lua` `verify_https_client`),
//! for requests over TLS.
//!
//! * An ssl with `client.skip_mtls_uri_regex` lets the handshake through without a verified
//!   certificate; a request whose URI matches none of the regexes then needs one.
//! * When the request's Host names an ssl with `client`, the SNI of the handshake must be that
//!   host: a certificate verified for one name does not open another.
//!
//! A refusal is answered 400 by the caller; its reason, logged, quotes client names cut short.

use crate::accept::{ClientVerify, TlsConnInfo};
use crate::store::CertStore;

/// `Ok` when the request may go on; `Err` is the reason logged before the 400.
pub fn check_request(
    conn: &TlsConnInfo,
    store: &CertStore,
    uri: &str,
    host: Option<&str>,
) -> Result<(), String> {
    if let Some(policy) = &conn.ssl.client {
        if !policy.skip_uri.is_empty() && !policy.skip_uri.iter().any(|r| r.is_match(uri)) {
            match &conn.client_verify {
                ClientVerify::Success => {}
                ClientVerify::None => return Err("client certificate was not present".into()),
                ClientVerify::Failed(e) => {
                    return Err(format!(
                        "client certificate verification is not passed: {e}"
                    ))
                }
            }
        }
    }
    let Some(host) = host else { return Ok(()) };
    let Some(by_host) = store.lookup(host) else {
        return Ok(());
    };
    if by_host.client.is_some() && conn.sni.as_deref() != Some(host) {
        // Both names are the client's: cut short for the log.
        return Err(format!(
            "client certificate verified with SNI {}, but the host is {}",
            ferrisix_net::clip(conn.sni.as_deref().unwrap_or("")),
            ferrisix_net::clip(host)
        ));
    }
    Ok(())
}
