//! PEM certificates and private keys as APISIX's Admin API checks them (`apisix/ssl.lua`
//! `validate`): a certificate must parse as X.509, a key as a private key the TLS stack can
//! sign with. The messages are OpenSSL's, which APISIX passes on verbatim.
//!
//! The TLS crate loads certificates through the same functions, so what the Admin API accepts
//! is exactly what the data plane can serve.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// OpenSSL's message for a certificate that does not parse.
pub const BAD_CERT: &str = "PEM_read_bio_X509_AUX() failed";
/// OpenSSL's message for a private key that does not parse.
pub const BAD_KEY: &str = "PEM_read_bio_PrivateKey() failed";

/// Every certificate of a PEM chain, leaf first. Fails when there is none or one is not X.509.
pub fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut out = Vec::new();
    for item in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = item.map_err(|_| BAD_CERT.to_owned())?;
        webpki::EndEntityCert::try_from(&der).map_err(|_| BAD_CERT.to_owned())?;
        out.push(der);
    }
    if out.is_empty() {
        return Err(BAD_CERT.to_owned());
    }
    Ok(out)
}

/// A private key (PKCS#8, PKCS#1 RSA or SEC1 EC) that the TLS stack can use.
pub fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| BAD_KEY.to_owned())?;
    rustls::crypto::ring::sign::any_supported_type(&key).map_err(|_| BAD_KEY.to_owned())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_garbage() {
        assert_eq!(parse_certs("hello").unwrap_err(), BAD_CERT);
        assert_eq!(
            parse_certs("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
                .unwrap_err(),
            BAD_CERT
        );
        assert_eq!(parse_key("hello").unwrap_err(), BAD_KEY);
        assert_eq!(
            parse_key("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n")
                .unwrap_err(),
            BAD_KEY
        );
    }
}
