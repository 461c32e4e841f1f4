//! Node addresses as APISIX splits them.

use crate::schema::lua;

/// APISIX's `core.utils.parse_addr`: splits `host:port`, keeping IPv6 brackets; an address
/// with two or more colons and no brackets is an IPv6 literal without a port. The port is Lua's
/// `tonumber` of the text after the last colon (`None` when that is not a number).
pub(crate) fn parse_addr(addr: &str) -> (&str, Option<f64>) {
    // The last colon, searching from the second-to-last byte backwards (a trailing colon is
    // part of the host).
    let last_colon = |s: &str| {
        let b = s.as_bytes();
        (0..b.len().saturating_sub(1)).rev().find(|&i| b[i] == b':')
    };
    fn split(s: &str, at: usize) -> (&str, Option<f64>) {
        (&s[..at], lua::tonumber(&s[at + 1..]))
    }
    if addr.starts_with('[') {
        if addr.ends_with(']') {
            return (addr, None);
        }
        return match last_colon(addr) {
            Some(pos) if pos > 0 && addr.as_bytes()[pos - 1] == b']' => split(addr, pos),
            _ => (addr, None),
        };
    }
    let mut colons = 0;
    for b in addr.bytes() {
        match b {
            b'.' => break,
            b':' => {
                colons += 1;
                if colons == 2 {
                    return (addr, None);
                }
            }
            _ => {}
        }
    }
    match last_colon(addr) {
        Some(pos) => split(addr, pos),
        None => (addr, None),
    }
}
