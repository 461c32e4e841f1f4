//! The DER that OCSP needs, read and written by hand: the fields of a certificate that name
//! its issuer, serial, key and OCSP responder; the request (RFC 6960 `OCSPRequest` of one
//! `CertID`, no nonce, as `ngx.ocsp.create_ocsp_request` makes it); and the response's check
//! (`ngx.ocsp.validate_ocsp_response`: successful, signed by the issuer or by a responder the
//! issuer delegated to, the certificate's status `good`, within its validity).

use ring::digest;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};

/// One DER element: its tag, its content, and the whole element (tag and length included).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tlv<'a> {
    pub tag: u8,
    pub content: &'a [u8],
    pub whole: &'a [u8],
}

/// Reads DER elements one after another out of a slice.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader(data)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn peek_tag(&self) -> Option<u8> {
        self.0.first().copied()
    }

    pub fn next(&mut self) -> Result<Tlv<'a>, String> {
        let data = self.0;
        let (&tag, rest) = data.split_first().ok_or("DER: unexpected end")?;
        if tag & 0x1f == 0x1f {
            return Err("DER: multi-byte tags are not used by OCSP".into());
        }
        let (&first, rest) = rest.split_first().ok_or("DER: unexpected end")?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return Err("DER: bad length".into());
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return Err("DER: element longer than its input".into());
        }
        let header = data.len() - rest.len();
        let whole = &data[..header + len];
        self.0 = &rest[len..];
        Ok(Tlv {
            tag,
            content: &rest[..len],
            whole,
        })
    }

    /// The next element, which must have `tag`.
    pub fn expect(&mut self, tag: u8, what: &str) -> Result<Tlv<'a>, String> {
        let t = self.next().map_err(|e| format!("{what}: {e}"))?;
        if t.tag != tag {
            return Err(format!("{what}: tag {:#04x}, expected {tag:#04x}", t.tag));
        }
        Ok(t)
    }

    /// The next element if it has `tag`.
    pub fn optional(&mut self, tag: u8) -> Result<Option<Tlv<'a>>, String> {
        if self.peek_tag() == Some(tag) {
            self.next().map(Some)
        } else {
            Ok(None)
        }
    }
}

pub(crate) const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const NULL: u8 = 0x05;
const OID: u8 = 0x06;
const ENUMERATED: u8 = 0x0a;
const GENERALIZED_TIME: u8 = 0x18;

/// Object identifiers, as their DER content.
mod oid {
    pub const AIA: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 1, 1];
    pub const AD_OCSP: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 48, 1];
    pub const OCSP_BASIC: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 48, 1, 1];
    pub const EXT_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
    pub const KP_OCSP_SIGNING: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 3, 9];
    pub const SHA1: &[u8] = &[0x2b, 0x0e, 3, 2, 0x1a];
    pub const SHA256: &[u8] = &[0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 1];
    pub const RSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 5];
    pub const RSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 11];
    pub const RSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 12];
    pub const RSA_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 13];
    pub const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2];
    pub const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 3];
    pub const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
    pub const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 3, 1, 7];
    pub const P384: &[u8] = &[0x2b, 0x81, 0x04, 0, 0x22];
}

/// The content of a BIT STRING without its unused-bits byte (whole bytes only).
fn bits(t: Tlv<'_>) -> Result<&[u8], String> {
    match t.content.split_first() {
        Some((0, rest)) => Ok(rest),
        _ => Err("DER: bit string with unused bits".into()),
    }
}

/// The fields of one X.509 certificate that OCSP uses.
#[derive(Debug)]
pub(crate) struct Cert<'a> {
    /// `tbsCertificate`, whole: what the issuer signed.
    pub tbs: &'a [u8],
    /// The signature algorithm's OID and the signature.
    pub sig_alg: &'a [u8],
    pub signature: &'a [u8],
    /// The serial number's INTEGER content.
    pub serial: &'a [u8],
    /// The issuer's and the subject's Name, whole.
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    /// The key's algorithm parameters (the curve of an EC key) and the key itself (the
    /// subjectPublicKey bits).
    pub key_params: &'a [u8],
    pub key: &'a [u8],
    /// The `OCSP` access locations of the Authority Information Access extension.
    pub ocsp_urls: Vec<String>,
    /// The extended key usage names `id-kp-OCSPSigning`.
    pub ocsp_signing: bool,
}

