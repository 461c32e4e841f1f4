//! Full listings read in bounded pages: the first load, a re-list after compaction, and an
//! Admin list of a whole directory. One range read of a big configuration is one gRPC message
//! (the values of a million routes are hundreds of MB, over any sane client limit), and etcd
//! builds the whole answer in memory before it sends it. So the range is read `page_size` keys
//! at a time, each page from the key after the last one read, all at the revision of the
//! first page (pinned), so that together they are one snapshot, as one read would have been.
//!
//! etcd answers a range with a limit only after it has walked its index over the whole range
//! (to say how many keys are left), so pages that each ran to the end of the prefix would cost
//! the square of its size: seconds per page at a million keys. Each read therefore covers a
//! key range of its own, guessed from the key span the previous pages needed for their keys
//! (keys read as numbers, see [`Position`]): a guess too narrow costs one more short read, one
//! too wide the walk of what it covers, after which the guess is corrected. The ranges follow
//! each other without gap or overlap, so what they hold is the whole prefix whatever the
//! guesses.
//!
//! A page whose answer is still too large for the client (large values) is asked again with
//! half the keys, and the next pages with fewer keys so they stay near [`PAGE_BYTES`]; a single
//! value too large alone is skipped with its key reported, so one bad value does not stop the
//! pages around it. If etcd compacts the pinned revision while the pages are read, the listing
//! says so ([`ListError::Compacted`]) and the caller starts over from a fresh revision.

use std::time::Duration;

use etcd_client::{GetOptions, KvClient};

use super::{kv_of, MAX_MESSAGE};
use crate::store::KeyValue;

/// The size a page aims at: after each page the next one asks for as many keys as the values
/// seen so far suggest fit in this, never more than the configured page size.
pub(super) const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// etcd's answer when the revision asked for is older than its compacted history.
const COMPACTED: &str = "required revision has been compacted";

/// One page of a listing.
#[derive(Debug)]
pub(super) enum ListPage {
    /// The next keys in key order, with their values.
    Kvs(Vec<KeyValue>),
    /// A key whose value alone is too large to be read in one message, and why.
    TooLarge { key: String, reason: String },
}

#[derive(Debug, PartialEq)]
pub(super) enum ListError {
    /// The pinned revision was compacted while the pages were read: list again.
    Compacted,
    /// Anything else (connection, timeout, refusal): the caller's usual error handling.
    Failed(String),
}

impl std::fmt::Display for ListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListError::Compacted => {
                f.write_str("etcd compacted the revision of the listing while it was read")
            }
            ListError::Failed(e) => f.write_str(e),
        }
    }
}

/// A listing of every key from `start` (a directory) through the end of its prefix, read page
/// by page with [`PagedListing::next`].
pub(super) struct PagedListing {
    kv: KvClient,
    /// The listed directory: the keys' common prefix.
    dir: Vec<u8>,
    /// The next page's first key.
    start: Vec<u8>,
    /// The end of the range: the directory's prefix end.
    end: Vec<u8>,
    /// The width (in [`Position`]s) the next read covers.
    step: Position,
    /// Pinned by the first page's answer.
    revision: Option<i64>,
    cluster: u64,
    page_size: usize,
    /// Keys the next page asks for (`page_size` or fewer, see [`PAGE_BYTES`]).
    limit: usize,
    timeout: Duration,
    done: bool,
    /// Reads made (pages, and reads of ranges found empty), for the log line.
    pub(super) pages: u64,
}

impl PagedListing {
    pub(super) fn new(
        kv: KvClient,
        dir: &str,
        page_size: usize,
        timeout: Duration,
    ) -> PagedListing {
        let page_size = page_size.max(1);
        PagedListing {
            kv: kv.max_decoding_message_size(MAX_MESSAGE),
            dir: dir.as_bytes().to_vec(),
            start: dir.as_bytes().to_vec(),
            end: prefix_end(dir.as_bytes()),
            step: Position::first_step(),
            revision: None,
            cluster: 0,
            page_size,
            limit: page_size,
            timeout,
            done: false,
            pages: 0,
        }
    }

    /// Answers larger than `bytes` are refused by the client (for tests: the default is
    /// [`MAX_MESSAGE`]).
    #[cfg(test)]
    fn with_max_message(mut self, bytes: usize) -> PagedListing {
        self.kv = self.kv.max_decoding_message_size(bytes);
        self
    }

