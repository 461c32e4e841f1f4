//! HTTP methods as lua-resty-radixtree sees them.
//!
//! The radix tree knows exactly ten methods and compares them as a bitmask, so `HEAD` is not
//! `GET`, names are case-sensitive, and a request method outside the ten can only reach routes
//! that do not restrict methods. `MethodSet::ALL` is therefore a distinct value ("no `methods`
//! field") rather than "the ten bits set": a route that lists all ten methods still refuses an
//! unknown method, as APISIX does.

use std::fmt;

/// One of the ten methods APISIX's router understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
    Patch,
    Head,
    Options,
    Connect,
    Trace,
    Purge,
}

impl Method {
    /// Every method in the bit order lua-resty-radixtree uses.
    pub const LIST: [Method; 10] = [
        Method::Get,
        Method::Post,
        Method::Put,
        Method::Delete,
        Method::Patch,
        Method::Head,
        Method::Options,
        Method::Connect,
        Method::Trace,
        Method::Purge,
    ];

    /// Parses a request method. Only the exact upper-case names are accepted because APISIX
    /// looks the method up in a case-sensitive table (`get` is an unknown method there).
    pub fn from_bytes(b: &[u8]) -> Option<Method> {
        Some(match b {
            b"GET" => Method::Get,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"PATCH" => Method::Patch,
            b"HEAD" => Method::Head,
            b"OPTIONS" => Method::Options,
            b"CONNECT" => Method::Connect,
            b"TRACE" => Method::Trace,
            b"PURGE" => Method::Purge,
            _ => return None,
        })
    }

    /// Convenience for callers holding an `http::Method` (extension methods map to `None`).
    pub fn from_http(m: &http::Method) -> Option<Method> {
        Method::from_bytes(m.as_str().as_bytes())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
            Method::Head => "HEAD",
            Method::Options => "OPTIONS",
            Method::Connect => "CONNECT",
            Method::Trace => "TRACE",
            Method::Purge => "PURGE",
        }
    }

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of methods stored as a bitmask, with `ALL` meaning "the route lists no methods".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MethodSet(u16);

impl MethodSet {
    /// No method filter. Every bit is set so that `contains(Some(_))` is a single AND; the bits
    /// above the ten methods make it differ from a set that lists all ten.
    pub const ALL: MethodSet = MethodSet(u16::MAX);

    pub fn empty() -> MethodSet {
        MethodSet(0)
    }

    /// Adds a method. Inserting into `ALL` keeps `ALL`: there is nothing wider.
    pub fn insert(&mut self, m: Method) {
        if *self != MethodSet::ALL {
            self.0 |= m.bit();
        }
    }

    /// `None` (an unknown request method) never matches a set that is not ALL.
    pub fn contains(self, m: Option<Method>) -> bool {
        match m {
            Some(m) => self.0 & m.bit() != 0,
            None => self == MethodSet::ALL,
        }
    }

    pub fn is_all(self) -> bool {
        self == MethodSet::ALL
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Builds the set for a route's `methods` array. An empty array yields `ALL`: the radix tree
    /// treats a zero bitmask as "no filter", so `methods: []` matches every method in APISIX.
    pub fn from_names<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Result<MethodSet, String> {
        let mut set = MethodSet::empty();
        for name in names {
            match Method::from_bytes(name.as_bytes()) {
                Some(m) => set.insert(m),
                None => return Err(format!("invalid method: {name:?}")),
            }
        }
        if set.is_empty() {
            return Ok(MethodSet::ALL);
        }
        Ok(set)
    }

    /// The listed methods in radixtree bit order (empty for `ALL`, which lists none).
    pub fn iter(self) -> impl Iterator<Item = Method> {
        let listed = !self.is_all();
        Method::LIST
            .into_iter()
            .filter(move |m| listed && self.0 & m.bit() != 0)
    }
}

impl Default for MethodSet {
    fn default() -> Self {
        MethodSet::ALL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_bytes_is_exact_and_case_sensitive() {
        for m in Method::LIST {
            assert_eq!(Method::from_bytes(m.as_str().as_bytes()), Some(m));
        }
        assert_eq!(Method::from_bytes(b"get"), None);
        assert_eq!(Method::from_bytes(b"Get"), None);
        assert_eq!(Method::from_bytes(b"MKCOL"), None);
        assert_eq!(Method::from_bytes(b""), None);
        assert_eq!(Method::from_http(&http::Method::PATCH), Some(Method::Patch));
        assert_eq!(
            Method::from_http(&http::Method::from_bytes(b"PROPFIND").unwrap()),
            None
        );
    }

    #[test]
    fn bitmask_semantics() {
        let set = MethodSet::from_names(["GET", "POST"]).unwrap();
        assert!(set.contains(Some(Method::Get)));
        assert!(set.contains(Some(Method::Post)));
        // HEAD is not GET for the radix tree.
        assert!(!set.contains(Some(Method::Head)));
        assert!(!set.contains(None));
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            vec![Method::Get, Method::Post]
        );
    }

    #[test]
    fn all_differs_from_all_ten_listed() {
        let ten = MethodSet::from_names(Method::LIST.iter().map(|m| m.as_str())).unwrap();
        assert_ne!(ten, MethodSet::ALL);
        for m in Method::LIST {
            assert!(ten.contains(Some(m)));
            assert!(MethodSet::ALL.contains(Some(m)));
        }
        assert!(!ten.contains(None));
        assert!(MethodSet::ALL.contains(None));
        let mut all = MethodSet::ALL;
        all.insert(Method::Get);
        assert!(all.is_all());
        assert_eq!(MethodSet::ALL.iter().count(), 0);
    }

    #[test]
    fn from_names_errors_and_empty() {
        assert!(MethodSet::from_names(["get"]).is_err());
        assert!(MethodSet::from_names(["GET", "FOO"])
            .unwrap_err()
            .contains("FOO"));
        assert_eq!(MethodSet::from_names([]), Ok(MethodSet::ALL));
        let mut s = MethodSet::empty();
        assert!(s.is_empty());
        assert!(!s.contains(Some(Method::Get)));
        s.insert(Method::Purge);
        assert!(s.contains(Some(Method::Purge)));
        assert_eq!(MethodSet::default(), MethodSet::ALL);
    }
}