/// The OID of an AlgorithmIdentifier and its parameters (an OID for EC keys, else empty).
fn algorithm(t: Tlv<'_>) -> Result<(&[u8], &[u8]), String> {
    let mut r = Reader::new(t.content);
    let id = r.expect(OID, "algorithm")?.content;
    let params = match r.peek_tag() {
        Some(OID) => r.next()?.content,
        _ => &[],
    };
    Ok((id, params))
}

impl<'a> Cert<'a> {
    pub fn parse(der: &'a [u8]) -> Result<Cert<'a>, String> {
        let mut outer = Reader::new(der);
        let cert = outer.expect(SEQUENCE, "certificate")?;
        let mut r = Reader::new(cert.content);
        let tbs = r.expect(SEQUENCE, "tbsCertificate")?;
        let (sig_alg, _) = algorithm(r.expect(SEQUENCE, "signatureAlgorithm")?)?;
        let signature = bits(r.expect(BIT_STRING, "signature")?)?;
        let mut t = Reader::new(tbs.content);
        t.optional(0xa0)?;
        let serial = t.expect(INTEGER, "serialNumber")?.content;
        t.expect(SEQUENCE, "signature")?;
        let issuer = t.expect(SEQUENCE, "issuer")?.whole;
        t.expect(SEQUENCE, "validity")?;
        let subject = t.expect(SEQUENCE, "subject")?.whole;
        let spki = t.expect(SEQUENCE, "subjectPublicKeyInfo")?;
        let mut s = Reader::new(spki.content);
        let (_, key_params) = algorithm(s.expect(SEQUENCE, "key algorithm")?)?;
        let key = bits(s.expect(BIT_STRING, "subjectPublicKey")?)?;
        let mut ocsp_urls = Vec::new();
        let mut ocsp_signing = false;
        while !t.is_empty() {
            let field = t.next()?;
            if field.tag != 0xa3 {
                continue;
            }
            let mut exts = Reader::new(
                Reader::new(field.content)
                    .expect(SEQUENCE, "extensions")?
                    .content,
            );
            while !exts.is_empty() {
                let ext = exts.expect(SEQUENCE, "extension")?;
                let mut e = Reader::new(ext.content);
                let id = e.expect(OID, "extension id")?.content;
                e.optional(0x01)?;
                let value = e.expect(OCTET_STRING, "extension value")?.content;
                if id == oid::AIA {
                    let mut list = Reader::new(
                        Reader::new(value)
                            .expect(SEQUENCE, "authorityInfoAccess")?
                            .content,
                    );
                    while !list.is_empty() {
                        let ad = list.expect(SEQUENCE, "accessDescription")?;
                        let mut a = Reader::new(ad.content);
                        let method = a.expect(OID, "accessMethod")?.content;
                        let location = a.next()?;
                        // uniformResourceIdentifier [6] IA5String
                        if method == oid::AD_OCSP && location.tag == 0x86 {
                            ocsp_urls.push(String::from_utf8_lossy(location.content).into_owned());
                        }
                    }
                } else if id == oid::EXT_KEY_USAGE {
                    let mut list =
                        Reader::new(Reader::new(value).expect(SEQUENCE, "extKeyUsage")?.content);
                    while !list.is_empty() {
                        if list.expect(OID, "key purpose")?.content == oid::KP_OCSP_SIGNING {
                            ocsp_signing = true;
                        }
                    }
                }
            }
        }
        Ok(Cert {
            tbs: tbs.whole,
            sig_alg,
            signature,
            serial,
            issuer,
            subject,
            key_params,
            key,
            ocsp_urls,
            ocsp_signing,
        })
    }

    /// Checks that `signature` over `message` (made with `sig_alg`) is this certificate's key's.
    pub fn verify(&self, sig_alg: &[u8], message: &[u8], sig: &[u8]) -> Result<(), String> {
        let alg: &'static dyn VerificationAlgorithm = match sig_alg {
            oid::RSA_SHA1 => &signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            oid::RSA_SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            oid::RSA_SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
            oid::RSA_SHA512 => &signature::RSA_PKCS1_2048_8192_SHA512,
            oid::ECDSA_SHA256 | oid::ECDSA_SHA384 => {
                let sha384 = sig_alg == oid::ECDSA_SHA384;
                match (self.key_params, sha384) {
                    (oid::P256, false) => &signature::ECDSA_P256_SHA256_ASN1,
                    (oid::P256, true) => &signature::ECDSA_P256_SHA384_ASN1,
                    (oid::P384, false) => &signature::ECDSA_P384_SHA256_ASN1,
                    (oid::P384, true) => &signature::ECDSA_P384_SHA384_ASN1,
                    _ => return Err("unsupported elliptic curve".into()),
                }
            }
            oid::ED25519 => &signature::ED25519,
            _ => return Err("unsupported signature algorithm".into()),
        };
        UnparsedPublicKey::new(alg, self.key)
            .verify(message, sig)
            .map_err(|_| "signature verification failed".to_string())
    }

