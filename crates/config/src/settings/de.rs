//! Deserializers for the loosely typed values of `config.yaml`: listen addresses, nginx time
//! and size strings, `on`/`off` switches, IP/CIDR lists.
//!
//! APISIX hands most of these straight to nginx, which accepts several spellings; ferrisix has
//! to understand them itself. Each visitor's `expecting` text is what a user sees after the
//! key's path when a value is refused, so it lists the accepted forms.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

use super::values::{ExtraLabel, ListenAddr, RealIpFrom, WorkerProcesses};

/// APISIX's port for a `node_listen` map entry without `port`.
const DEFAULT_NODE_PORT: u16 = 9080;

/// Parses an IP address, also in the bracketed form (`[::1]`) nginx `listen` lines use.
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let s = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    IpAddr::from_str(s).ok()
}

/// Parses `a.b.c.d`, `a.b.c.d/n` or the IPv6 forms; a bare address is a host network.
pub(crate) fn parse_ipnet(s: &str) -> Option<IpNet> {
    IpNet::from_str(s.trim())
        .ok()
        .or_else(|| parse_ip(s).map(IpNet::from))
}

fn port_from_u64<E: de::Error>(v: u64, exp: &dyn de::Expected) -> Result<u16, E> {
    match u16::try_from(v) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(E::invalid_value(Unexpected::Unsigned(v), exp)),
    }
}

fn port_from_i64<E: de::Error>(v: i64, exp: &dyn de::Expected) -> Result<u16, E> {
    match u64::try_from(v) {
        Ok(u) => port_from_u64(u, exp),
        Err(_) => Err(E::invalid_value(Unexpected::Signed(v), exp)),
    }
}

/// Parses `"ip:port"`, `"[v6]:port"`, `"*:port"` or `"port"`.
fn parse_listen_str(s: &str) -> Option<(IpAddr, u16)> {
    let s = s.trim();
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0);
    if let Some(p) = port(s) {
        return Some((IpAddr::from([0, 0, 0, 0]), p));
    }
    let (host, p) = s.rsplit_once(':')?;
    let ip = if host == "*" {
        IpAddr::from([0, 0, 0, 0])
    } else {
        parse_ip(host)?
    };
    // A bare IPv6 address without brackets (`::1:9080`) is ambiguous; nginx wants brackets too.
    if matches!(ip, IpAddr::V6(_)) && !host.starts_with('[') {
        return None;
    }
    Some((ip, port(p)?))
}

/// A `node_listen` map entry. `enable_http2` stays optional so the caller can tell an explicit
/// value from the `apisix.enable_http2` default.
#[derive(Deserialize)]
struct ListenMap {
    #[serde(default, deserialize_with = "opt_ip")]
    ip: Option<IpAddr>,
    #[serde(default, deserialize_with = "opt_port")]
    port: Option<u16>,
    #[serde(default)]
    enable_http2: Option<bool>,
    #[serde(default)]
    enable_http3: Option<bool>,
}

struct ListenEntry(ListenAddr);

const LISTEN_ENTRY: &str =
    "a port number (1-65535), an \"ip:port\" string or a map {ip, port, enable_http2, enable_http3}";

