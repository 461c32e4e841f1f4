//! What a plugin's instances on every worker share: the shared data (key-value with
//! compare-and-swap) and the shared queues. Only a module's own calls take these locks; a
//! request whose module does not use them takes none.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::abi::status;

/// Shared data: key → (value, CAS token).
type SharedData = HashMap<Vec<u8>, (Vec<u8>, u32)>;

/// One plugin's shared key-value store and queues (the proxy-wasm "VM id" scope: one per
/// plugin).
#[derive(Default)]
pub(crate) struct Shared {
    data: Mutex<SharedData>,
    queues: Mutex<Queues>,
}

#[derive(Default)]
struct Queues {
    by_name: HashMap<Vec<u8>, u32>,
    items: HashMap<u32, VecDeque<Vec<u8>>>,
}

/// Queued items one queue may hold; an enqueue past it is refused, so a module that only
/// enqueues cannot grow the host's memory without bound.
const QUEUE_CAP: usize = 10_000;

impl Shared {
    /// The value and its CAS token.
    pub(crate) fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        lock(&self.data).get(key).cloned()
    }

    /// Sets `key`; a non-zero `cas` must match the current token (a missing key has none).
    pub(crate) fn set(&self, key: &[u8], value: &[u8], cas: u32) -> i32 {
        let mut data = lock(&self.data);
        let current = data.get(key).map(|(_, c)| *c);
        if cas != 0 && current != Some(cas) {
            return status::CAS_MISMATCH;
        }
        let next = current.map_or(1, |c| c.wrapping_add(1).max(1));
        data.insert(key.to_vec(), (value.to_vec(), next));
        status::OK
    }

    /// The queue named `name`, made on first registration.
    pub(crate) fn register_queue(&self, name: &[u8]) -> u32 {
        let mut q = lock(&self.queues);
        if let Some(t) = q.by_name.get(name) {
            return *t;
        }
        let token = q.by_name.len() as u32 + 1;
        q.by_name.insert(name.to_vec(), token);
        q.items.insert(token, VecDeque::new());
        token
    }

    pub(crate) fn resolve_queue(&self, name: &[u8]) -> Option<u32> {
        lock(&self.queues).by_name.get(name).copied()
    }

    pub(crate) fn enqueue(&self, token: u32, item: &[u8]) -> i32 {
        let mut q = lock(&self.queues);
        match q.items.get_mut(&token) {
            None => status::NOT_FOUND,
            Some(items) if items.len() >= QUEUE_CAP => status::BAD_ARGUMENT,
            Some(items) => {
                items.push_back(item.to_vec());
                status::OK
            }
        }
    }

    /// The oldest item; `Err(NOT_FOUND)` for an unknown queue, `Ok(None)` for an empty one.
    pub(crate) fn dequeue(&self, token: u32) -> Result<Option<Vec<u8>>, i32> {
        let mut q = lock(&self.queues);
        match q.items.get_mut(&token) {
            None => Err(status::NOT_FOUND),
            Some(items) => Ok(items.pop_front()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_swap() {
        let s = Shared::default();
        assert_eq!(s.get(b"k"), None);
        assert_eq!(s.set(b"k", b"1", 7), status::CAS_MISMATCH);
        assert_eq!(s.set(b"k", b"1", 0), status::OK);
        let (v, cas) = s.get(b"k").unwrap();
        assert_eq!(v, b"1");
        assert_eq!(s.set(b"k", b"2", cas.wrapping_add(1)), status::CAS_MISMATCH);
        assert_eq!(s.set(b"k", b"2", cas), status::OK);
        assert_eq!(s.get(b"k").unwrap().0, b"2");
        assert_eq!(s.set(b"k", b"3", cas), status::CAS_MISMATCH);
    }

    #[test]
    fn queues_in_order() {
        let s = Shared::default();
        let t = s.register_queue(b"q");
        assert_eq!(s.register_queue(b"q"), t);
        assert_eq!(s.resolve_queue(b"q"), Some(t));
        assert_eq!(s.resolve_queue(b"other"), None);
        assert_eq!(s.dequeue(t), Ok(None));
        assert_eq!(s.enqueue(t, b"a"), status::OK);
        assert_eq!(s.enqueue(t, b"b"), status::OK);
        assert_eq!(s.dequeue(t), Ok(Some(b"a".to_vec())));
        assert_eq!(s.dequeue(t), Ok(Some(b"b".to_vec())));
        assert_eq!(s.enqueue(99, b"x"), status::NOT_FOUND);
        assert_eq!(s.dequeue(99), Err(status::NOT_FOUND));
    }
}
