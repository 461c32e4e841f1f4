//! The proxy-wasm ABI's numbers and encodings (ABI 0.2.1): the status codes host calls
//! return, the header map and buffer kinds, and the header-pair wire format.

/// `WasmResult`: what every host call returns.
pub(crate) mod status {
    pub const OK: i32 = 0;
    pub const NOT_FOUND: i32 = 1;
    pub const BAD_ARGUMENT: i32 = 2;
    pub const INVALID_MEMORY_ACCESS: i32 = 6;
    pub const EMPTY: i32 = 7;
    pub const CAS_MISMATCH: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
}

/// `MapType`.
pub(crate) mod map {
    pub const REQUEST_HEADERS: i32 = 0;
    pub const REQUEST_TRAILERS: i32 = 1;
    pub const RESPONSE_HEADERS: i32 = 2;
    pub const RESPONSE_TRAILERS: i32 = 3;
    pub const HTTP_CALL_RESPONSE_HEADERS: i32 = 6;
    pub const HTTP_CALL_RESPONSE_TRAILERS: i32 = 7;
}

/// `BufferType`.
pub(crate) mod buffer {
    pub const REQUEST_BODY: i32 = 0;
    pub const RESPONSE_BODY: i32 = 1;
    pub const HTTP_CALL_RESPONSE_BODY: i32 = 4;
    pub const VM_CONFIGURATION: i32 = 6;
    pub const PLUGIN_CONFIGURATION: i32 = 7;
}

/// `proxy_on_request_headers` and friends: `Continue` (0) or `Pause` (1, and anything else).
pub(crate) const ACTION_CONTINUE: i32 = 0;

/// Header pairs as the ABI passes them: the count, each pair's two lengths, then each name and
/// value followed by a NUL byte (all integers little-endian u32).
pub(crate) fn encode_pairs<'a>(
    pairs: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
) -> Vec<u8> {
    let n = pairs.clone().count();
    let bytes: usize = pairs.clone().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + n * 8 + bytes);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for (k, v) in pairs.clone() {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// The pairs of [`encode_pairs`]'s format; `None` when `data` is not well formed.
pub(crate) fn decode_pairs(data: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if data.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = data.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = u32_at(0)?;
    let mut lens = Vec::with_capacity(n.min(1024));
    for i in 0..n {
        lens.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4usize.checked_add(n.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(lens.len());
    for (kl, vl) in lens {
        let k = data.get(at..at.checked_add(kl)?)?.to_vec();
        at += kl + 1;
        let v = data.get(at..at.checked_add(vl)?)?.to_vec();
        at += vl + 1;
        out.push((k, v));
    }
    Some(out)
}

/// A property path: its segments, NUL-separated on the wire.
pub(crate) fn path_segments(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == 0).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs: Vec<(&[u8], &[u8])> = vec![(b"a", b"1"), (b"host", b""), (b":path", b"/x")];
        let wire = encode_pairs(pairs.iter().copied());
        assert_eq!(&wire[..4], &3u32.to_le_bytes());
        let back = decode_pairs(&wire).unwrap();
        let back: Vec<(&[u8], &[u8])> = back.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        assert_eq!(back, pairs);
        assert_eq!(decode_pairs(&[]), Some(vec![]));
    }

    #[test]
    fn malformed_pairs_are_refused() {
        let mut wire = encode_pairs([(&b"name"[..], &b"value"[..])].into_iter());
        wire.truncate(wire.len() - 3);
        assert_eq!(decode_pairs(&wire), None);
        assert_eq!(decode_pairs(&[9, 0, 0, 0]), None);
        assert_eq!(decode_pairs(&[0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn property_paths_split_on_nul() {
        assert_eq!(
            path_segments(b"request\0path"),
            vec![&b"request"[..], b"path"]
        );
        assert_eq!(path_segments(b"remote_addr"), vec![&b"remote_addr"[..]]);
    }
}