impl<'de> Deserialize<'de> for ListenEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ListenEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(LISTEN_ENTRY)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ListenEntry, E> {
                Ok(ListenEntry(ListenAddr::port(port_from_u64(v, &self)?)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ListenEntry, E> {
                Ok(ListenEntry(ListenAddr::port(port_from_i64(v, &self)?)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ListenEntry, E> {
                let (ip, port) = parse_listen_str(v)
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))?;
                Ok(ListenEntry(ListenAddr {
                    ip,
                    port,
                    enable_http2: true,
                    enable_http3: false,
                    any_address: false,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ListenEntry, A::Error> {
                let m = ListenMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ListenEntry(ListenAddr {
                    ip: m.ip.unwrap_or(IpAddr::from([0, 0, 0, 0])),
                    port: m.port.unwrap_or(DEFAULT_NODE_PORT),
                    enable_http2: m.enable_http2.unwrap_or(true),
                    enable_http3: m.enable_http3.unwrap_or(false),
                    any_address: m.ip.is_none(),
                }))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string or a list of strings (APISIX accepts `keyring: key` for `keyring: [key]`).
pub(crate) fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// `apisix.node_listen`: one port, or a list of ports / `"ip:port"` / maps.
pub(crate) fn node_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ListenAddr>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<ListenAddr>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a port number or a list of entries, each {LISTEN_ENTRY}")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(vec![ListenAddr::port(port_from_u64(v, &self)?)])
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(vec![ListenAddr::port(port_from_i64(v, &self)?)])
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            ListenEntry::deserialize(de::value::StrDeserializer::<E>::new(v)).map(|e| vec![e.0])
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(ListenEntry(addr)) = seq.next_element()? {
                out.push(addr);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// A TCP port, 1-65535 (APISIX's schema minimum/maximum).
pub(crate) fn port<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = u16;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a port number (1-65535)")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u16, E> {
            port_from_u64(v, &self)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u16, E> {
            port_from_i64(v, &self)
        }
    }
    d.deserialize_any(V)
}

fn opt_port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    port(d).map(Some)
}

/// An IP address; `[v6]` brackets allowed.
pub(crate) fn ip<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = IpAddr;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an IP address")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<IpAddr, E> {
            parse_ip(v).ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(V)
}

fn opt_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    ip(d).map(Some)
}

/// nginx time: a number of seconds, or `"240s"`, `"1m30s"`, `"500ms"` (units ms s m h d w M y,
/// no unit = seconds).
pub(crate) fn parse_nginx_time(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total_ms: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u128 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len): (u128, usize) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.chars().next() {
                None => (1000, 0),
                Some('s') => (1000, 1),
                Some('m') => (60_000, 1),
                Some('h') => (3_600_000, 1),
                Some('d') => (86_400_000, 1),
                Some('w') => (604_800_000, 1),
                Some('M') => (2_592_000_000, 1),
                Some('y') => (31_536_000_000, 1),
                Some(_) => return None,
            }
        };
        total_ms = total_ms.checked_add(n.checked_mul(unit_ms)?)?;
        rest = &rest[len..];
    }
    Some(Duration::from_millis(u64::try_from(total_ms).ok()?))
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of seconds or an nginx time like \"60s\", \"1m30s\", \"500ms\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            Duration::try_from_secs_f64(v)
                .map_err(|_| E::invalid_value(Unexpected::Float(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse_nginx_time(v).ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(V)
}

/// nginx size: bytes, or `"8k"`, `"1m"`, `"1g"` (case-insensitive).
pub(crate) fn parse_nginx_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

pub(crate) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of bytes or an nginx size like \"8k\", \"1m\", \"1g\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_nginx_size(v).ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(V)
}

pub(crate) fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}

/// nginx `on`/`off`, or a YAML boolean.
pub(crate) fn on_off<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("\"on\", \"off\" or a boolean")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v.trim().to_ascii_lowercase().as_str() {
                "on" | "true" => Ok(true),
                "off" | "false" => Ok(false),
                _ => Err(E::invalid_value(Unexpected::Str(v), &self)),
            }
        }
    }
    d.deserialize_any(V)
}

/// A string that may have been written (or substituted from the environment) as a number: an
/// admin key `12345` is still the key "12345".
pub(crate) fn stringish<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V)
}

pub(crate) fn opt_stringish<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Wrap(String);
    impl<'de> Deserialize<'de> for Wrap {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            stringish(d).map(Wrap)
        }
    }
    Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
}

/// `metrics.<name>.expire`: seconds, 0 or more (nginx's shared dict refuses a negative
/// expiry); fractions allowed (the dict keeps milliseconds); `~` is 0, as APISIX reads an
/// absent value.
pub(crate) fn expire<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of seconds, 0 or more (0 = never)")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            if v < 0 {
                return Err(E::invalid_value(Unexpected::Signed(v), &self));
            }
            Ok(v as f64)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(E::invalid_value(Unexpected::Float(v), &self));
            }
            Ok(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }
        fn visit_none<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }
    }
    d.deserialize_any(V)
}

/// Any YAML value, kept only as far as an error message needs it. Reading a value this way
/// never fails, so a bad `extra_labels` entry is reported once, at the entry's own path.
enum Raw {
    Str(String),
    Bool(bool),
    Signed(i64),
    Unsigned(u64),
    Float(f64),
    Unit,
    Seq,
    Map,
}

