//! Query arguments as OpenResty hands them to APISIX.
//!
//! `ngx.req.get_uri_args()` gives a Lua table where a bare `?x` is `true`, `?x=` is `""`, and a
//! repeated name is a list; APISIX's checks (`tonumber(args.ttl)`, `args.force ~= "true"`) behave
//! differently on each, so the three shapes are kept apart. Names and values are unescaped
//! (`%XX`, and `+` as a space). nginx's `$arg_api_key`, used for the admin key, is different:
//! the first `api_key=` (name compared case-insensitively) and its value as sent.

use std::borrow::Cow;

/// One argument's Lua value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// `?name` without `=`.
    Flag,
    Str(String),
    /// The name appeared more than once.
    Many(Vec<Arg>),
}

impl Arg {
    /// The value when it is a single string (what most checks need).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Arg::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// `ngx.req.get_uri_args()` (its default limit of 100 arguments included).
#[derive(Clone, Debug, Default)]
pub struct Args {
    entries: Vec<(String, Arg)>,
}

const MAX_ARGS: usize = 100;

impl Args {
    pub fn parse(query: Option<&str>) -> Args {
        let mut args = Args::default();
        let Some(query) = query else { return args };
        for part in query.split('&').filter(|p| !p.is_empty()).take(MAX_ARGS) {
            let (name, value) = match part.split_once('=') {
                Some((n, v)) => (unescape(n), Arg::Str(unescape(v))),
                None => (unescape(part), Arg::Flag),
            };
            if name.is_empty() {
                continue;
            }
            match args.entries.iter_mut().find(|(n, _)| *n == name) {
                Some((_, Arg::Many(list))) => list.push(value),
                Some((_, existing)) => {
                    let first = std::mem::replace(existing, Arg::Flag);
                    *existing = Arg::Many(vec![first, value]);
                }
                None => args.entries.push((name, value)),
            }
        }
        args
    }

    pub fn get(&self, name: &str) -> Option<&Arg> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The value of `name` when it is a single string.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(Arg::as_str)
    }
}

/// `ngx.unescape_uri` for arguments: `%XX` decoded, `+` read as a space.
pub fn unescape(s: &str) -> String {
    let spaced: Cow<'_, str> = if s.contains('+') {
        Cow::Owned(s.replace('+', " "))
    } else {
        Cow::Borrowed(s)
    };
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// nginx's `$arg_<name>`: the raw value of the first `name=` in the query, the name compared
/// case-insensitively; absent when no argument of that name has an `=`.
pub fn nginx_arg<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|part| {
        let (n, v) = part.split_once('=')?;
        n.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// `ngx.decode_args` for the `filter=` argument (at most `max` arguments).
pub fn decode_args(s: &str, max: usize) -> Args {
    let mut args = Args::parse(Some(s));
    args.entries.truncate(max);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lua_shapes() {
        let a = Args::parse(Some("ttl&force=true&page=1&page=2&e=&x=a%20b+c"));
        assert_eq!(a.get("ttl"), Some(&Arg::Flag));
        assert_eq!(a.str("force"), Some("true"));
        assert_eq!(
            a.get("page"),
            Some(&Arg::Many(vec![Arg::Str("1".into()), Arg::Str("2".into())]))
        );
        assert_eq!(a.str("e"), Some(""));
        assert_eq!(a.str("x"), Some("a b c"));
        assert_eq!(a.get("missing"), None);
    }

    #[test]
    fn nginx_arg_is_raw_and_case_insensitive() {
        assert_eq!(
            nginx_arg(Some("a=1&API_KEY=k%41&api_key=x"), "api_key"),
            Some("k%41")
        );
        assert_eq!(nginx_arg(Some("api_key"), "api_key"), None);
        assert_eq!(nginx_arg(Some("api_key="), "api_key"), Some(""));
        assert_eq!(nginx_arg(None, "api_key"), None);
    }
}
