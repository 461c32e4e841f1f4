//! The disk strategy's zones, as nginx's `proxy_cache_path` that APISIX configures for them:
//! one file per cache key under `disk_path`, named by the MD5 of the key in hex and placed in
//! `cache_levels` directories taken from the end of that name (`1:2` puts
//! `b7f54b2df7773722d382f4809d65029c` in `c/29/`), the total bounded by `disk_size` and the
//! number of keys by `memory_size` (nginx's `keys_zone`: about 8,000 keys a megabyte), the
//! least recently used evicted first.
//!
//! A file is written whole to a temporary name in `disk_path` and renamed into place, and
//! carries a checksum of its content: a crash mid-write leaves a temporary file (removed when
//! the zone is next loaded) or nothing, never a partial entry, and a damaged file is found by
//! its checksum, deleted and treated as missing. The index of files is rebuilt from the
//! directory when the zone is made (in the background: until it is done, a key the index does
//! not know yet is looked for on disk), so entries survive a restart.
//!
//! Answers with `Vary` are kept as nginx keeps them: the key's file holds the answer with the
//! `Vary` text and its variant, the MD5 of the key's MD5 and the request's values of the named
//! headers (`Accept-Charset`, `Accept-Encoding` and `Accept-Language` with their spaces
//! normalized). A request whose variant differs looks for a second file named by its variant;
//! a fetch made after that second look is stored there when the answer's variant is that
//! name, else in the key's file. A purge deletes the key's file only, as APISIX's does.
//!
//! Files are read and written on the worker that serves the request, as nginx does without
//! `aio`: a stored answer is read from the page cache in one call.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use md5::{Digest, Md5};

use super::lru::Lru;
use super::memory::Lookup;
use super::stored::{StaleWindows, Stored};

/// The layout written; files of the first layout (no `Vary`, no stale windows) are still read.
const MAGIC: &[u8; 8] = b"FXPCACH2";
const MAGIC_V1: &[u8; 8] = b"FXPCACH1";
/// nginx's estimate of a key's share of `keys_zone`.
const BYTES_PER_KEY: u64 = 128;

/// What the index knows of one file: that it is there (its size is its weight); its times
/// are read from the file, which a lookup reads anyway (an expired answer may still serve).
#[derive(Clone, Copy, Debug)]
struct Meta;

/// One disk zone.
pub struct DiskZone {
    root: PathBuf,
    levels: Vec<u8>,
    max_size: u64,
    max_keys: usize,
    index: Mutex<Lru<[u8; 16], Meta>>,
    /// The directory was read into the index.
    loaded: AtomicBool,
    /// Temporary file names.
    next_tmp: AtomicU64,
}

impl std::fmt::Debug for DiskZone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiskZone({})", self.root.display())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hex(md5: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in md5 {
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 15), 16).unwrap_or('0'));
    }
    s
}

