//! `core.utils.resolve_var`: `$var`, `${var}` and `${var ?? default}` in a string, replaced by
//! request variables; parsed once at compile time.

use ferrisix_router::VarSource;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Var {
        name: String,
        default: Option<String>,
    },
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

/// A resolved template: the text and how many variables had a value (APISIX's `n_resolved`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub text: String,
    pub resolved: usize,
}

impl Template {
    /// Parses APISIX's pattern `(?<!\\)\$(\{\s*([^}]+?)\s*\}|([\w\.]+))`: a `$` not preceded by a
    /// backslash, then a braced name (with optional `?? default`) or a run of word characters
    /// and dots. Anything else is literal, the backslash included.
    pub fn parse(text: &str) -> Template {
        let bytes = text.as_bytes();
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'$' && (i == 0 || bytes[i - 1] != b'\\') {
                if bytes.get(i + 1) == Some(&b'{') {
                    if let Some(close) = text[i + 2..].find('}') {
                        let inner = text[i + 2..i + 2 + close].trim();
                        if !inner.is_empty() {
                            flush(&mut literal, &mut segments);
                            let (name, default) = match inner.split_once("??") {
                                Some((n, d)) => (n.trim(), Some(d.trim().to_owned())),
                                None => (inner, None),
                            };
                            segments.push(Segment::Var {
                                name: name.to_owned(),
                                default,
                            });
                            i += 3 + close;
                            continue;
                        }
                    }
                } else {
                    let len = bytes[i + 1..]
                        .iter()
                        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b == b'.')
                        .count();
                    if len > 0 {
                        flush(&mut literal, &mut segments);
                        segments.push(Segment::Var {
                            name: text[i + 1..i + 1 + len].to_owned(),
                            default: None,
                        });
                        i += 1 + len;
                        continue;
                    }
                }
            }
            // Copy one UTF-8 character.
            let ch = text[i..].chars().next().unwrap_or('\u{fffd}');
            literal.push(ch);
            i += ch.len_utf8().max(1);
        }
        flush(&mut literal, &mut segments);
        Template { segments }
    }

    /// Whether the template has any variable at all.
    pub fn has_vars(&self) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::Var { .. }))
    }

    /// The names of the variables it reads, in order (to capture them for the log phase).
    pub fn var_names(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Var { name, .. } => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The text when there are no variables.
    pub fn literal(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [] => Some(""),
            [Segment::Literal(s)] => Some(s),
            _ => None,
        }
    }

    pub fn resolve(&self, vars: &dyn VarSource) -> Resolved {
        let mut text = String::new();
        let mut resolved = 0;
        for seg in &self.segments {
            match seg {
                Segment::Literal(s) => text.push_str(s),
                Segment::Var { name, default } => match vars.var(name) {
                    Some(v) => {
                        resolved += 1;
                        text.push_str(&v);
                    }
                    None => {
                        if let Some(d) = default {
                            resolved += 1;
                            text.push_str(d);
                        }
                    }
                },
            }
        }
        Resolved { text, resolved }
    }
}

fn flush(literal: &mut String, segments: &mut Vec<Segment>) {
    if !literal.is_empty() {
        segments.push(Segment::Literal(std::mem::take(literal)));
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    struct Vars;
    impl VarSource for Vars {
        fn var(&self, name: &str) -> Option<Cow<'_, str>> {
            match name {
                "remote_addr" => Some(Cow::Borrowed("1.2.3.4")),
                "http_x_user" => Some(Cow::Borrowed("alice")),
                _ => None,
            }
        }
    }

    #[test]
    fn forms() {
        let t = Template::parse("$remote_addr $http_x_user");
        assert_eq!(
            t.resolve(&Vars),
            Resolved {
                text: "1.2.3.4 alice".into(),
                resolved: 2
            }
        );
        let t = Template::parse("${ remote_addr }-${nope ?? dflt}-$nope");
        assert_eq!(
            t.resolve(&Vars),
            Resolved {
                text: "1.2.3.4-dflt-".into(),
                resolved: 2
            }
        );
        let t = Template::parse("\\$remote_addr $");
        assert_eq!(
            t.resolve(&Vars),
            Resolved {
                text: "\\$remote_addr $".into(),
                resolved: 0
            }
        );
        assert_eq!(Template::parse("plain").literal(), Some("plain"));
        assert!(!Template::parse("plain").has_vars());
        assert_eq!(Template::parse("$nope").resolve(&Vars).resolved, 0);
    }
}
