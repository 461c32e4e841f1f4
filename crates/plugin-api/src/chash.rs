//! APISIX's consistent hash: lua-resty-balancer's `resty.chash` ring and APISIX's choice of key.
//!
//! The ring is built the way `chash.c` builds it, so an APISIX node and a ferrisix node reading
//! one etcd send a key to the same upstream node: each node is named `host\0port` (APISIX
//! replaces every `:` of `host:port` by a NUL), its weight is divided by the gcd of all
//! weights, and it gets 160 points per remaining weight unit. Point `i` of a node is
//! `crc32(name ++ le_bytes(point i-1))`, the first one hashing four zero bytes after the name.
//! A key lands on the first point whose hash is at least `crc32(key)`, wrapping to the start.
//!
//! Here, in the plugin API, so the proxy's upstreams and ai-proxy-multi's instances (whose
//! ring ids are the instances' names) hash alike.

use std::borrow::Cow;

/// Points per weight unit (`CONSISTENT_POINTS` in resty.chash and APISIX).
pub const POINTS_PER_WEIGHT: u32 = 160;

/// The hash ring of one priority group.
#[derive(Debug)]
pub struct Ring {
    /// `(hash, member index)` sorted by hash; equal hashes keep insertion order as `chash.c`'s
    /// insertion sort does.
    points: Vec<(u32, u32)>,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The CRC-32 of `prefix ++ bytes` from `prefix_crc`, the CRC-32 of `prefix` (`chash.c` keeps
/// the unfinalised register `crc32(id) ^ 0xffffffff` and continues it the same way).
fn crc32_continue(prefix_crc: u32, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(prefix_crc);
    h.update(bytes);
    h.finalize()
}

/// The plain CRC-32 nginx's `ngx.crc32_short` computes.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The node name APISIX puts on the ring: `host:port` with every `:` turned into NUL.
pub fn ring_id(host: &str, port: u16) -> Vec<u8> {
    format!("{host}:{port}")
        .bytes()
        .map(|b| if b == b':' { 0 } else { b })
        .collect()
}

impl Ring {
    /// `members`: each member's ring id and weight, in the group's node order.
    pub fn new(members: &[(Vec<u8>, u32)]) -> Ring {
        let g = members.iter().map(|m| m.1).fold(0, gcd);
        // All weights 0: APISIX divides by 1 and the ring is empty; every node then gets one
        // unit instead, so the upstream still answers (resty.chash would read outside its
        // empty point array).
        let all_zero = g == 0;
        let g = g.max(1);
        let total: u64 = members
            .iter()
            .map(|m| if all_zero { 1 } else { u64::from(m.1 / g) })
            .sum();
        let mut points = Vec::with_capacity((total * u64::from(POINTS_PER_WEIGHT)) as usize);
        for (index, (id, weight)) in members.iter().enumerate() {
            let units = if all_zero { 1 } else { weight / g };
            let base = crc32(id);
            let mut prev = [0u8; 4];
            for _ in 0..units * POINTS_PER_WEIGHT {
                let hash = crc32_continue(base, &prev);
                points.push((hash, index as u32));
                prev = hash.to_le_bytes();
            }
        }
        // Stable: points of equal hash stay in the order they were generated.
        points.sort_by_key(|p| p.0);
        Ring { points }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// resty.chash `find`: the first point at or after `crc32(key)`; returns the member and the
    /// point index (where a retry continues with [`Ring::next`]).
    pub fn find(&self, key: &[u8]) -> Option<(usize, usize)> {
        if self.points.is_empty() {
            return None;
        }
        let hash = crc32(key);
        let idx = self.points.partition_point(|p| p.0 < hash);
        let idx = if idx == self.points.len() { 0 } else { idx };
        Some((self.points[idx].1 as usize, idx))
    }

    /// resty.chash `next`: the point after `index`, wrapping.
    pub fn next(&self, index: usize) -> (usize, usize) {
        let idx = (index + 1) % self.points.len();
        (self.points[idx].1 as usize, idx)
    }
}

/// Where a chash upstream takes its key from (`hash_on` with `key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashOn {
    /// An nginx variable (`uri`, `remote_addr`, `arg_x` ...).
    Vars(String),
    /// A request header: the variable `http_<key>`.
    Header(String),
    /// A cookie: the variable `cookie_<key>`.
    Cookie(String),
    /// The authenticated consumer's name.
    Consumer,
    /// A template such as `$host$uri` (`core.utils.resolve_var`).
    VarsCombinations(String),
}

impl HashOn {
    /// From the upstream's `hash_on` and `key` (already validated).
    pub fn from_config(hash_on: Option<&str>, key: Option<&str>) -> HashOn {
        let key = key.unwrap_or_default().to_string();
        match hash_on.unwrap_or("vars") {
            "header" => HashOn::Header(key),
            "cookie" => HashOn::Cookie(key),
            "consumer" => HashOn::Consumer,
            "vars_combinations" => HashOn::VarsCombinations(key),
            _ => HashOn::Vars(key),
        }
    }

    /// APISIX's `fetch_chash_hash_key`: the key's value, or `remote_addr` when it has none.
    pub fn key<'a>(
        &self,
        var: &dyn Fn(&str) -> Option<Cow<'a, str>>,
        consumer: Option<&'a str>,
    ) -> Cow<'a, str> {
        let found = match self {
            HashOn::Consumer => consumer.map(Cow::Borrowed),
            HashOn::Vars(name) => var(name),
            // nginx variable names: `-` in a header name reads as `_`, case folded.
            HashOn::Header(name) => var(&format!(
                "http_{}",
                name.to_ascii_lowercase().replace('-', "_")
            )),
            HashOn::Cookie(name) => var(&format!("cookie_{name}")),
            HashOn::VarsCombinations(tpl) => {
                let (text, resolved) = resolve_template(tpl, var);
                (resolved > 0).then_some(Cow::Owned(text))
            }
        };
        found.unwrap_or_else(|| var("remote_addr").unwrap_or(Cow::Borrowed("")))
    }
}

