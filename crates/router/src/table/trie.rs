//! A byte radix tree answering one question: which stored keys are prefixes of this input,
//! longest first.
//!
//! That is all lua-resty-radixtree asks of its tree (`raxSeek "<="` then `raxUp`), both for URI
//! prefixes and, on reversed strings, for wildcard-host suffixes. The walk goes down while edge
//! labels match and then climbs parent links, so a lookup needs no buffer and no allocation no
//! matter how many stored prefixes the input has. Nodes are laid out breadth-first so a node's
//! children are contiguous and their first bytes form one small sorted slice.

/// Marks "no value" / "no parent".
const NONE: u32 = u32::MAX;

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

#[derive(Clone, Copy, Debug)]
struct Node {
    label_start: u32,
    label_len: u32,
    parent: u32,
    value: u32,
    /// Index of the first child; children are consecutive.
    kids_start: u32,
    kids_len: u32,
}

/// The frozen tree.
#[derive(Debug)]
pub(crate) struct Trie {
    nodes: Vec<Node>,
    /// First label byte of every node, indexed like `nodes`.
    first: Vec<u8>,
    labels: Vec<u8>,
}

impl Trie {
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.len() == 1 && self.nodes[0].value == NONE
    }

    /// Values of the stored keys that are prefixes of `key`, longest first.
    #[inline]
    pub(crate) fn prefixes_of<K: TrieKey>(&self, key: &K) -> Prefixes<'_> {
        Prefixes {
            trie: self,
            node: self.deepest(key),
        }
    }

    /// The deepest node whose whole key is a prefix of `key`; its ancestors are the others.
    fn deepest<K: TrieKey>(&self, key: &K) -> u32 {
        let len = key.len();
        let mut n = 0usize;
        let mut pos = 0usize;
        loop {
            let node = self.nodes[n];
            if pos == len || node.kids_len == 0 {
                break;
            }
            let start = node.kids_start as usize;
            let kids = &self.first[start..start + node.kids_len as usize];
            let b = key.at(pos);
            let found = if kids.len() <= 16 {
                kids.iter().position(|&k| k == b)
            } else {
                kids.binary_search(&b).ok()
            };
            let Some(i) = found else { break };
            let c = start + i;
            let child = self.nodes[c];
            let label = &self.labels[child.label_start as usize..][..child.label_len as usize];
            if !key.matches(pos, label) {
                break;
            }
            pos += label.len();
            n = c;
        }
        n as u32
    }
}

/// Climbs from the deepest matching node to the root, yielding stored values.
pub(crate) struct Prefixes<'t> {
    trie: &'t Trie,
    node: u32,
}

impl Iterator for Prefixes<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        while self.node != NONE {
            let n = self.trie.nodes[self.node as usize];
            self.node = n.parent;
            if n.value != NONE {
                return Some(n.value);
            }
        }
        None
    }
}

/// Mutable form used while inserting.
#[derive(Debug)]
struct BNode {
    label: Vec<u8>,
    /// Sorted by first byte.
    kids: Vec<(u8, u32)>,
    value: u32,
}

#[derive(Debug)]
pub(crate) struct TrieBuilder {
    nodes: Vec<BNode>,
}

impl TrieBuilder {
    pub(crate) fn new() -> TrieBuilder {
        TrieBuilder {
            nodes: vec![BNode {
                label: Vec::new(),
                kids: Vec::new(),
                value: NONE,
            }],
        }
    }