    /// The revision every page is read at (known after the first page).
    pub(super) fn revision(&self) -> Option<i64> {
        self.revision
    }

    /// The id of the cluster that answered the first page.
    pub(super) fn cluster(&self) -> u64 {
        self.cluster
    }

    /// The next page (never empty); `None` once the range is read.
    pub(super) async fn next(&mut self) -> Result<Option<ListPage>, ListError> {
        while !self.done {
            let until = self.read_until();
            let mut options = GetOptions::new()
                .with_range(until.clone())
                .with_limit(i64::try_from(self.limit).unwrap_or(i64::MAX));
            if let Some(revision) = self.revision {
                options = options.with_revision(revision);
            }
            let response = match self.call(self.start.clone(), options).await {
                Ok(response) => response,
                Err(Failure::TooLarge(_)) if self.limit > 1 => {
                    self.limit = (self.limit / 2).max(1);
                    continue;
                }
                Err(Failure::TooLarge(reason)) => {
                    return self.skip_one(until, reason).await.map(Some)
                }
                Err(Failure::Other(e)) => return Err(e),
            };
            if let Some(header) = response.header() {
                if self.revision.is_none() {
                    self.revision = Some(header.revision());
                    self.cluster = header.cluster_id();
                }
            }
            self.pages += 1;
            let kvs: Vec<KeyValue> = response.kvs().iter().map(kv_of).collect();
            let from = Position::of(&self.dir, &self.start);
            match kvs.last() {
                // The limit cut the read short: the next one covers about the span these
                // keys needed.
                Some(last) if response.more() => {
                    let span = Position::of(&self.dir, last.key.as_bytes()).minus(&from);
                    self.step = span.at_least_one();
                    self.start = key_after(last.key.as_bytes());
                }
                _ => {
                    // The whole range read: wider next time if it held few keys.
                    self.step = self.step.widened(kvs.len(), self.limit);
                    self.done = until == self.end;
                    self.start = until;
                }
            }
            let bytes: usize = kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
            if let Some(average) = bytes.checked_div(kvs.len()) {
                self.limit = (PAGE_BYTES / average.max(1)).clamp(1, self.page_size);
            }
            if !kvs.is_empty() {
                return Ok(Some(ListPage::Kvs(kvs)));
            }
        }
        Ok(None)
    }

    /// The end of the next read: `step` positions after its start, within the directory.
    fn read_until(&self) -> Vec<u8> {
        let Some(to) = Position::of(&self.dir, &self.start).plus(&self.step) else {
            return self.end.clone();
        };
        let mut until = self.dir.clone();
        until.extend_from_slice(to.trimmed());
        // A start longer than a position's bytes shares its position with shorter keys; the
        // end must still come after it.
        if until <= self.start || until >= self.end {
            self.end.clone()
        } else {
            until
        }
    }

    /// The next key alone is too large to read: its name (keys only), reported and skipped.
    async fn skip_one(&mut self, until: Vec<u8>, reason: String) -> Result<ListPage, ListError> {
        let mut options = GetOptions::new()
            .with_range(until.clone())
            .with_limit(1)
            .with_keys_only();
        if let Some(revision) = self.revision {
            options = options.with_revision(revision);
        }
        let response = match self.call(self.start.clone(), options).await {
            Ok(response) => response,
            Err(Failure::TooLarge(e)) => return Err(ListError::Failed(e)),
            Err(Failure::Other(e)) => return Err(e),
        };
        if self.revision.is_none() {
            if let Some(header) = response.header() {
                self.revision = Some(header.revision());
                self.cluster = header.cluster_id();
            }
        }
        self.pages += 1;
        let Some(kv) = response.kvs().first() else {
            // The key went away between the two reads (only possible before the revision
            // was pinned): nothing left to skip in this range.
            self.done = until == self.end;
            self.start = until;
            return Ok(ListPage::Kvs(Vec::new()));
        };
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        self.start = key_after(kv.key());
        Ok(ListPage::TooLarge {
            key,
            reason: format!("stored value too large to read: {reason}"),
        })
    }

