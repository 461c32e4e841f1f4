//! A persistent byte radix tree answering two questions: the value stored under exactly this
//! key, and the values of the stored keys that are prefixes of this input, longest first.
//!
//! That is all lua-resty-radixtree asks of its tree (`raxFind`, and `raxSeek "<="` then
//! `raxUp`), both for URI prefixes and, on reversed strings, for wildcard-host suffixes.
//!
//! Nodes are shared (`Arc`) and changed by path copying: an update clones only the nodes from
//! the root to the key it changes (`Arc::make_mut`, so a tree nobody else holds is changed in
//! place, which is what a first build does), and every other subtree stays the same allocation
//! in both versions. A published table is therefore never written to, and the table that
//! replaces it costs what the change touched. A removal prunes the nodes it empties and merges a
//! valueless node with its only child again, so the tree after any sequence of changes has the
//! shape a fresh build of the same keys would have.

use std::ops::ControlFlow;
use std::sync::Arc;

/// Read access to a lookup key, forwards for paths and backwards for host suffixes.
pub(crate) trait TrieKey {
    fn len(&self) -> usize;
    fn at(&self, i: usize) -> u8;
    /// Whether `label` occurs at logical position `pos`.
    fn matches(&self, pos: usize, label: &[u8]) -> bool;
}

/// The key read front to back.
pub(crate) struct Fwd<'a>(pub(crate) &'a [u8]);

impl TrieKey for Fwd<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn at(&self, i: usize) -> u8 {
        self.0[i]
    }

    #[inline]
    fn matches(&self, pos: usize, label: &[u8]) -> bool {
        self.0[pos..].starts_with(label)
    }
}

/// The key read back to front (a host, for suffix lookups).
pub(crate) struct Rev<'a>(pub(crate) &'a [u8]);

impl TrieKey for Rev<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn at(&self, i: usize) -> u8 {
        self.0[self.0.len() - 1 - i]
    }

    #[inline]
    fn matches(&self, pos: usize, label: &[u8]) -> bool {
        let n = self.0.len();
        label.len() <= n - pos
            && label
                .iter()
                .enumerate()
                .all(|(j, &c)| self.0[n - 1 - pos - j] == c)
    }
}

#[derive(Clone, Debug)]
struct Node<V> {
    label: Box<[u8]>,
    /// First label byte of each child, sorted; `kids` is in the same order.
    first: Vec<u8>,
    kids: Vec<Arc<Node<V>>>,
    value: Option<V>,
}

impl<V> Node<V> {
    fn leaf(label: &[u8], value: V) -> Node<V> {
        Node {
            label: label.into(),
            first: Vec::new(),
            kids: Vec::new(),
            value: Some(value),
        }
    }

    #[inline]
    fn kid(&self, b: u8) -> Option<usize> {
        if self.first.len() <= 16 {
            self.first.iter().position(|&k| k == b)
        } else {
            self.first.binary_search(&b).ok()
        }
    }
}

/// The tree; cloning it is one reference count.
#[derive(Debug)]
pub(crate) struct Trie<V> {
    root: Arc<Node<V>>,
}

impl<V> Clone for Trie<V> {
    fn clone(&self) -> Self {
        Trie {
            root: self.root.clone(),
        }
    }
}

impl<V> Default for Trie<V> {
    fn default() -> Self {
        Trie {
            root: Arc::new(Node {
                label: Box::default(),
                first: Vec::new(),
                kids: Vec::new(),
                value: None,
            }),
        }
    }
}

impl<V: Clone> Trie<V> {
    pub(crate) fn is_empty(&self) -> bool {
        self.root.value.is_none() && self.root.kids.is_empty()
    }

    /// The value stored under exactly `key`.
    pub(crate) fn get<K: TrieKey>(&self, key: &K) -> Option<&V> {
        let len = key.len();
        let mut node = &*self.root;
        let mut pos = 0;
        while pos < len {
            let i = node.kid(key.at(pos))?;
            let child = &*node.kids[i];
            if !key.matches(pos, &child.label) {
                return None;
            }
            pos += child.label.len();
            node = child;
        }
        node.value.as_ref()
    }