impl Raw {
    fn unexpected(&self) -> Unexpected<'_> {
        match self {
            Raw::Str(s) => Unexpected::Str(s),
            Raw::Bool(b) => Unexpected::Bool(*b),
            Raw::Signed(i) => Unexpected::Signed(*i),
            Raw::Unsigned(u) => Unexpected::Unsigned(*u),
            Raw::Float(f) => Unexpected::Float(*f),
            Raw::Unit => Unexpected::Unit,
            Raw::Seq => Unexpected::Seq,
            Raw::Map => Unexpected::Map,
        }
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Raw;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
                Ok(Raw::Str(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
                Ok(Raw::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
                Ok(Raw::Signed(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
                Ok(Raw::Unsigned(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
                Ok(Raw::Float(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
                Ok(Raw::Unit)
            }
            fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
                Ok(Raw::Unit)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
                while seq.next_element::<Raw>()?.is_some() {}
                Ok(Raw::Seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
                // Keys as `Raw` too: serde_ignored's key capture refuses `IgnoredAny`.
                while map.next_entry::<Raw, Raw>()?.is_some() {}
                Ok(Raw::Map)
            }
        }
        d.deserialize_any(V)
    }
}

/// One `extra_labels` entry: a map with exactly one `label: $variable` pair (APISIX takes
/// `next()` of the map, so a second pair would be an arbitrary pick; ferrisix refuses it).
impl<'de> Deserialize<'de> for ExtraLabel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a string naming an nginx variable, like \"$upstream_addr\"";
        impl<'de> Visitor<'de> for V {
            type Value = ExtraLabel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a single `label: $variable` entry, like {upstream_addr: $upstream_addr}",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExtraLabel, A::Error> {
                let Some((key, value)) = map.next_entry::<Raw, Raw>()? else {
                    return Err(de::Error::invalid_length(0, &self));
                };
                let mut len = 1;
                while map.next_entry::<Raw, Raw>()?.is_some() {
                    len += 1;
                }
                if len > 1 {
                    return Err(de::Error::invalid_length(len, &self));
                }
                let name = match key {
                    Raw::Str(s) => s,
                    Raw::Signed(i) => i.to_string(),
                    Raw::Unsigned(u) => u.to_string(),
                    other => {
                        return Err(de::Error::invalid_type(other.unexpected(), &"a label name"))
                    }
                };
                match value {
                    Raw::Str(value) => Ok(ExtraLabel { name, value }),
                    other => Err(de::Error::invalid_type(other.unexpected(), &EXPECTED)),
                }
            }
        }
        d.deserialize_map(V)
    }
}

/// One IP or CIDR string.
struct Net(IpNet);

impl<'de> Deserialize<'de> for Net {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Net;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP address or CIDR")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Net, E> {
                parse_ipnet(v)
                    .map(Net)
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// `allow_admin`: `~` (allow everyone) is kept apart from `[]` (allow no one).
pub(crate) fn opt_ipnets<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<IpNet>>, D::Error> {
    Ok(Option::<Vec<Net>>::deserialize(d)?.map(|v| v.into_iter().map(|n| n.0).collect()))
}

impl<'de> Deserialize<'de> for RealIpFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry(Option<IpNet>);
        impl<'de> Deserialize<'de> for Entry {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = Entry;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("an IP address, a CIDR or \"unix:\"")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<Entry, E> {
                        if v.trim() == "unix:" {
                            return Ok(Entry(None));
                        }
                        parse_ipnet(v)
                            .map(|n| Entry(Some(n)))
                            .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
                    }
                }
                d.deserialize_any(V)
            }
        }

        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RealIpFrom;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of IP addresses, CIDRs or \"unix:\"")
            }
            fn visit_unit<E: de::Error>(self) -> Result<RealIpFrom, E> {
                Ok(RealIpFrom::default_empty())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RealIpFrom, E> {
                let mut out = RealIpFrom::default_empty();
                out.push(Entry::deserialize(de::value::StrDeserializer::<E>::new(v))?.0);
                Ok(out)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RealIpFrom, A::Error> {
                let mut out = RealIpFrom::default_empty();
                while let Some(Entry(e)) = seq.next_element()? {
                    out.push(e);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

impl RealIpFrom {
    fn default_empty() -> RealIpFrom {
        RealIpFrom {
            nets: Vec::new(),
            unix: false,
        }
    }

    fn push(&mut self, entry: Option<IpNet>) {
        match entry {
            Some(n) => self.nets.push(n),
            None => self.unix = true,
        }
    }
}

impl<'de> Deserialize<'de> for WorkerProcesses {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WorkerProcesses;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\" or a number of workers (at least 1)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WorkerProcesses, E> {
                match usize::try_from(v) {
                    Ok(n) if n > 0 => Ok(WorkerProcesses::Count(n)),
                    _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WorkerProcesses, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WorkerProcesses, E> {
                let t = v.trim();
                if t == "auto" {
                    return Ok(WorkerProcesses::Auto);
                }
                match t.parse::<u64>() {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `apisix.stream_proxy.tcp` / `.udp`: a list of ports, `"ip:port"` (or `"ip:from-to"`)
/// strings, or `{addr, tls}` maps whose `addr` is one of those.
pub(crate) fn stream_listen<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<crate::settings::StreamListen>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    stream_listen_value(&value).map_err(de::Error::custom)
}

fn stream_listen_value(
    value: &serde_json::Value,
) -> Result<Vec<crate::settings::StreamListen>, String> {
    use serde_json::Value;
    let entries = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut out = Vec::new();
    for entry in &entries {
        let flag = |map: &serde_json::Map<String, Value>, key: &str| match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(format!(
                "stream_proxy: `{key}` must be a boolean, found {other}"
            )),
        };
        let (addr, tls, pp, pp_up) = match entry {
            Value::Object(map) => {
                let tls = flag(map, "tls")?.unwrap_or(false);
                let pp = flag(map, "proxy_protocol")?;
                let pp_up = flag(map, "proxy_protocol_to_upstream")?;
                let addr = map
                    .get("addr")
                    .ok_or_else(|| "stream_proxy: an entry map needs `addr`".to_string())?;
                (addr.clone(), tls, pp, pp_up)
            }
            other => (other.clone(), false, None, None),
        };
        let text = match &addr {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => return Err(format!("stream_proxy: bad listen address {other}")),
        };
        let (ip, ports) = match text.rsplit_once(':') {
            Some((ip, ports)) => {
                let ip = ip.trim_start_matches('[').trim_end_matches(']');
                let ip: IpAddr = ip
                    .parse()
                    .map_err(|_| format!("stream_proxy: bad address `{text}`"))?;
                (ip, ports)
            }
            None => (IpAddr::from([0, 0, 0, 0]), text.as_str()),
        };
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("stream_proxy: bad port in `{text}`"))
        };
        let (from, to) = match ports.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(ports)?;
                (p, p)
            }
        };
        if from > to {
            return Err(format!("stream_proxy: empty port range `{text}`"));
        }
        for port in from..=to {
            out.push(crate::settings::StreamListen {
                ip,
                port,
                tls,
                proxy_protocol: pp,
                proxy_protocol_to_upstream: pp_up,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_times() {
        assert_eq!(parse_nginx_time("240s"), Some(Duration::from_secs(240)));
        assert_eq!(parse_nginx_time("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_nginx_time("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_nginx_time("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_nginx_time("15"), Some(Duration::from_secs(15)));
        assert_eq!(parse_nginx_time("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_nginx_time("s"), None);
        assert_eq!(parse_nginx_time("10x"), None);
        assert_eq!(parse_nginx_time(""), None);
    }

    #[test]
    fn nginx_sizes() {
        assert_eq!(parse_nginx_size("0"), Some(0));
        assert_eq!(parse_nginx_size("8k"), Some(8192));
        assert_eq!(parse_nginx_size("1M"), Some(1 << 20));
        assert_eq!(parse_nginx_size("2g"), Some(2 << 30));
        assert_eq!(parse_nginx_size("m"), None);
        assert_eq!(parse_nginx_size("1t"), None);
    }

    #[test]
    fn listen_strings() {
        assert_eq!(
            parse_listen_str("127.0.0.1:9081"),
            Some((IpAddr::from([127, 0, 0, 1]), 9081))
        );
        assert_eq!(
            parse_listen_str("[::1]:9082"),
            Some(("::1".parse().unwrap(), 9082))
        );
        assert_eq!(
            parse_listen_str("*:80"),
            Some((IpAddr::from([0, 0, 0, 0]), 80))
        );
        assert_eq!(
            parse_listen_str("9083"),
            Some((IpAddr::from([0, 0, 0, 0]), 9083))
        );
        assert_eq!(parse_listen_str("::1:9082"), None);
        assert_eq!(parse_listen_str("127.0.0.1:0"), None);
        assert_eq!(parse_listen_str("x"), None);
    }

    #[test]
    fn ip_forms() {
        assert_eq!(
            parse_ipnet("127.0.0.0/24"),
            Some("127.0.0.0/24".parse().unwrap())
        );
        assert_eq!(
            parse_ipnet("10.0.0.1"),
            Some("10.0.0.1/32".parse().unwrap())
        );
        assert_eq!(parse_ipnet("::1"), Some("::1/128".parse().unwrap()));
        assert_eq!(parse_ipnet("[::1]"), Some("::1/128".parse().unwrap()));
        assert_eq!(parse_ipnet("localhost"), None);
    }
}
