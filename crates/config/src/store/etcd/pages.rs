//! Admin list pages of a resource directory in creation order (APISIX's page order): cut from
//! the state the sync loop follows when it is known to be current, else read from etcd's range
//! sorted by create revision, without reading the whole directory's values.

use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use super::{header_revision, kv_of, EtcdStore, MAX_MESSAGE};
use crate::model::ResourceKind;
use crate::state::StoredItem;
use crate::store::{KeyValue, Page, StoreError};

/// How long a page waits for the followed state to reach the revision of its count before
/// it reads etcd's sorted range instead. The watch is normally milliseconds behind; it stays
/// behind only when the newest revision changed keys outside the prefix (another cluster's
/// prefix in the same etcd), until etcd's next progress report.
const STATE_CATCH_UP: Duration = Duration::from_millis(50);

/// etcd's default `--max-txn-ops`: a page's values are read in transactions of at most this
/// many gets.
const MAX_TXN_OPS: usize = 128;

impl EtcdStore {
    /// A page from the state the sync loop follows, when it is known to hold what etcd holds
    /// in `dir`: one read of a single key gives etcd's revision (a sorted range reads every
    /// key of the directory, 200 ms at 100,000 routes); once the state is followed through
    /// that revision (normally at once: the watch delivers this node's own writes before
    /// their acknowledgment is read here, and others' within milliseconds), holds no
    /// unreadable item of the directory, and no key further down is known there, the page is
    /// cut from it.
    pub(super) async fn page_from_state(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<StatePage, StoreError> {
        let prefix = format!("{}/", self.shared.config.prefix);
        let Some(kind) = dir
            .strip_prefix(&prefix)
            .and_then(|d| d.strip_suffix('/'))
            .and_then(ResourceKind::from_dir)
        else {
            return Ok(StatePage::Unknown);
        };
        // etcd's current revision, from the cheapest read there is (one key, counted): a count
        // of the directory walks etcd's index of all its keys (30 ms at 100,000 routes).
        let mut kv = self.client()?.kv_client();
        let response = self
            .call(kv.get(dir, Some(GetOptions::new().with_count_only())))
            .await?;
        let revision = header_revision(response.header());
        let mut followed = self.shared.followed.subscribe();
        let caught_up =
            tokio::time::timeout(STATE_CATCH_UP, followed.wait_for(|r| *r >= revision)).await;
        if !matches!(caught_up, Ok(Ok(_))) {
            return Ok(StatePage::Unknown);
        }
        let state = self.shared.states.borrow().clone();
        let nested = self
            .shared
            .nested
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .range(dir.to_string()..)
            .next()
            .is_some_and(|k| k.starts_with(dir));
        if nested {
            // Keys further down, which the state does not hold: the whole directory.
            return Ok(StatePage::WholeDirectory);
        }
        let items = state.resources.get(&kind);
        let unreadable = state
            .unreadable
            .range((kind, String::new())..)
            .next()
            .is_some_and(|((k, _), _)| *k == kind);
        if unreadable {
            // etcd's range lists such a value as stored.
            return Ok(StatePage::Unknown);
        }
        let total = items.map_or(0, |m| m.len());
        let Some(items) = items else {
            return Ok(StatePage::Page(Page {
                kvs: Vec::new(),
                total,
            }));
        };
        Ok(StatePage::Page(Page {
            kvs: creation_order_page(items.values(), offset, limit)
                .into_iter()
                .map(|item| KeyValue {
                    key: format!("{dir}{}", item.id),
                    value: item.value.text().as_bytes().to_vec(),
                    create_revision: item.create_revision,
                    mod_revision: item.mod_revision,
                })
                .collect(),
            total,
        }))
    }

    /// A page without reading the directory's values: one range of the directory's keys
    /// only, sorted by create revision and cut at the page's end, with its count and the
    /// directory placeholder's in the same transaction; then the page's values by key. etcd
    /// sorts the whole range server-side, but only the keys up to the page's end and the
    /// page's values cross the wire and are parsed.
    pub(super) async fn page_from_sorted_range(
        &self,
        dir: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Option<Page>, StoreError> {
        let mut kv = self
            .client()?
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
        // One more than the page's end: the placeholder may be among them.
        let window = offset.saturating_add(limit).saturating_add(1);
        let keys = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::try_from(window).unwrap_or(i64::MAX));
        let placeholder = GetOptions::new().with_count_only();
        let txn = Txn::new().and_then([
            TxnOp::get(dir, Some(keys)),
            TxnOp::get(dir, Some(placeholder)),
        ]);
        let responses = self.call(kv.txn(txn)).await?.op_responses();
        let (Some(TxnOpResponse::Get(listed)), Some(TxnOpResponse::Get(own))) =
            (responses.first(), responses.get(1))
        else {
            return Err(StoreError::Unavailable(
                "etcd: unexpected answer to a page's range".into(),
            ));
        };
        let mut names: Vec<(i64, &[u8])> = Vec::with_capacity(listed.kvs().len());
        for kv in listed.kvs() {
            let key = kv.key();
            if key == dir.as_bytes() {
                continue;
            }
            // A key further down is not an item of this directory, and the count above
            // included it: list the directory whole instead.
            if key[dir.len()..].contains(&b'/') {
                return Ok(None);
            }
            names.push((kv.create_revision(), key));
        }
        // Creation order, then key order for keys created in one transaction (etcd leaves
        // their order open), as the embedded store pages.
        names.sort();
        let total = usize::try_from(listed.count() - own.count()).unwrap_or(0);
        let page: Vec<Vec<u8>> = names
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(_, key)| key.to_vec())
            .collect();
        let mut kvs = Vec::with_capacity(page.len());
        for chunk in page.chunks(MAX_TXN_OPS) {
            let gets: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let responses = self.call(kv.txn(Txn::new().and_then(gets))).await?;
            for response in responses.op_responses() {
                // A key deleted since the range was read is left out of this page.
                if let TxnOpResponse::Get(got) = response {
                    kvs.extend(got.kvs().first().map(kv_of));
                }
            }
        }
        Ok(Some(Page { kvs, total }))
    }
}