fn unhex(name: &str) -> Option<[u8; 16]> {
    if name.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn md5_of(key: &str) -> [u8; 16] {
    Md5::digest(key.as_bytes()).into()
}

/// nginx's variant of a request for an answer's `Vary` (`ngx_http_file_cache_vary`): the MD5
/// of the key's MD5 and, for each name in `Vary` (lower-cased, split at spaces and commas),
/// the name, `:`, the request's values of that header joined by `,` (for `Accept-Charset`,
/// `Accept-Encoding` and `Accept-Language` each value's items, spaces dropped), and CRLF.
pub fn variant(main: &[u8; 16], vary: &str, request: &HeaderMap) -> [u8; 16] {
    let mut md5 = Md5::new();
    md5.update(main);
    let lower = vary.to_ascii_lowercase();
    for name in lower.split([' ', ',']).filter(|n| !n.is_empty()) {
        md5.update(name.as_bytes());
        md5.update(b":");
        let normalize = matches!(
            name,
            "accept-charset" | "accept-encoding" | "accept-language"
        );
        let mut multiple = false;
        for value in request.get_all(name).iter() {
            if !normalize {
                if multiple {
                    md5.update(b",");
                }
                md5.update(value.as_bytes());
                multiple = true;
                continue;
            }
            for item in value
                .as_bytes()
                .split(|b| *b == b' ' || *b == b',')
                .filter(|i| !i.is_empty())
            {
                if multiple {
                    md5.update(b",");
                }
                md5.update(item);
                multiple = true;
            }
        }
        md5.update(b"\r\n");
    }
    md5.finalize().into()
}

/// One file's content.
struct File {
    stored: Stored,
    vary: Option<String>,
    variant: [u8; 16],
}

impl DiskZone {
    /// A zone over `root`; its index is not loaded yet ([`DiskZone::load`]).
    pub fn new(root: &Path, levels: Vec<u8>, disk_size: Option<u64>, memory_size: u64) -> DiskZone {
        DiskZone {
            root: root.to_path_buf(),
            levels,
            max_size: disk_size.unwrap_or(u64::MAX),
            max_keys: usize::try_from((memory_size / BYTES_PER_KEY).max(1)).unwrap_or(usize::MAX),
            index: Mutex::new(Lru::default()),
            loaded: AtomicBool::new(false),
            next_tmp: AtomicU64::new(0),
        }
    }

    /// nginx's file name for a key's MD5: the levels' directories from the end of the hex.
    pub fn path_of(&self, md5: &[u8; 16]) -> PathBuf {
        let name = hex(md5);
        let mut path = self.root.clone();
        let mut end = name.len();
        for &l in &self.levels {
            let l = usize::from(l);
            path.push(&name[end - l..end]);
            end -= l;
        }
        path.push(&name);
        path
    }

    /// Reads the directory into the index (nginx's cache loader): every entry file that reads
    /// back whole, with its time; temporary and damaged files are removed.
    pub fn load(&self) {
        let mut found = Vec::new();
        scan(&self.root, 0, self.levels.len(), &mut found);
        for (md5, path) in found {
            match read_head(&path) {
                Some(size) => {
                    let mut index = lock(&self.index);
                    if index.peek(&md5).is_none() {
                        index.insert(md5, Meta, usize::try_from(size).unwrap_or(usize::MAX));
                    }
                }
                None => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        self.loaded.store(true, Ordering::Release);
        self.evict();
    }

    /// The answer for a request under `key`, and the name of the second file looked in when
    /// the key's file varies on headers whose values the request does not share (where the
    /// answer fetched for it may be stored: [`DiskZone::target`]).
    pub fn lookup(
        &self,
        key: &str,
        request: &HeaderMap,
        now_ms: u64,
    ) -> (Lookup, Option<[u8; 16]>) {
        let main = md5_of(key);
        let Some(file) = self.read(&main, key) else {
            return (Lookup::Missing, None);
        };
        let Some(vary) = &file.vary else {
            return (found(file.stored, now_ms), None);
        };
        let mine = variant(&main, vary, request);
        if mine == file.variant {
            return (found(file.stored, now_ms), None);
        }
        match self.read(&mine, key) {
            // A second file answers only a request of its own variant.
            Some(f)
                if f.vary
                    .as_deref()
                    .is_none_or(|v| variant(&main, v, request) == f.variant) =>
            {
                (found(f.stored, now_ms), Some(mine))
            }
            _ => (Lookup::Missing, Some(mine)),
        }
    }

    /// Where an answer fetched after a lookup goes (`ngx_http_file_cache_update_variant`): the
    /// second file looked in when the answer's variant is its name, else the key's file; and
    /// the answer's variant, when it varies.
    pub fn target(
        key: &str,
        looked: Option<[u8; 16]>,
        vary: Option<&str>,
        request: &HeaderMap,
    ) -> ([u8; 16], [u8; 16]) {
        let main = md5_of(key);
        let mine = vary.map_or([0; 16], |v| variant(&main, v, request));
        match looked {
            Some(second) if vary.is_some() && mine == second => (second, mine),
            _ => (main, mine),
        }
    }

    /// The file named `md5` when it holds `key` whole; a damaged one is removed.
    fn read(&self, md5: &[u8; 16], key: &str) -> Option<File> {
        let known = lock(&self.index).get(md5).copied();
        if known.is_none() && self.loaded.load(Ordering::Acquire) {
            return None;
        }
        let path = self.path_of(md5);
        let Ok(bytes) = fs::read(&path) else {
            lock(&self.index).remove(md5);
            return None;
        };
        match decode(&bytes) {
            Some((k, file)) if k == key.as_bytes() => {
                if known.is_none() {
                    lock(&self.index).insert(*md5, Meta, bytes.len());
                }
                Some(file)
            }
            // Another key with the same MD5 owns the file: this key has nothing stored.
            Some(_) => None,
            None => {
                tracing::warn!(path = %path.display(), "proxy-cache: damaged cache file removed");
                lock(&self.index).remove(md5);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Deletes the file of `key`; whether there was one (APISIX's disk purge: 200 or 404).
    pub fn purge(&self, key: &str) -> bool {
        self.remove(&md5_of(key))
    }

    fn remove(&self, md5: &[u8; 16]) -> bool {
        lock(&self.index).remove(md5);
        fs::remove_file(self.path_of(md5)).is_ok()
    }

    /// Stores an answer, replacing the key's file; evicts the least recently used files past
    /// the zone's bounds. A failure (a full disk) is logged and leaves nothing stored.
    #[cfg(test)]
    pub fn set(&self, key: &str, stored: &Stored) {
        self.set_at(md5_of(key), key, stored, None, [0; 16]);
    }

    /// Stores an answer in the file named `md5` ([`DiskZone::target`]), with the `Vary` text
    /// and variant it was stored for.
    pub fn set_at(
        &self,
        md5: [u8; 16],
        key: &str,
        stored: &Stored,
        vary: Option<&str>,
        variant: [u8; 16],
    ) {
        let data = encode(key, stored, vary, &variant);
        let size = data.len() as u64;
        if size > self.max_size {
            self.remove(&md5);
            return;
        }
        let path = self.path_of(&md5);
        match self.write(&path, &data) {
            Ok(()) => {
                lock(&self.index).insert(md5, Meta, data.len());
                self.evict();
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "proxy-cache: answer not stored");
                self.remove(&md5);
            }
        }
    }

    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = self.root.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            drop(f);
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn evict(&self) {
        loop {
            let victim = {
                let mut index = lock(&self.index);
                if (index.weight() as u64) <= self.max_size && index.len() <= self.max_keys {
                    return;
                }
                match index.pop_lru() {
                    Some((md5, _, _)) => md5,
                    None => return,
                }
            };
            let _ = fs::remove_file(self.path_of(&victim));
        }
    }

    #[cfg(test)]
    pub fn get(&self, key: &str, now_ms: u64) -> Lookup {
        self.lookup(key, &HeaderMap::new(), now_ms).0
    }

    /// The number of files the index knows and their bytes.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        let index = lock(&self.index);
        (index.len(), index.weight())
    }
}

/// Finds the entry files under `dir` (`depth` levels down of `levels`), removing temporary
/// files left by a write that never finished.
fn scan(dir: &Path, depth: usize, levels: usize, out: &mut Vec<([u8; 16], PathBuf)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = e.file_type() else { continue };
        if name.starts_with(".tmp-") {
            let _ = fs::remove_file(&path);
        } else if kind.is_dir() && depth < levels {
            scan(&path, depth + 1, levels, out);
        } else if kind.is_file() && depth == levels {
            if let Some(md5) = unhex(&name) {
                out.push((md5, path));
            }
        }
    }
}

/// A lookup's answer from a file's.
fn found(stored: Stored, now_ms: u64) -> Lookup {
    if stored.expires_ms <= now_ms {
        Lookup::Expired(Some(Arc::new(stored)))
    } else {
        Lookup::Fresh(Arc::new(stored))
    }
}

/// The layout of a file: the magic, the expiry and store times, the status, the key, the
/// stale windows, the `Vary` text and variant, the headers, the body, then a CRC-32 of all
/// that.
fn encode(key: &str, s: &Stored, vary: Option<&str>, variant: &[u8; 16]) -> Vec<u8> {
    let headers: usize = s
        .headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum();
    let mut out = Vec::with_capacity(48 + key.len() + headers + s.body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&s.expires_ms.to_le_bytes());
    out.extend_from_slice(&s.stored_ms.to_le_bytes());
    out.extend_from_slice(&s.status.as_u16().to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&s.stale.updating_ms.to_le_bytes());
    out.extend_from_slice(&s.stale.error_ms.to_le_bytes());
    let vary = vary.unwrap_or_default();
    out.extend_from_slice(&(vary.len() as u16).to_le_bytes());
    out.extend_from_slice(vary.as_bytes());
    out.extend_from_slice(variant);
    out.extend_from_slice(&(s.headers.len() as u32).to_le_bytes());
    for (n, v) in &s.headers {
        out.extend_from_slice(&(n.as_str().len() as u16).to_le_bytes());
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out.extend_from_slice(&(s.body.len() as u64).to_le_bytes());
    out.extend_from_slice(&s.body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// The key and content of a whole file whose checksum holds.
fn decode(data: &[u8]) -> Option<(&[u8], File)> {
    let (content, crc) = data.split_at(data.len().checked_sub(4)?);
    if crc32fast::hash(content).to_le_bytes() != crc {
        return None;
    }
    let mut r = Reader(content);
    let v2 = match r.take(8)? {
        m if m == MAGIC => true,
        m if m == MAGIC_V1 => false,
        _ => return None,
    };
    let expires_ms = r.u64()?;
    let stored_ms = r.u64()?;
    let status = StatusCode::from_u16(r.u16()?).ok()?;
    let key_len = r.u32()? as usize;
    let key = r.take(key_len)?;
    let mut stale = StaleWindows::default();
    let mut vary = None;
    let mut variant = [0u8; 16];
    if v2 {
        stale.updating_ms = r.u64()?;
        stale.error_ms = r.u64()?;
        let n = r.u16()? as usize;
        let text = std::str::from_utf8(r.take(n)?).ok()?;
        vary = (!text.is_empty()).then(|| text.to_owned());
        variant.copy_from_slice(r.take(16)?);
    }
    let count = r.u32()? as usize;
    let mut headers = Vec::with_capacity(count.min(256));
    for _ in 0..count {
        let n = r.u16()? as usize;
        let name = HeaderName::from_bytes(r.take(n)?).ok()?;
        let n = r.u32()? as usize;
        let value = HeaderValue::from_bytes(r.take(n)?).ok()?;
        headers.push((name, value));
    }
    let body_len = usize::try_from(r.u64()?).ok()?;
    let body = Bytes::copy_from_slice(r.take(body_len)?);
    if !r.0.is_empty() {
        return None;
    }
    Some((
        key,
        File {
            stored: Stored {
                status,
                headers,
                body,
                stored_ms,
                expires_ms,
                stale,
            },
            vary,
            variant,
        },
    ))
}

/// A file's size, when it starts as an entry file does (the checksum is checked when it is
/// read for a request).
fn read_head(path: &Path) -> Option<u64> {
    let mut f = fs::File::open(path).ok()?;
    let size = f.metadata().ok()?.len();
    let mut head = [0u8; 16];
    f.read_exact(&mut head).ok()?;
    if &head[..8] != MAGIC && &head[..8] != MAGIC_V1 {
        return None;
    }
    Some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &str, expires_ms: u64) -> Stored {
        Stored {
            status: StatusCode::NOT_FOUND,
            headers: vec![(
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("text/plain"),
            )],
            body: Bytes::from(body.to_owned()),
            stored_ms: 5,
            expires_ms,
            stale: StaleWindows::default(),
        }
    }

    #[test]
    fn nginx_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let z = DiskZone::new(dir.path(), vec![1, 2], None, 1 << 20);
        // nginx's example: levels=1:2 puts this key's file in c/29/.
        let md5 = unhex("b7f54b2df7773722d382f4809d65029c").unwrap();
        assert_eq!(
            z.path_of(&md5),
            dir.path().join("c/29/b7f54b2df7773722d382f4809d65029c")
        );
        assert_eq!(hex(&md5_of("")), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn stores_reads_expires_purges_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let z = DiskZone::new(dir.path(), vec![1, 2], None, 1 << 20);
        z.load();
        assert!(matches!(z.get("k", 0), Lookup::Missing));
        z.set("k", &answer("hello", 1000));
        let Lookup::Fresh(s) = z.get("k", 10) else {
            panic!("stored")
        };
        assert_eq!(
            (s.status, &s.body[..], s.stored_ms),
            (StatusCode::NOT_FOUND, &b"hello"[..], 5)
        );
        assert_eq!(s.headers[0].1, "text/plain");
        assert!(matches!(z.get("k", 1000), Lookup::Expired(_)));
        // A new zone on the same directory (a restart) finds it.
        let again = DiskZone::new(dir.path(), vec![1, 2], None, 1 << 20);
        again.load();
        assert_eq!(again.usage().0, 1);
        assert!(matches!(again.get("k", 10), Lookup::Fresh(_)));
        assert!(again.purge("k"));
        assert!(!again.purge("k"));
        assert!(matches!(again.get("k", 10), Lookup::Missing));
    }

    #[test]
    fn a_damaged_or_unfinished_file_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let z = DiskZone::new(dir.path(), vec![2], None, 1 << 20);
        z.set("k", &answer("hello world", u64::MAX));
        let path = z.path_of(&md5_of("k"));
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 8] ^= 1;
        fs::write(&path, &bytes).unwrap();
        // A write that never finished: a temporary file.
        fs::write(dir.path().join(".tmp-1-1"), b"FXPCACH1partial").unwrap();
        let again = DiskZone::new(dir.path(), vec![2], None, 1 << 20);
        again.load();
        assert!(!dir.path().join(".tmp-1-1").exists());
        assert!(matches!(again.get("k", 0), Lookup::Missing));
        assert!(!path.exists(), "the damaged file is removed");
        // A truncated file.
        z.set("k", &answer("hello world", u64::MAX));
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let z2 = DiskZone::new(dir.path(), vec![2], None, 1 << 20);
        assert!(matches!(z2.get("k", 0), Lookup::Missing));
    }

    #[test]
    fn bounded_by_disk_size_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        let one = encode("k0", &answer("0123456789", u64::MAX), None, &[0; 16]).len() as u64;
        let z = DiskZone::new(dir.path(), vec![1], Some(one * 2), 1 << 20);
        z.load();
        for k in ["k0", "k1", "k2"] {
            z.set(k, &answer("0123456789", u64::MAX));
        }
        assert_eq!(z.usage().0, 2);
        assert!(matches!(z.get("k0", 0), Lookup::Missing), "the oldest went");
        assert!(!z.path_of(&md5_of("k0")).exists());
        // memory_size bounds the number of keys.
        let dir = tempfile::tempdir().unwrap();
        let z = DiskZone::new(dir.path(), vec![1], None, BYTES_PER_KEY * 2);
        z.load();
        for k in ["a", "b", "c"] {
            z.set(k, &answer("x", u64::MAX));
        }
        assert_eq!(z.usage().0, 2);
    }

    fn req(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn variants_as_nginx_names_and_finds_them() {
        let main = md5_of("k");
        // Spaces in Accept-Encoding are normalized, other headers are taken as sent.
        assert_eq!(
            variant(
                &main,
                "Accept-Encoding",
                &req(&[("accept-encoding", "gzip,  br")])
            ),
            variant(
                &main,
                "accept-encoding",
                &req(&[("accept-encoding", "gzip,br")])
            )
        );
        assert_ne!(
            variant(&main, "X-A", &req(&[("x-a", "1, 2")])),
            variant(&main, "X-A", &req(&[("x-a", "1,2")]))
        );
        let dir = tempfile::tempdir().unwrap();
        let z = DiskZone::new(dir.path(), vec![1, 2], None, 1 << 20);
        z.load();
        let a = req(&[("x-lang", "a")]);
        let b = req(&[("x-lang", "b")]);
        // The first answer goes to the key's file, with its variant.
        let (l, looked) = z.lookup("k", &a, 0);
        assert!(matches!(l, Lookup::Missing) && looked.is_none());
        let (file, v) = DiskZone::target("k", looked, Some("X-Lang"), &a);
        assert_eq!(file, main);
        z.set_at(file, "k", &answer("for a", 100), Some("X-Lang"), v);
        assert!(matches!(z.lookup("k", &a, 0).0, Lookup::Fresh(s) if s.body == "for a"));
        // Another variant misses, looks in its own file and is stored there.
        let (l, looked) = z.lookup("k", &b, 0);
        assert!(matches!(l, Lookup::Missing));
        let second = looked.expect("the second file looked in");
        let (file, v) = DiskZone::target("k", looked, Some("X-Lang"), &b);
        assert_eq!(file, second);
        z.set_at(file, "k", &answer("for b", 100), Some("X-Lang"), v);
        assert!(matches!(z.lookup("k", &b, 0).0, Lookup::Fresh(s) if s.body == "for b"));
        assert!(matches!(z.lookup("k", &a, 0).0, Lookup::Fresh(s) if s.body == "for a"));
        assert_eq!(z.usage().0, 2);
        // An answer without Vary fetched after the second look goes to the key's file.
        assert_eq!(DiskZone::target("k", Some(second), None, &b).0, main);
        // Expired answers come back for their stale windows; a restart keeps the variants.
        assert!(matches!(z.lookup("k", &b, 100).0, Lookup::Expired(Some(s)) if s.body == "for b"));
        let again = DiskZone::new(dir.path(), vec![1, 2], None, 1 << 20);
        again.load();
        assert!(matches!(again.lookup("k", &b, 0).0, Lookup::Fresh(s) if s.body == "for b"));
        // A purge deletes the key's file only (APISIX's disk purge).
        assert!(again.purge("k"));
        assert!(matches!(again.lookup("k", &a, 0).0, Lookup::Missing));
    }
}