    /// Stores `value` under `key` (replacing an earlier value for the same key).
    pub(crate) fn insert(&mut self, key: &[u8], value: u32) {
        let mut n = 0usize;
        let mut pos = 0usize;
        loop {
            if pos == key.len() {
                self.nodes[n].value = value;
                return;
            }
            let b = key[pos];
            match self.nodes[n].kids.binary_search_by_key(&b, |k| k.0) {
                Err(i) => {
                    let leaf = self.push(key[pos..].to_vec(), value);
                    self.nodes[n].kids.insert(i, (b, leaf));
                    return;
                }
                Ok(i) => {
                    let c = self.nodes[n].kids[i].1 as usize;
                    let label = &self.nodes[c].label;
                    let common = label
                        .iter()
                        .zip(&key[pos..])
                        .take_while(|(a, b)| a == b)
                        .count();
                    if common < label.len() {
                        // Split the edge: a new node takes the shared part.
                        let shared = label[..common].to_vec();
                        let next = label[common];
                        self.nodes[c].label.drain(..common);
                        let mid = self.push(shared, NONE);
                        self.nodes[mid as usize].kids.push((next, c as u32));
                        self.nodes[n].kids[i].1 = mid;
                        n = mid as usize;
                    } else {
                        n = c;
                    }
                    pos += common;
                }
            }
        }
    }

    fn push(&mut self, label: Vec<u8>, value: u32) -> u32 {
        self.nodes.push(BNode {
            label,
            kids: Vec::new(),
            value,
        });
        (self.nodes.len() - 1) as u32
    }

    /// Freezes the tree breadth-first so that siblings are adjacent.
    pub(crate) fn build(self) -> Trie {
        let total = self.nodes.len();
        let mut nodes = Vec::with_capacity(total);
        let mut first = Vec::with_capacity(total);
        let mut labels = Vec::new();
        // (old index, new parent index) in BFS order; the queue is `order` itself.
        let mut order: Vec<(u32, u32)> = Vec::with_capacity(total);
        order.push((0, NONE));
        let mut head = 0;
        while head < order.len() {
            let (old, parent) = order[head];
            let b = &self.nodes[old as usize];
            let me = head as u32;
            let kids_start = order.len() as u32;
            for &(_, kid) in &b.kids {
                order.push((kid, me));
            }
            nodes.push(Node {
                label_start: labels.len() as u32,
                label_len: b.label.len() as u32,
                parent,
                value: b.value,
                kids_start,
                kids_len: b.kids.len() as u32,
            });
            first.push(b.label.first().copied().unwrap_or(0));
            labels.extend_from_slice(&b.label);
            head += 1;
        }
        Trie {
            nodes,
            first,
            labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[&str]) -> Trie {
        let mut b = TrieBuilder::new();
        for (i, k) in keys.iter().enumerate() {
            b.insert(k.as_bytes(), i as u32);
        }
        b.build()
    }

    fn fwd(t: &Trie, keys: &[&str], input: &str) -> Vec<String> {
        t.prefixes_of(&Fwd(input.as_bytes()))
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
    }

    #[test]
    fn no_false_prefixes() {
        let keys = ["/foo/", "/foobar", "/fo"];
        let t = trie(&keys);
        assert_eq!(fwd(&t, &keys, "/foo"), ["/fo"]);
        assert_eq!(fwd(&t, &keys, "/foob"), ["/fo"]);
        assert_eq!(fwd(&t, &keys, "/foobar/x"), ["/foobar", "/fo"]);
        assert_eq!(fwd(&t, &keys, "/f"), Vec::<String>::new());
        assert!(TrieBuilder::new().build().is_empty());
    }

    #[test]
    fn reversed_suffixes() {
        // Keys are stored reversed; lookups read the host backwards.
        let suffixes = [".foo.com", "foo.com", ".com", ""];
        let mut b = TrieBuilder::new();
        for (i, s) in suffixes.iter().enumerate() {
            let rev: Vec<u8> = s.bytes().rev().collect();
            b.insert(&rev, i as u32);
        }
        let t = b.build();
        let got = |h: &str| -> Vec<&str> {
            t.prefixes_of(&Rev(h.as_bytes()))
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
            let got: Vec<u32> = t.prefixes_of(&Fwd(input.as_bytes())).collect();
            assert_eq!(got, [i as u32], "{input}");
        }
        assert_eq!(t.prefixes_of(&Fwd(b"/k5000/")).count(), 0);
    }
}