    /// Calls `f` with the values of the stored keys that are prefixes of `key`, longest first,
    /// until it breaks. The walk recurses once per matching node, so it needs no buffer.
    #[inline]
    pub(crate) fn prefixes_of<'a, K: TrieKey, R>(
        &'a self,
        key: &K,
        f: &mut impl FnMut(&'a V) -> ControlFlow<R>,
    ) -> Option<R> {
        match visit(&self.root, key, 0, f) {
            ControlFlow::Break(r) => Some(r),
            ControlFlow::Continue(()) => None,
        }
    }

    /// Replaces the value under `key` with `f(current)`; `None` removes it. Only the nodes on
    /// the way to `key` are copied (or changed in place when this tree is their only holder).
    pub(crate) fn update(&mut self, key: &[u8], f: impl FnOnce(Option<V>) -> Option<V>) {
        update_at(&mut self.root, key, f);
    }

    /// Every stored value, in key order (for tests and checks, not the request path).
    #[cfg(test)]
    pub(crate) fn values(&self) -> Vec<&V> {
        fn walk<'a, V>(n: &'a Node<V>, out: &mut Vec<&'a V>) {
            out.extend(n.value.as_ref());
            for k in &n.kids {
                walk(k, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }

    /// Whether both are the same version.
    #[cfg(test)]
    pub(crate) fn same_as(&self, other: &Trie<V>) -> bool {
        Arc::ptr_eq(&self.root, &other.root)
    }

    /// Number of nodes (the root included).
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> usize {
        fn count<V>(n: &Node<V>) -> usize {
            1 + n.kids.iter().map(|k| count(k)).sum::<usize>()
        }
        count(&self.root)
    }
}

fn visit<'a, V, K: TrieKey, R>(
    node: &'a Node<V>,
    key: &K,
    pos: usize,
    f: &mut impl FnMut(&'a V) -> ControlFlow<R>,
) -> ControlFlow<R> {
    if pos < key.len() {
        if let Some(i) = node.kid(key.at(pos)) {
            let child = &*node.kids[i];
            if key.matches(pos, &child.label) {
                visit(child, key, pos + child.label.len(), f)?;
            }
        }
    }
    match &node.value {
        Some(v) => f(v),
        None => ControlFlow::Continue(()),
    }
}

/// `key` is what remains after `node`'s own label.
fn update_at<V: Clone>(
    node: &mut Arc<Node<V>>,
    key: &[u8],
    f: impl FnOnce(Option<V>) -> Option<V>,
) {
    let n = Arc::make_mut(node);
    let Some(&b) = key.first() else {
        n.value = f(n.value.take());
        return;
    };
    let i = match n.first.binary_search(&b) {
        Ok(i) => i,
        Err(i) => {
            if let Some(v) = f(None) {
                n.first.insert(i, b);
                n.kids.insert(i, Arc::new(Node::leaf(key, v)));
            }
            return;
        }
    };
    let common = n.kids[i]
        .label
        .iter()
        .zip(key)
        .take_while(|(a, b)| a == b)
        .count();
    if common < n.kids[i].label.len() {
        // The key leaves this edge midway: nothing is stored under it yet.
        let Some(v) = f(None) else { return };
        let mut old = n.kids[i].clone();
        let o = Arc::make_mut(&mut old);
        let old_first = o.label[common];
        o.label = o.label[common..].into();
        let mut mid = Node {
            label: key[..common].into(),
            first: vec![old_first],
            kids: vec![old],
            value: None,
        };
        if common == key.len() {
            mid.value = Some(v);
        } else {
            let leaf = Arc::new(Node::leaf(&key[common..], v));
            let at = usize::from(key[common] > old_first);
            mid.first.insert(at, key[common]);
            mid.kids.insert(at, leaf);
        }
        n.kids[i] = Arc::new(mid);
        return;
    }
    update_at(&mut n.kids[i], &key[common..], f);
    let child = &n.kids[i];
    if child.value.is_some() {
        return;
    }
    match child.kids.len() {
        0 => {
            n.first.remove(i);
            n.kids.remove(i);
        }
        1 => {
            // A valueless node with one child is an edge again.
            let prefix = child.label.clone();
            let mut only = child.kids[0].clone();
            let o = Arc::make_mut(&mut only);
            o.label = prefix.iter().chain(o.label.iter()).copied().collect();
            n.kids[i] = only;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[&str]) -> Trie<u32> {
        let mut t = Trie::default();
        for (i, k) in keys.iter().enumerate() {
            t.update(k.as_bytes(), |_| Some(i as u32));
        }
        t
    }

    fn all<K: TrieKey>(t: &Trie<u32>, key: &K) -> Vec<u32> {
        let mut out = Vec::new();
        t.prefixes_of(key, &mut |v: &u32| -> ControlFlow<()> {
            out.push(*v);
            ControlFlow::Continue(())
        });
        out
    }

    fn fwd(t: &Trie<u32>, keys: &[&str], input: &str) -> Vec<String> {
        all(t, &Fwd(input.as_bytes()))
            .into_iter()
            .map(|v| keys[v as usize].to_string())
            .collect()
    }

    #[test]
    fn prefixes_longest_first() {
        let keys = ["/", "/a", "/a/", "/a/b", "/ab", "/b", "/a/bc", ""];
        let t = trie(&keys);
        assert_eq!(
            fwd(&t, &keys, "/a/bcd"),
            ["/a/bc", "/a/b", "/a/", "/a", "/", ""]
        );
        assert_eq!(fwd(&t, &keys, "/a/x"), ["/a/", "/a", "/", ""]);
        assert_eq!(fwd(&t, &keys, "/abc"), ["/ab", "/a", "/", ""]);
        assert_eq!(fwd(&t, &keys, "/a"), ["/a", "/", ""]);
        assert_eq!(fwd(&t, &keys, "x"), [""]);
        assert_eq!(fwd(&t, &keys, ""), [""]);
        assert!(!t.is_empty());
        assert_eq!(t.get(&Fwd(b"/a/b")), Some(&3));
        assert_eq!(t.get(&Fwd(b"/a/")), Some(&2));
        assert_eq!(t.get(&Fwd(b"/a/bcd")), None);
        assert_eq!(t.get(&Fwd(b"/a/x")), None);
    }

    #[test]
    fn no_false_prefixes() {
        let keys = ["/foo/", "/foobar", "/fo"];
        let t = trie(&keys);
        assert_eq!(fwd(&t, &keys, "/foo"), ["/fo"]);
        assert_eq!(fwd(&t, &keys, "/foob"), ["/fo"]);
        assert_eq!(fwd(&t, &keys, "/foobar/x"), ["/foobar", "/fo"]);
        assert_eq!(fwd(&t, &keys, "/f"), Vec::<String>::new());
        assert_eq!(t.get(&Fwd(b"/foo")), None, "an inner node holds no value");
        assert!(Trie::<u32>::default().is_empty());
    }

    #[test]
    fn reversed_suffixes() {
        // Keys are stored reversed; lookups read the host backwards.
        let suffixes = [".foo.com", "foo.com", ".com", ""];
        let mut t = Trie::default();
        for (i, s) in suffixes.iter().enumerate() {
            let rev: Vec<u8> = s.bytes().rev().collect();
            t.update(&rev, |_| Some(i as u32));
        }
        let got = |h: &str| -> Vec<&str> {
            all(&t, &Rev(h.as_bytes()))
                .into_iter()
                .map(|v| suffixes[v as usize])
                .collect()
        };
        assert_eq!(got("a.foo.com"), [".foo.com", "foo.com", ".com", ""]);
        assert_eq!(got("foo.com"), ["foo.com", ".com", ""]);
        assert_eq!(got("barfoo.com"), ["foo.com", ".com", ""]);
        assert_eq!(got("example.org"), [""]);
    }

    #[test]
    fn wide_fanout_and_many_keys() {
        let keys: Vec<String> = (0..5000).map(|i| format!("/k{i}/")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let t = trie(&refs);
        for (i, k) in keys.iter().enumerate().step_by(97) {
            let input = format!("{k}rest");
            assert_eq!(all(&t, &Fwd(input.as_bytes())), [i as u32], "{input}");
        }
        assert!(all(&t, &Fwd(b"/k5000/")).is_empty());
    }

    #[test]
    fn breaking_stops_the_walk() {
        let keys = ["/", "/a", "/a/b"];
        let t = trie(&keys);
        let mut seen = Vec::new();
        let r = t.prefixes_of(&Fwd(b"/a/b/c"), &mut |v: &u32| {
            seen.push(*v);
            if *v == 1 {
                ControlFlow::Break(*v)
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!((r, seen), (Some(1), vec![2, 1]));
    }

    #[test]
    fn updates_copy_only_their_path_and_removals_restore_the_shape() {
        let keys: Vec<String> = (0..300).map(|i| format!("/svc{i}/x")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let base = trie(&refs);
        let fresh_nodes = base.nodes();

        let mut next = base.clone();
        next.update(b"/svc7/x", |v| v.map(|v| v + 1000));
        next.update(b"/new/y", |_| Some(9999));
        // The published version is untouched.
        assert_eq!(base.get(&Fwd(b"/svc7/x")), Some(&7));
        assert_eq!(base.get(&Fwd(b"/new/y")), None);
        assert_eq!(next.get(&Fwd(b"/svc7/x")), Some(&1007));
        assert_eq!(next.get(&Fwd(b"/new/y")), Some(&9999));
        // Unchanged subtrees are the same allocations: all but the copied path.
        fn ptrs(n: &Arc<Node<u32>>, out: &mut Vec<*const Node<u32>>) {
            out.push(Arc::as_ptr(n));
            n.kids.iter().for_each(|k| ptrs(k, out));
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        ptrs(&base.root, &mut a);
        ptrs(&next.root, &mut b);
        let fresh_in_next = b.iter().filter(|p| !a.contains(p)).count();
        assert!(
            fresh_in_next <= 8,
            "{fresh_in_next} of {} nodes copied",
            b.len()
        );

        // Removing what was added (and a key that is not there) gives the fresh shape back.
        next.update(b"/new/y", |_| None);
        next.update(b"/nothing", |_| None);
        next.update(b"/svc", |_| None);
        assert_eq!(next.nodes(), fresh_nodes);
        for (i, k) in keys.iter().enumerate() {
            next.update(k.as_bytes(), |_| None);
            assert_eq!(next.get(&Fwd(k.as_bytes())), None);
            if i + 1 < keys.len() {
                let v = next.get(&Fwd(keys[i + 1].as_bytes())).map(|v| v % 1000);
                assert_eq!(v, Some(i as u32 + 1));
            }
        }
        assert!(next.is_empty());
        assert_eq!(next.nodes(), 1);
        assert_eq!(base.values().len(), 300);
    }

    #[test]
    fn split_edges_in_both_directions() {
        let mut t = Trie::default();
        t.update(b"/abcdef", |_| Some(1));
        t.update(b"/abc", |_| Some(2)); // ends midway through an edge
        t.update(b"/abxyz", |_| Some(3)); // leaves an edge midway
        t.update(b"/ab0", |_| Some(4)); // sorts before the existing child
        for (k, v) in [("/abcdef", 1), ("/abc", 2), ("/abxyz", 3), ("/ab0", 4)] {
            assert_eq!(t.get(&Fwd(k.as_bytes())), Some(&v), "{k}");
        }
        assert_eq!(all(&t, &Fwd(b"/abcdefg")), [1, 2]);
        t.update(b"/abc", |_| None);
        assert_eq!(all(&t, &Fwd(b"/abcdefg")), [1]);
        let mut fresh = Trie::default();
        for (k, v) in [("/abcdef", 1), ("/abxyz", 3), ("/ab0", 4)] {
            fresh.update(k.as_bytes(), |_| Some(v));
        }
        assert_eq!(t.nodes(), fresh.nodes());
    }
}