    /// Whether `issuer` issued this certificate: names match and its key signed it.
    pub fn issued_by(&self, issuer: &Cert<'_>) -> bool {
        self.issuer == issuer.subject
            && issuer
                .verify(self.sig_alg, self.tbs, self.signature)
                .is_ok()
    }
}

/// One DER element of `tag` around `content`.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

fn hash(alg: &[u8], data: &[u8]) -> Result<Vec<u8>, String> {
    let alg = match alg {
        oid::SHA1 => &digest::SHA1_FOR_LEGACY_USE_ONLY,
        oid::SHA256 => &digest::SHA256,
        _ => return Err("unsupported CertID hash algorithm".into()),
    };
    Ok(digest::digest(alg, data).as_ref().to_vec())
}

/// The `CertID` of `leaf` issued by `issuer`, with SHA-1 as OpenSSL's `OCSP_cert_to_id`.
pub(crate) fn cert_id(leaf: &Cert<'_>, issuer: &Cert<'_>) -> Vec<u8> {
    let alg = tlv(SEQUENCE, &[tlv(OID, oid::SHA1), tlv(NULL, &[])].concat());
    // SHA-1 is always available: these cannot fail.
    let name_hash = hash(oid::SHA1, issuer.subject).unwrap_or_default();
    let key_hash = hash(oid::SHA1, issuer.key).unwrap_or_default();
    tlv(
        SEQUENCE,
        &[
            alg,
            tlv(OCTET_STRING, &name_hash),
            tlv(OCTET_STRING, &key_hash),
            tlv(INTEGER, leaf.serial),
        ]
        .concat(),
    )
}

/// An `OCSPRequest` for `leaf`'s status.
pub(crate) fn request(leaf: &Cert<'_>, issuer: &Cert<'_>) -> Vec<u8> {
    let one = tlv(SEQUENCE, &cert_id(leaf, issuer));
    let list = tlv(SEQUENCE, &one);
    let tbs = tlv(SEQUENCE, &list);
    tlv(SEQUENCE, &tbs)
}

/// Seconds since the epoch of a GeneralizedTime (`YYYYMMDDHHMMSS[.f]Z`).
pub(crate) fn generalized_time(t: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(t).map_err(|_| "bad time")?;
    let text = text.strip_suffix('Z').ok_or("time not in UTC")?;
    let text = text.split('.').next().unwrap_or(text);
    if text.len() != 14 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad time {text:?}"));
    }
    let n = |a: usize, b: usize| text[a..b].parse::<i64>().unwrap_or(0);
    let (y, m, d) = (n(0, 4), n(4, 6), n(6, 8));
    // Howard Hinnant's days-from-civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + n(8, 10) * 3600 + n(10, 12) * 60 + n(12, 14);
    u64::try_from(secs).map_err(|_| "time before 1970".to_string())
}

/// How far a response's times may be off the clock (OpenSSL's `OCSP_check_validity` with
/// nginx's five minutes).
const CLOCK_SKEW: u64 = 300;

