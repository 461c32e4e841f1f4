//! JSONPath location as the Lua `jsonpath` library's `nodes()` gives it, for plugins that edit
//! the fields a path names (data-mask): the root `$`, child names (`.name`, `['name']`),
//! wildcards (`.*`, `[*]`), indexes and index lists (`[0]`, `[-1]`, `[0,2]`), slices
//! (`[1:3]`) and recursive descent (`..name`, `..*`). Filter expressions (`[?(...)]`) are
//! refused when the path is compiled.

use serde_json::Value;

/// One step of a located node's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

#[derive(Clone, Debug, PartialEq)]
enum Sel {
    Name(String),
    Wild,
    Indexes(Vec<i64>),
    Slice(Option<i64>, Option<i64>),
}

#[derive(Clone, Debug, PartialEq)]
struct Step {
    descend: bool,
    sel: Sel,
}

/// A compiled path.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    pub fn parse(text: &str) -> Result<JsonPath, String> {
        let bad = || format!("invalid JSONPath \"{text}\"");
        let s = text.trim();
        let mut rest = s.strip_prefix('$').ok_or_else(bad)?;
        let mut steps = Vec::new();
        while !rest.is_empty() {
            let descend = rest.starts_with("..");
            if descend {
                rest = &rest[2..];
            } else if let Some(r) = rest.strip_prefix('.') {
                rest = r;
            }
            if let Some(r) = rest.strip_prefix('[') {
                let end = r.find(']').ok_or_else(bad)?;
                let inner = r[..end].trim();
                rest = &r[end + 1..];
                steps.push(Step {
                    descend,
                    sel: subscript(inner).ok_or_else(bad)?,
                });
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                let name = &rest[..end];
                if name.is_empty() {
                    return Err(bad());
                }
                rest = &rest[end..];
                let sel = if name == "*" {
                    Sel::Wild
                } else {
                    Sel::Name(name.to_owned())
                };
                steps.push(Step { descend, sel });
            }
        }
        Ok(JsonPath(steps))
    }

    /// The paths of the nodes the path names in `root`, in document order.
    pub fn locate(&self, root: &Value) -> Vec<Vec<Seg>> {
        let mut current = vec![(Vec::new(), root)];
        for step in &self.0 {
            let mut next = Vec::new();
            for (path, v) in current {
                if step.descend {
                    descend(&path, v, &step.sel, &mut next);
                } else {
                    select(&path, v, &step.sel, &mut next);
                }
            }
            current = next;
        }
        current.into_iter().map(|(p, _)| p).collect()
    }
}

fn subscript(inner: &str) -> Option<Sel> {
    if inner == "*" {
        return Some(Sel::Wild);
    }
    if let Some(q) = inner
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
    {
        return Some(Sel::Name(q.to_owned()));
    }
    if let Some((a, b)) = inner.split_once(':') {
        let n = |t: &str| -> Option<Option<i64>> {
            let t = t.trim();
            if t.is_empty() {
                Some(None)
            } else {
                t.parse().ok().map(Some)
            }
        };
        return Some(Sel::Slice(n(a)?, n(b)?));
    }
    inner
        .split(',')
        .map(|t| t.trim().parse().ok())
        .collect::<Option<Vec<i64>>>()
        .map(Sel::Indexes)
}

fn index_of(i: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if i < 0 { len + i } else { i };
    (0..len).contains(&i).then(|| usize::try_from(i).ok())?
}

fn select<'v>(path: &[Seg], v: &'v Value, sel: &Sel, out: &mut Vec<(Vec<Seg>, &'v Value)>) {
    let mut push = |seg: Seg, child: &'v Value| {
        let mut p = path.to_vec();
        p.push(seg);
        out.push((p, child));
    };
    match (sel, v) {
        (Sel::Name(n), Value::Object(m)) => {
            if let Some(c) = m.get(n) {
                push(Seg::Key(n.clone()), c);
            }
        }
        (Sel::Wild, Value::Object(m)) => {
            for (k, c) in m {
                push(Seg::Key(k.clone()), c);
            }
        }
        (Sel::Wild, Value::Array(a)) => {
            for (i, c) in a.iter().enumerate() {
                push(Seg::Index(i), c);
            }
        }
        (Sel::Indexes(list), Value::Array(a)) => {
            for &i in list {
                if let Some(i) = index_of(i, a.len()) {
                    push(Seg::Index(i), &a[i]);
                }
            }
        }
        (Sel::Slice(from, to), Value::Array(a)) => {
            let len = i64::try_from(a.len()).unwrap_or(i64::MAX);
            let clamp = |x: i64| if x < 0 { (len + x).max(0) } else { x.min(len) };
            let start = from.map_or(0, clamp);
            let end = to.map_or(len, clamp);
            for i in start..end {
                let i = usize::try_from(i).unwrap_or(0);
                push(Seg::Index(i), &a[i]);
            }
        }
        _ => {}
    }
}

fn descend<'v>(path: &[Seg], v: &'v Value, sel: &Sel, out: &mut Vec<(Vec<Seg>, &'v Value)>) {
    select(path, v, sel, out);
    let children: Vec<(Seg, &Value)> = match v {
        Value::Object(m) => m.iter().map(|(k, c)| (Seg::Key(k.clone()), c)).collect(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (Seg::Index(i), c))
            .collect(),
        _ => return,
    };
    for (seg, c) in children {
        let mut p = path.to_vec();
        p.push(seg);
        descend(&p, c, sel, out);
    }
}

/// The value at `path` in `root`.
pub fn get_mut<'v>(root: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    path.iter().try_fold(root, |v, seg| match (seg, v) {
        (Seg::Key(k), Value::Object(m)) => m.get_mut(k),
        (Seg::Index(i), Value::Array(a)) => a.get_mut(*i),
        _ => None,
    })
}

/// Removes the node at `path` (a list item is taken out, the later ones move up).
pub fn remove(root: &mut Value, path: &[Seg]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match (get_mut(root, parent), last) {
        (Some(Value::Object(m)), Seg::Key(k)) => {
            m.shift_remove(k);
        }
        (Some(Value::Array(a)), Seg::Index(i)) if *i < a.len() => {
            a.remove(*i);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn locates_and_edits() {
        let doc = json!({"a": 1, "users": [{"card": "x"}, {"card": "y", "in": {"card": "z"}}]});
        let p = JsonPath::parse("$.users[*].card").unwrap();
        assert_eq!(p.locate(&doc).len(), 2);
        assert_eq!(JsonPath::parse("$..card").unwrap().locate(&doc).len(), 3);
        assert_eq!(
            JsonPath::parse("$.users[-1]['card']").unwrap().locate(&doc),
            vec![vec![
                Seg::Key("users".into()),
                Seg::Index(1),
                Seg::Key("card".into())
            ]]
        );
        let mut d = doc.clone();
        for path in JsonPath::parse("$.users[0:2]")
            .unwrap()
            .locate(&doc)
            .iter()
            .rev()
        {
            remove(&mut d, path);
        }
        assert_eq!(d, json!({"a": 1, "users": []}));
        assert!(JsonPath::parse("users").is_err());
        assert!(JsonPath::parse("$.a[?(@.b)]").is_err());
    }
}