/// `core.utils.resolve_var`: replaces `$name` and `${name}` (with an optional `?? default`)
/// by the variable's value, an unknown one by nothing; `\$` stays. Returns the text and how
/// many variables had a value (APISIX falls back to `remote_addr` when none had).
pub fn resolve_template<'a>(
    tpl: &str,
    var: &dyn Fn(&str) -> Option<Cow<'a, str>>,
) -> (String, usize) {
    let bytes = tpl.as_bytes();
    let mut out = String::with_capacity(tpl.len());
    let mut resolved = 0;
    let mut i = 0;
    let mut literal_start = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || (i > 0 && bytes[i - 1] == b'\\') {
            i += 1;
            continue;
        }
        let (name, end) = if bytes.get(i + 1) == Some(&b'{') {
            match tpl[i + 2..].find('}') {
                Some(close) if !tpl[i + 2..i + 2 + close].trim().is_empty() => {
                    (tpl[i + 2..i + 2 + close].trim(), i + 3 + close)
                }
                _ => {
                    i += 1;
                    continue;
                }
            }
        } else {
            let len = tpl[i + 1..]
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
                .count();
            if len == 0 {
                i += 1;
                continue;
            }
            (&tpl[i + 1..i + 1 + len], i + 1 + len)
        };
        out.push_str(&tpl[literal_start..i]);
        let (name, default) = match name.split_once("??") {
            Some((n, d)) => (n.trim(), Some(d.trim())),
            None => (name, None),
        };
        match var(name) {
            Some(v) => {
                resolved += 1;
                out.push_str(&v);
            }
            None => {
                if let Some(d) = default {
                    resolved += 1;
                    out.push_str(d);
                }
            }
        }
        i = end;
        literal_start = end;
    }
    out.push_str(&tpl[literal_start..]);
    (out, resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(nodes: &[(&str, u16, u32)]) -> Ring {
        let members: Vec<(Vec<u8>, u32)> =
            nodes.iter().map(|(h, p, w)| (ring_id(h, *p), *w)).collect();
        Ring::new(&members)
    }

    #[test]
    fn crc_continuation_matches_one_pass() {
        let a = crc32_continue(crc32(b"127.0.0.1"), b"\0\0\0\0");
        assert_eq!(a, crc32(b"127.0.0.1\0\0\0\0"));
    }

    #[test]
    fn weights_divide_by_their_gcd() {
        let r = ring(&[("a", 1, 2), ("b", 1, 4)]);
        assert_eq!(r.len(), 3 * POINTS_PER_WEIGHT as usize);
        let r = ring(&[("a", 1, 0), ("b", 1, 3)]);
        assert_eq!(r.len(), POINTS_PER_WEIGHT as usize);
        for k in 0..100 {
            assert_eq!(r.find(format!("k{k}").as_bytes()).unwrap().0, 1);
        }
    }

    #[test]
    fn next_walks_and_wraps() {
        let r = ring(&[("a", 1, 1), ("b", 1, 1)]);
        let (_, last) = r.next(r.len() - 2);
        assert_eq!(last, r.len() - 1);
        assert_eq!(r.next(last).1, 0);
    }

    #[test]
    fn templates_resolve_like_apisix() {
        let var = |n: &str| -> Option<Cow<'static, str>> {
            match n {
                "host" => Some(Cow::Borrowed("h")),
                "uri" => Some(Cow::Borrowed("/u")),
                _ => None,
            }
        };
        assert_eq!(resolve_template("$host$uri", &var), ("h/u".into(), 2));
        assert_eq!(resolve_template("${host}-x", &var), ("h-x".into(), 1));
        assert_eq!(resolve_template("$nope", &var), ("".into(), 0));
        assert_eq!(resolve_template("${nope ?? d}", &var), ("d".into(), 1));
        assert_eq!(resolve_template("a\\$host", &var), ("a\\$host".into(), 0));
    }
}