/// Checks a DER `OCSPResponse` for `leaf` issued by `issuer` at `now` (seconds since the
/// epoch), as `ngx.ocsp.validate_ocsp_response` does; `Ok` carries the response's `nextUpdate`
/// when it has one.
pub(crate) fn verify_response(
    resp: &[u8],
    leaf: &Cert<'_>,
    issuer: &Cert<'_>,
    now: u64,
) -> Result<Option<u64>, String> {
    let outer = Reader::new(resp).expect(SEQUENCE, "OCSPResponse")?;
    let mut r = Reader::new(outer.content);
    let status = r.expect(ENUMERATED, "responseStatus")?.content;
    if status != [0] {
        let code = status.last().copied().unwrap_or(0xff);
        return Err(format!("OCSP response not successful ({code})"));
    }
    let bytes = r.expect(0xa0, "responseBytes")?;
    let mut b = Reader::new(
        Reader::new(bytes.content)
            .expect(SEQUENCE, "responseBytes")?
            .content,
    );
    if b.expect(OID, "responseType")?.content != oid::OCSP_BASIC {
        return Err("OCSP response is not a basic response".into());
    }
    let basic_der = b.expect(OCTET_STRING, "response")?.content;
    let basic = Reader::new(basic_der).expect(SEQUENCE, "BasicOCSPResponse")?;
    let mut br = Reader::new(basic.content);
    let tbs = br.expect(SEQUENCE, "tbsResponseData")?;
    let (sig_alg, _) = algorithm(br.expect(SEQUENCE, "signatureAlgorithm")?)?;
    let sig = bits(br.expect(BIT_STRING, "signature")?)?;
    let mut certs = Vec::new();
    if let Some(list) = br.optional(0xa0)? {
        let mut l = Reader::new(Reader::new(list.content).expect(SEQUENCE, "certs")?.content);
        while !l.is_empty() {
            certs.push(l.expect(SEQUENCE, "certificate")?.whole);
        }
    }

    let mut t = Reader::new(tbs.content);
    t.optional(0xa0)?;
    let responder = t.next()?;
    let signed_by = |c: &Cert<'_>| match responder.tag {
        0xa1 => responder.content == c.subject,
        0xa2 => Reader::new(responder.content)
            .expect(OCTET_STRING, "byKey")
            .is_ok_and(|k| hash(oid::SHA1, c.key).is_ok_and(|h| h == k.content)),
        _ => false,
    };
    // The signer: the issuer itself, or a certificate of the response the issuer issued for
    // signing OCSP responses.
    if signed_by(issuer) {
        issuer
            .verify(sig_alg, tbs.whole, sig)
            .map_err(|e| format!("OCSP_basic_verify() failed: {e}"))?;
    } else {
        let parsed: Vec<Cert<'_>> = certs.iter().filter_map(|c| Cert::parse(c).ok()).collect();
        let signer = parsed
            .iter()
            .find(|c| signed_by(c))
            .ok_or("OCSP_basic_verify() failed: signer certificate not found")?;
        if !signer.issued_by(issuer) {
            return Err(
                "OCSP_basic_verify() failed: the responder's certificate is not the issuer's"
                    .into(),
            );
        }
        if !signer.ocsp_signing {
            return Err(
                "OCSP_basic_verify() failed: the responder's certificate is not for OCSP signing"
                    .into(),
            );
        }
        signer
            .verify(sig_alg, tbs.whole, sig)
            .map_err(|e| format!("OCSP_basic_verify() failed: {e}"))?;
    }

    t.expect(GENERALIZED_TIME, "producedAt")?;
    let mut responses = Reader::new(t.expect(SEQUENCE, "responses")?.content);
    while !responses.is_empty() {
        let single = responses.expect(SEQUENCE, "SingleResponse")?;
        let mut s = Reader::new(single.content);
        let id = s.expect(SEQUENCE, "certID")?;
        let mut c = Reader::new(id.content);
        let (hash_alg, _) = algorithm(c.expect(SEQUENCE, "hashAlgorithm")?)?;
        let name_hash = c.expect(OCTET_STRING, "issuerNameHash")?.content;
        let key_hash = c.expect(OCTET_STRING, "issuerKeyHash")?.content;
        let serial = c.expect(INTEGER, "serialNumber")?.content;
        let ours = serial == leaf.serial
            && hash(hash_alg, issuer.subject).is_ok_and(|h| h == name_hash)
            && hash(hash_alg, issuer.key).is_ok_and(|h| h == key_hash);
        if !ours {
            continue;
        }
        let status = s.next()?;
        match status.tag {
            0x80 => {}
            0xa1 => return Err("certificate status \"revoked\" in the OCSP response".into()),
            _ => return Err("certificate status \"unknown\" in the OCSP response".into()),
        }
        let this_update = generalized_time(s.expect(GENERALIZED_TIME, "thisUpdate")?.content)?;
        let next_update = match s.optional(0xa0)? {
            Some(n) => Some(generalized_time(
                Reader::new(n.content)
                    .expect(GENERALIZED_TIME, "nextUpdate")?
                    .content,
            )?),
            None => None,
        };
        if this_update > now + CLOCK_SKEW {
            return Err("OCSP_check_validity() failed: status not yet valid".into());
        }
        if next_update.is_some_and(|n| n + CLOCK_SKEW < now) {
            return Err("OCSP_check_validity() failed: status expired".into());
        }
        return Ok(next_update);
    }
    Err("certificate id not found in OCSP response".into())
}
