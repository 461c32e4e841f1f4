//! A least-recently-used map with weights: the recency list both cache stores evict by (the
//! memory zones' answers, the disk zones' index of files), as nginx's shared dictionaries and
//! `keys_zone` evict the least recently used entry when full.
//!
//! Nodes live in a slab and link to each other by index, so touching an entry on a hit moves
//! two links and allocates nothing.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

const NIL: usize = usize::MAX;

struct Node<K, V> {
    key: K,
    value: V,
    weight: usize,
    prev: usize,
    next: usize,
}

/// Entries by key, in recency order; the caller bounds the total weight.
pub struct Lru<K, V> {
    index: HashMap<K, usize, foldhash::fast::RandomState>,
    nodes: Vec<Option<Node<K, V>>>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used: evicted first.
    tail: usize,
    weight: usize,
}

impl<K: Hash + Eq + Clone, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            index: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            weight: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The sum of the entries' weights.
    pub fn weight(&self) -> usize {
        self.weight
    }

    fn node(&mut self, i: usize) -> &mut Node<K, V> {
        self.nodes[i].as_mut().expect("linked nodes are live")
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = {
            let n = self.node(i);
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.node(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.node(next).prev = prev;
        }
    }

    fn push_front(&mut self, i: usize) {
        let head = self.head;
        {
            let n = self.node(i);
            n.prev = NIL;
            n.next = head;
        }
        if head == NIL {
            self.tail = i;
        } else {
            self.node(head).prev = i;
        }
        self.head = i;
    }

    /// The value of `key`, made the most recently used.
    pub fn get<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let i = *self.index.get(key)?;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        Some(&mut self.node(i).value)
    }

    /// The value of `key` without touching its recency.
    pub fn peek<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        let i = *self.index.get(key)?;
        self.nodes[i].as_ref().map(|n| &n.value)
    }

    /// Stores `value` as the most recently used; answers the value it replaced.
    pub fn insert(&mut self, key: K, value: V, weight: usize) -> Option<V> {
        let old = self.remove(&key);
        let node = Node {
            key: key.clone(),
            value,
            weight,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.index.insert(key, i);
        self.weight += weight;
        self.push_front(i);
        old
    }

    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let i = self.index.remove(key)?;
        self.unlink(i);
        let n = self.nodes[i].take().expect("indexed nodes are live");
        self.free.push(i);
        self.weight -= n.weight;
        Some(n.value)
    }

    /// Removes the least recently used entry.
    pub fn pop_lru(&mut self) -> Option<(K, V, usize)> {
        if self.tail == NIL {
            return None;
        }
        let key = self.nodes[self.tail].as_ref()?.key.clone();
        let weight = self.nodes[self.tail].as_ref()?.weight;
        self.remove(&key).map(|v| (key, v, weight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_and_keeps_weights() {
        let mut l: Lru<&str, u32> = Lru::default();
        l.insert("a", 1, 10);
        l.insert("b", 2, 20);
        l.insert("c", 3, 30);
        assert_eq!((l.len(), l.weight()), (3, 60));
        // A hit on "a" makes "b" the oldest.
        assert_eq!(l.get(&"a"), Some(&mut 1));
        assert_eq!(l.pop_lru(), Some(("b", 2, 20)));
        assert_eq!(l.insert("c", 4, 5), Some(3));
        assert_eq!(l.weight(), 15);
        assert_eq!(l.pop_lru(), Some(("a", 1, 10)));
        assert_eq!(l.remove(&"c"), Some(4));
        assert_eq!((l.len(), l.weight(), l.pop_lru()), (0, 0, None));
        // Freed slots are reused.
        l.insert("d", 5, 1);
        assert_eq!(l.nodes.len(), 3);
        assert_eq!(l.peek(&"d"), Some(&5));
    }
}