    async fn call(
        &mut self,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, Failure> {
        match tokio::time::timeout(self.timeout, self.kv.get(key, Some(options))).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(etcd_client::Error::GRpcStatus(status)))
                if status.message().contains(COMPACTED) =>
            {
                Err(Failure::Other(ListError::Compacted))
            }
            // gRPC OUT_OF_RANGE (11) from tonic itself: the answer is over the decoding limit.
            Ok(Err(etcd_client::Error::GRpcStatus(status)))
                if status.code() as i32 == 11 && status.message().contains("too large") =>
            {
                Err(Failure::TooLarge(status.message().to_owned()))
            }
            Ok(Err(e)) => Err(Failure::Other(ListError::Failed(e.to_string()))),
            Err(_) => Err(Failure::Other(ListError::Failed(format!(
                "listing timed out after {}s",
                self.timeout.as_secs()
            )))),
        }
    }
}

enum Failure {
    /// The answer was over the client's message limit.
    TooLarge(String),
    Other(ListError),
}

/// Bytes of a key past the directory that its [`Position`] tells apart: APISIX's keys are
/// far shorter (`routes/00000000000000000042`).
const POSITION_BYTES: usize = 64;

/// Where a key lies below the listed directory, as a number: its first [`POSITION_BYTES`]
/// bytes past the directory, zero-padded, big endian. Key order is position order (longer keys
/// share the position of their first bytes), so a key range can be sized by subtraction.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position([u8; POSITION_BYTES]);

impl Position {
    fn of(dir: &[u8], key: &[u8]) -> Position {
        let rest = key.get(dir.len()..).unwrap_or_default();
        let mut bytes = [0u8; POSITION_BYTES];
        let n = rest.len().min(POSITION_BYTES);
        bytes[..n].copy_from_slice(&rest[..n]);
        Position(bytes)
    }

    /// The first read's width: one unit of the fourth byte past the directory, widened
    /// quickly while reads come back empty (see [`Position::widened`]).
    fn first_step() -> Position {
        let mut bytes = [0u8; POSITION_BYTES];
        bytes[3] = 1;
        Position(bytes)
    }

    /// `self + other`; `None` past the last position.
    fn plus(&self, other: &Position) -> Option<Position> {
        let mut out = [0u8; POSITION_BYTES];
        let mut carry = 0u16;
        for i in (0..POSITION_BYTES).rev() {
            let sum = u16::from(self.0[i]) + u16::from(other.0[i]) + carry;
            out[i] = (sum & 0xff) as u8;
            carry = sum >> 8;
        }
        (carry == 0).then_some(Position(out))
    }

    /// `self - other`, zero when `other` is larger.
    fn minus(&self, other: &Position) -> Position {
        if self.0 <= other.0 {
            return Position([0; POSITION_BYTES]);
        }
        let mut out = [0u8; POSITION_BYTES];
        let mut borrow = 0i16;
        for i in (0..POSITION_BYTES).rev() {
            let mut diff = i16::from(self.0[i]) - i16::from(other.0[i]) - borrow;
            borrow = i16::from(diff < 0);
            if diff < 0 {
                diff += 256;
            }
            out[i] = diff as u8;
        }
        Position(out)
    }

    /// At least the smallest step, so a read always moves on.
    fn at_least_one(self) -> Position {
        if self.0.iter().any(|b| *b != 0) {
            return self;
        }
        let mut bytes = [0u8; POSITION_BYTES];
        bytes[POSITION_BYTES - 1] = 1;
        Position(bytes)
    }

    /// The next read's width after a read of `self` that held all of its `keys` (fewer than
    /// `limit`, or as many): grown toward `limit` keys by a power of two, at most 16-fold (an
    /// empty range says little of the next one), never narrower; the widest past the end.
    fn widened(&self, keys: usize, limit: usize) -> Position {
        let factor = limit.checked_div(keys).map_or(16, |f| f.clamp(1, 16));
        // The largest power of two not above the factor.
        let shift = usize::BITS - 1 - factor.leading_zeros();
        let mut out = [0u8; POSITION_BYTES];
        let mut carry = 0u16;
        for i in (0..POSITION_BYTES).rev() {
            let wide = (u16::from(self.0[i]) << shift) | carry;
            out[i] = (wide & 0xff) as u8;
            carry = wide >> 8;
        }
        if carry != 0 {
            return Position([0xff; POSITION_BYTES]);
        }
        Position(out)
    }

