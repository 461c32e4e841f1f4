//! nginx's `ssl_ciphers` (an OpenSSL cipher list) mapped onto rustls's TLS 1.2 suites.
//!
//! As in nginx, the list shapes TLS 1.2 only: TLS 1.3 suites are always on (OpenSSL sets those
//! with `Ciphersuites`, which APISIX does not expose). Names OpenSSL knows but rustls does not
//! implement (DHE, CBC, RSA key exchange ...) are skipped; a name OpenSSL would not know either
//! is a configuration error naming it.

use rustls::crypto::ring::cipher_suite as cs;
use rustls::SupportedCipherSuite;

/// OpenSSL names of the suites rustls has, with the suite.
const SUPPORTED: [(&str, SupportedCipherSuite); 6] = [
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

const TLS13: [SupportedCipherSuite; 3] = [
    cs::TLS13_AES_128_GCM_SHA256,
    cs::TLS13_AES_256_GCM_SHA384,
    cs::TLS13_CHACHA20_POLY1305_SHA256,
];

/// OpenSSL suite names rustls does not implement: accepted and skipped.
const KNOWN_UNSUPPORTED: &[&str] = &[
    "DHE-RSA-AES128-GCM-SHA256",
    "DHE-RSA-AES256-GCM-SHA384",
    "DHE-RSA-CHACHA20-POLY1305",
    "DHE-DSS-AES128-GCM-SHA256",
    "DHE-DSS-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-RSA-AES128-SHA256",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES256-SHA384",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "DHE-RSA-AES128-SHA256",
    "DHE-RSA-AES256-SHA256",
    "DHE-RSA-AES128-SHA",
    "DHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA256",
    "AES256-SHA256",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
    "ECDHE-ECDSA-AES128-CCM",
    "ECDHE-ECDSA-AES256-CCM",
    "ECDHE-ECDSA-AES128-CCM8",
    "ECDHE-ECDSA-AES256-CCM8",
    "ECDHE-ECDSA-ARIA128-GCM-SHA256",
    "ECDHE-ECDSA-ARIA256-GCM-SHA384",
    "ECDHE-ARIA128-GCM-SHA256",
    "ECDHE-ARIA256-GCM-SHA384",
    "ECDHE-ECDSA-CAMELLIA128-SHA256",
    "ECDHE-RSA-CAMELLIA128-SHA256",
];

/// OpenSSL cipher-string keywords that select groups; each selects every rustls suite (they
/// all are strong AEAD suites with forward secrecy).
const GROUP_KEYWORDS: &[&str] = &[
    "ALL",
    "DEFAULT",
    "HIGH",
    "ECDHE",
    "EECDH",
    "kEECDH",
    "TLSv1.2",
    "COMPLEMENTOFDEFAULT",
    "SECURE128",
    "SECURE192",
    "SUITEB128",
];

/// `aECDSA` / `aRSA` style keywords that select by authentication.
fn auth_keyword(token: &str) -> Option<bool> {
    match token {
        "aECDSA" | "ECDSA" => Some(true),
        "aRSA" | "RSA" | "kRSA" => Some(false),
        _ => None,
    }
}

fn is_ecdsa(suite: &SupportedCipherSuite) -> bool {
    SUPPORTED
        .iter()
        .any(|(n, s)| s.suite() == suite.suite() && n.contains("ECDSA"))
}

/// The suites an `ssl_ciphers` value enables, TLS 1.3 ones first. Exclusions (`!x`, `-x`) and
/// ordering directives (`+x`, `@STRENGTH`) are honoured where they name something rustls has.
pub fn parse(list: &str) -> Result<Vec<SupportedCipherSuite>, String> {
    let mut chosen: Vec<SupportedCipherSuite> = Vec::new();
    let mut excluded: Vec<SupportedCipherSuite> = Vec::new();
    for raw in list.split([':', ',', ' ']).filter(|t| !t.is_empty()) {
        let (negate, token) = match raw.as_bytes()[0] {
            b'!' | b'-' => (true, &raw[1..]),
            b'+' => (false, &raw[1..]),
            _ => (false, raw),
        };
        if token.starts_with('@') {
            continue;
        }
        // `ECDHE+AESGCM` style combinations: a suite must match every part.
        let mut selected: Option<Vec<SupportedCipherSuite>> = None;
        for part in token.split('+') {
            let matching: Vec<SupportedCipherSuite> = match selection(part) {
                Some(s) => s,
                None if negate || raw.starts_with('+') => Vec::new(),
                None => return Err(format!("apisix.ssl.ssl_ciphers: unknown cipher {part}")),
            };
            selected = Some(match selected {
                None => matching,
                Some(prev) => prev
                    .into_iter()
                    .filter(|s| matching.iter().any(|m| m.suite() == s.suite()))
                    .collect(),
            });
        }
        for s in selected.unwrap_or_default() {
            if negate {
                excluded.push(s);
            } else if !chosen.iter().any(|c| c.suite() == s.suite()) {
                chosen.push(s);
            }
        }
    }
    chosen.retain(|s| !excluded.iter().any(|e| e.suite() == s.suite()));
    if chosen.is_empty() {
        return Err(format!(
            "apisix.ssl.ssl_ciphers: {list:?} enables no cipher suite this build supports"
        ));
    }
    let mut out: Vec<SupportedCipherSuite> = TLS13.to_vec();
    out.extend(chosen);
    Ok(out)
}

/// What one cipher-string element selects; `None` when OpenSSL would not know it.
fn selection(token: &str) -> Option<Vec<SupportedCipherSuite>> {
    if let Some((_, s)) = SUPPORTED.iter().find(|(n, _)| *n == token) {
        return Some(vec![*s]);
    }
    // IANA names (TLS_ECDHE_...) as rustls spells them.
    if let Some((_, s)) = SUPPORTED
        .iter()
        .find(|(_, s)| format!("{:?}", s.suite()) == token)
    {
        return Some(vec![*s]);
    }
    if KNOWN_UNSUPPORTED.contains(&token) {
        return Some(Vec::new());
    }
    if GROUP_KEYWORDS.contains(&token) {
        return Some(SUPPORTED.iter().map(|(_, s)| *s).collect());
    }
    let by_name = |f: &dyn Fn(&str) -> bool| {
        SUPPORTED
            .iter()
            .filter(|(n, _)| f(n))
            .map(|(_, s)| *s)
            .collect::<Vec<_>>()
    };
    match token {
        "AESGCM" => return Some(by_name(&|n| n.contains("GCM"))),
        "CHACHA20" => return Some(by_name(&|n| n.contains("CHACHA20"))),
        "AES" => return Some(by_name(&|n| n.contains("AES"))),
        "AES128" => return Some(by_name(&|n| n.contains("AES128"))),
        "AES256" => return Some(by_name(&|n| n.contains("AES256"))),
        "SHA256" => return Some(by_name(&|n| n.ends_with("SHA256") || n.contains("CHACHA"))),
        "SHA384" => return Some(by_name(&|n| n.ends_with("SHA384"))),
        _ => {}
    }
    if let Some(ecdsa) = auth_keyword(token) {
        return Some(
            SUPPORTED
                .iter()
                .map(|(_, s)| *s)
                .filter(|s| is_ecdsa(s) == ecdsa)
                .collect(),
        );
    }
    // Classes rustls has none of: selecting or excluding them changes nothing.
    const EMPTY_CLASSES: &[&str] = &[
        "aNULL", "eNULL", "NULL", "MD5", "RC4", "DES", "3DES", "EXP", "EXPORT", "LOW", "MEDIUM",
        "PSK", "SRP", "DSS", "aDSS", "CAMELLIA", "SEED", "IDEA", "ADH", "AECDH", "kDHE", "DHE",
        "EDH", "kEDH", "SHA", "SHA1", "CBC", "CCM", "ARIA", "aPSK", "kPSK", "DH", "kDH",
    ];
    if EMPTY_CLASSES.contains(&token) {
        return Some(Vec::new());
    }
    None
}

/// Whether `suite` authenticates with ECDSA (TLS 1.2); TLS 1.3 suites are independent of the
/// certificate's key.
pub fn tls12_auth_is_ecdsa(suite: rustls::CipherSuite) -> Option<bool> {
    SUPPORTED
        .iter()
        .find(|(_, s)| s.suite() == suite)
        .map(|(n, _)| n.contains("ECDSA"))
}

pub fn is_tls13(suite: rustls::CipherSuite) -> bool {
    TLS13.iter().any(|s| s.suite() == suite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrisix_config::settings::DEFAULT_SSL_CIPHERS;

    #[test]
    fn apisix_default_list() {
        let suites = parse(DEFAULT_SSL_CIPHERS).unwrap();
        // 3 TLS 1.3 + the 6 ECDHE AEAD suites; the DHE ones are skipped.
        assert_eq!(suites.len(), 9);
        assert_eq!(
            suites[3].suite(),
            rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        );
    }

    #[test]
    fn keywords_and_exclusions() {
        assert_eq!(parse("HIGH:!aNULL:!MD5").unwrap().len(), 9);
        let ecdsa = parse("HIGH:!aRSA").unwrap();
        assert_eq!(ecdsa.len(), 6);
        assert!(ecdsa[3..].iter().all(is_ecdsa));
        assert_eq!(parse("ECDHE+AESGCM").unwrap().len(), 3 + 4);
        assert_eq!(
            parse("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn unknown_name_is_named() {
        assert_eq!(
            parse("ECDHE-RSA-AES128-GCM-SHA256:NOT-A-CIPHER").unwrap_err(),
            "apisix.ssl.ssl_ciphers: unknown cipher NOT-A-CIPHER"
        );
        assert!(parse("DHE-RSA-AES128-GCM-SHA256").is_err(), "nothing left");
    }
}
