//! The embedded store's keys by directory in creation order, so that a page of an Admin list
//! (`?page=1&page_size=10` over 100,000 routes) reads the ten keys it shows, not the whole
//! directory. Kept in memory beside the file (built when the file opens, changed with every
//! commit); it holds no values, only each key's name in its directory and its create revision.

use std::collections::{BTreeSet, HashMap};

/// Keys by the directory they are directly in (`/apisix/routes/` for `/apisix/routes/1`).
#[derive(Debug, Default)]
pub(super) struct CreationIndex {
    /// Per directory: `(create_revision, name)`, the order APISIX's pages follow (a stable sort
    /// by create revision of the keys in key order).
    dirs: HashMap<Box<str>, BTreeSet<(i64, Box<str>)>>,
}

/// `key` split into its directory (up to its last `/`) and its name; `None` for a directory
/// key itself (`/apisix/routes/`).
fn split(key: &str) -> Option<(&str, &str)> {
    let at = key.rfind('/')? + 1;
    let (dir, name) = key.split_at(at);
    (!name.is_empty()).then_some((dir, name))
}

impl CreationIndex {
    pub fn insert(&mut self, key: &str, create_revision: i64) {
        if let Some((dir, name)) = split(key) {
            self.dirs
                .entry(dir.into())
                .or_default()
                .insert((create_revision, name.into()));
        }
    }

    pub fn remove(&mut self, key: &str, create_revision: i64) {
        let Some((dir, name)) = split(key) else {
            return;
        };
        if let Some(keys) = self.dirs.get_mut(dir) {
            keys.remove(&(create_revision, Box::<str>::from(name)));
            if keys.is_empty() {
                self.dirs.remove(dir);
            }
        }
    }

    /// A put of `key` that replaced a record created at `old` (live or expired) with one
    /// created at `new`.
    pub fn replace(&mut self, key: &str, old: Option<i64>, new: i64) {
        if old == Some(new) {
            return;
        }
        if let Some(old) = old {
            self.remove(key, old);
        }
        self.insert(key, new);
    }

    /// The keys of one page of `dir` and how many keys `dir` holds.
    pub fn page(&self, dir: &str, offset: usize, limit: usize) -> (Vec<String>, usize) {
        let Some(keys) = self.dirs.get(dir) else {
            return (Vec::new(), 0);
        };
        let page = keys
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(_, name)| format!("{dir}{name}"))
            .collect();
        (page, keys.len())
    }

    pub fn clear(&mut self) {
        self.dirs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_creation_order_then_key_order_within_one_directory() {
        let mut index = CreationIndex::default();
        index.insert("/apisix/routes/", 1);
        index.insert("/apisix/routes/b", 5);
        index.insert("/apisix/routes/a", 7);
        index.insert("/apisix/routes/c", 5);
        index.insert("/apisix/consumers/u", 3);
        index.insert("/apisix/consumers/u/credentials/k", 4);
        let (keys, total) = index.page("/apisix/routes/", 0, 10);
        assert_eq!(
            keys,
            ["/apisix/routes/b", "/apisix/routes/c", "/apisix/routes/a"]
        );
        assert_eq!(total, 3, "the directory key is not in it");
        assert_eq!(index.page("/apisix/routes/", 1, 1).0, ["/apisix/routes/c"]);
        assert_eq!(index.page("/apisix/routes/", 3, 10), (vec![], 3));
        // Credentials are their own directory, not consumers.
        assert_eq!(
            index.page("/apisix/consumers/", 0, 10),
            (vec!["/apisix/consumers/u".to_owned()], 1)
        );

        // Re-created after expiring: a new create revision moves it to the end.
        index.replace("/apisix/routes/b", Some(5), 9);
        index.replace("/apisix/routes/c", Some(5), 5);
        assert_eq!(
            index.page("/apisix/routes/", 0, 10).0,
            ["/apisix/routes/c", "/apisix/routes/a", "/apisix/routes/b"]
        );
        index.remove("/apisix/routes/a", 7);
        index.remove("/apisix/routes/a", 7);
        index.remove("/apisix/routes/x", 1);
        assert_eq!(index.page("/apisix/routes/", 0, 10).1, 2);
        index.remove("/apisix/routes/b", 9);
        index.remove("/apisix/routes/c", 5);
        assert!(!index.dirs.contains_key("/apisix/routes/"));
    }
}