    /// The bytes without trailing zeros: as a range end, `a` and `a\0` bound the same keys
    /// once the next range starts where this one ends.
    fn trimmed(&self) -> &[u8] {
        let len = self.0.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        &self.0[..len]
    }
}

/// The first key after every key that starts with `prefix` (etcd's prefix range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the keyspace.
    vec![0]
}

/// The smallest key after `key`.
fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/apisix/"), b"/apisix0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(
            key_after(b"/apisix/routes/1"),
            b"/apisix/routes/1\0".to_vec()
        );
    }

    use crate::test_support::etcd::Etcd;

    /// Every page of a listing of `dir`, read with `page_size` and a client limit of
    /// `max_message` bytes; `hook` runs after each page (with the pages read so far).
    fn read_all(
        etcd: &Etcd,
        dir: &str,
        page_size: usize,
        max_message: usize,
        mut hook: impl FnMut(u64) + Send,
    ) -> (Vec<ListPage>, Result<i64, ListError>, u64) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let client = etcd_client::Client::connect([etcd.endpoint()], None)
                .await
                .unwrap();
            let mut listing =
                PagedListing::new(client.kv_client(), dir, page_size, Duration::from_secs(5))
                    .with_max_message(max_message);
            let mut pages = Vec::new();
            loop {
                match listing.next().await {
                    Ok(Some(page)) => {
                        pages.push(page);
                        // On a thread of its own: the hook's blocking client runs a runtime.
                        let read = pages.len() as u64;
                        std::thread::scope(|s| s.spawn(|| hook(read)).join().unwrap());
                    }
                    Ok(None) => return (pages, Ok(listing.revision().unwrap()), listing.pages),
                    Err(e) => return (pages, Err(e), listing.pages),
                }
            }
        })
    }

    fn keys(pages: &[ListPage]) -> Vec<String> {
        pages
            .iter()
            .flat_map(|p| match p {
                ListPage::Kvs(kvs) => kvs.iter().map(|kv| kv.key.clone()).collect(),
                ListPage::TooLarge { key, .. } => vec![format!("too large: {key}")],
            })
            .collect()
    }

    #[test]
    fn pages_form_one_snapshot_at_the_first_pages_revision() {
        let etcd = Etcd::start();
        let kv = etcd.kv();
        for i in 0..25 {
            kv.put(&format!("/apisix/routes/{i:02}"), "{}");
        }
        // Outside the directory: never listed.
        kv.put("/apisix0", "{}");
        kv.put("/apisi", "{}");
        let before = kv.revision();
        let mut written = false;
        let (pages, revision, read) = read_all(&etcd, "/apisix/", 4, MAX_MESSAGE, |pages| {
            // Writes between the pages are after the pinned revision: not seen.
            if pages == 2 && !written {
                kv.put("/apisix/routes/99", "{}");
                kv.delete("/apisix/routes/20");
                written = true;
            }
        });
        assert_eq!(revision, Ok(before));
        let want: Vec<String> = (0..25).map(|i| format!("/apisix/routes/{i:02}")).collect();
        assert_eq!(keys(&pages), want);
        assert!(read >= 7, "25 keys in reads of at most 4: {read}");
        for page in &pages {
            let ListPage::Kvs(kvs) = page else {
                unreachable!()
            };
            assert!(!kvs.is_empty() && kvs.len() <= 4, "{}", kvs.len());
        }
    }

    #[test]
    fn a_compacted_revision_is_reported_not_retried() {
        let etcd = Etcd::start();
        let kv = etcd.kv();
        for i in 0..10 {
            kv.put(&format!("/apisix/routes/{i}"), "{}");
        }
        let (pages, result, _) = read_all(&etcd, "/apisix/", 3, MAX_MESSAGE, |pages| {
            if pages == 1 {
                let newest = kv.put("/apisix/other", "{}");
                kv.compact(newest);
            }
        });
        assert_eq!(result, Err(ListError::Compacted));
        assert_eq!(pages.len(), 1, "the first page only");
    }

    #[test]
    fn large_values_shrink_the_pages_and_one_too_large_alone_is_skipped() {
        let etcd = Etcd::start();
        let kv = etcd.kv();
        let value = |n: usize| format!(r#"{{"desc":"{}"}}"#, "x".repeat(n));
        for i in 0..12 {
            kv.put(&format!("/apisix/routes/{i:02}"), value(900));
        }
        // Alone over the client's limit below, between the others.
        kv.put("/apisix/routes/05b", value(8000));
        let (pages, result, _) = read_all(&etcd, "/apisix/", 10, 4000, |_| {});
        assert!(result.is_ok(), "{result:?}");
        let mut want: Vec<String> = (0..12).map(|i| format!("/apisix/routes/{i:02}")).collect();
        want.insert(6, "too large: /apisix/routes/05b".into());
        assert_eq!(keys(&pages), want);
        let Some(ListPage::TooLarge { reason, .. }) = pages
            .iter()
            .find(|p| matches!(p, ListPage::TooLarge { .. }))
        else {
            unreachable!()
        };
        assert!(reason.contains("too large"), "{reason}");
        for page in &pages {
            if let ListPage::Kvs(kvs) = page {
                let bytes: usize = kvs.iter().map(|kv| kv.value.len()).sum();
                assert!(bytes < 4000, "{bytes}");
            }
        }
    }

    fn pos(key: &str) -> Position {
        Position::of(b"/a/", key.as_bytes())
    }

    #[test]
    fn positions_keep_key_order_and_add_up() {
        let keys = [
            "/a/",
            "/a/r",
            "/a/routes/1",
            "/a/routes/10",
            "/a/routes/2",
            "/a/s",
        ];
        for w in keys.windows(2) {
            assert!(pos(w[0]).0 < pos(w[1]).0, "{w:?}");
        }
        let span = pos("/a/routes/2").minus(&pos("/a/routes/1"));
        assert_eq!(pos("/a/routes/1").plus(&span), Some(pos("/a/routes/2")));
        assert_eq!(pos("/a/routes/1").minus(&pos("/a/routes/2")), pos("/a/"));
        assert_eq!(pos("/a/").at_least_one().trimmed().len(), POSITION_BYTES);
        assert_eq!(pos("/a/routes/1").trimmed(), b"routes/1");
        let max = Position([0xff; POSITION_BYTES]);
        assert_eq!(max.plus(&pos("/a/").at_least_one()), None);
        // Widened by a power of two toward the limit, at most 16-fold, saturating.
        let step = Position::first_step();
        assert_eq!(
            (step.widened(0, 100).0[2], step.widened(0, 100).0[3]),
            (0, 16)
        );
        assert_eq!(step.widened(30, 100).0[3], 2, "100 / 30 keys: doubled");
        assert_eq!(step.widened(100, 100), step);
        assert_eq!(max.widened(1, 100), max);
    }

    /// Keys that share their first bytes far past the directory (APISIX's generated ids are
    /// 20 digits), sparse and dense regions, and several directories: every key once, in
    /// order, in pages of at most the page size.
    #[test]
    fn ranges_sized_from_key_spans_cover_every_key_once() {
        let etcd = Etcd::start();
        let kv = etcd.kv();
        let mut want = Vec::new();
        for i in 0..150 {
            want.push(format!("/apisix/routes/{i:020}"));
        }
        for i in 0..20 {
            want.push(format!("/apisix/consumers/user{i}"));
            want.push(format!("/apisix/upstreams/{}", i * 7919));
        }
        want.push("/apisix/ssls/\u{7f}".to_string());
        want.push("/apisix/\u{1}".to_string());
        for key in &want {
            kv.put(key, "{}");
        }
        want.sort();
        let (pages, result, _) = read_all(&etcd, "/apisix/", 16, MAX_MESSAGE, |_| {});
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(keys(&pages), want);
        for page in &pages {
            let ListPage::Kvs(kvs) = page else {
                unreachable!()
            };
            assert!(!kvs.is_empty() && kvs.len() <= 16, "{}", kvs.len());
        }
    }

    #[test]
    fn errors_read_as_the_caller_logs_them() {
        assert!(ListError::Compacted.to_string().contains("compacted"));
        assert_eq!(ListError::Failed("x".into()).to_string(), "x");
    }
}