/// What the followed state says of a page ([`EtcdStore::page_from_state`]).
pub(super) enum StatePage {
    Page(Page),
    /// The directory holds keys that are no items of it: list it whole.
    WholeDirectory,
    /// The state cannot say (not caught up, a value that is not JSON, no resource directory).
    Unknown,
}

/// Items `offset..offset + limit` in creation order (create revision, then id: keys created in
/// one transaction share their revision), without sorting the whole directory.
fn creation_order_page<'a>(
    items: impl Iterator<Item = &'a StoredItem>,
    offset: usize,
    limit: usize,
) -> Vec<&'a StoredItem> {
    fn order<'i>(i: &&'i StoredItem) -> (i64, &'i str) {
        (i.create_revision, i.id.as_str())
    }
    let mut all: Vec<&StoredItem> = items.collect();
    let end = offset.saturating_add(limit).min(all.len());
    if offset >= end {
        return Vec::new();
    }
    if end < all.len() {
        all.select_nth_unstable_by_key(end - 1, order);
        all.truncate(end);
    }
    all.sort_unstable_by_key(order);
    all.drain(..offset);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_order_pages_match_a_full_sort() {
        use crate::state::StoredValue;
        // Create revisions with repeats (one transaction's keys), ids out of order.
        let items: Vec<StoredItem> = (0..97u32)
            .map(|i| StoredItem {
                id: format!("r{}", (i * 31) % 97),
                value: StoredValue::from_json(b"{}").unwrap(),
                create_revision: i64::from((i * 7) % 50),
                mod_revision: 0,
                seq: 0,
            })
            .collect();
        let mut sorted: Vec<&StoredItem> = items.iter().collect();
        sorted.sort_by_key(|i| (i.create_revision, i.id.clone()));
        for (offset, limit) in [
            (0, 10),
            (0, 97),
            (5, 200),
            (90, 10),
            (96, 1),
            (97, 10),
            (200, 5),
        ] {
            let page = creation_order_page(items.iter(), offset, limit);
            let want: Vec<&StoredItem> = sorted.iter().skip(offset).take(limit).copied().collect();
            let ids = |v: &[&StoredItem]| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
            assert_eq!(ids(&page), ids(&want), "offset {offset}, limit {limit}");
        }
    }
}
