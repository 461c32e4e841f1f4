//! The local copy of the last configuration applied from etcd, kept on disk so that the store
//! can boot from it when etcd cannot be reached at start (the parent module's **Local copy**),
//! and the task that writes it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::state::{ConfigState, StoredItem};
use crate::store::KeyValue;

/// What the local-copy file says it is.
const COPY_FORMAT: &str = "ferrisix-etcd-local-copy/1";

/// The local copy of the last configuration applied from etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub prefix: String,
    pub revision: i64,
    /// Resource keys in key order, values as JSON text.
    pub kvs: Vec<KeyValue>,
}

#[derive(Serialize, Deserialize)]
struct CopyFile {
    format: String,
    prefix: String,
    revision: i64,
    items: Vec<CopyItem>,
}

#[derive(Serialize, Deserialize)]
struct CopyItem {
    key: String,
    create_revision: i64,
    mod_revision: i64,
    value: Value,
}

impl LocalCopy {
    /// The resources of `state` (the only keys the data plane uses; they are JSON).
    pub fn from_state(prefix: &str, state: &ConfigState) -> LocalCopy {
        let kvs = keyed_items(prefix, state)
            .into_iter()
            .map(|(key, item)| KeyValue {
                key,
                value: item.value.text().as_bytes().to_vec(),
                create_revision: item.create_revision,
                mod_revision: item.mod_revision,
            })
            .collect();
        LocalCopy {
            prefix: prefix.to_owned(),
            revision: state.revision,
            kvs,
        }
    }

    pub fn read(path: &Path) -> Result<LocalCopy, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: CopyFile = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not a local copy: {e}", path.display()))?;
        if file.format != COPY_FORMAT {
            return Err(format!(
                "{} has format {:?}, not {COPY_FORMAT:?}",
                path.display(),
                file.format
            ));
        }
        let kvs = file
            .items
            .into_iter()
            .map(|i| KeyValue {
                value: serde_json::to_vec(&i.value).unwrap_or_default(),
                key: i.key,
                create_revision: i.create_revision,
                mod_revision: i.mod_revision,
            })
            .collect();
        Ok(LocalCopy {
            prefix: file.prefix,
            revision: file.revision,
            kvs,
        })
    }

    /// Writes the copy atomically: a reader (or a crash) sees the old file or the new one.
    /// A value that is not JSON is refused (the file holds values as JSON).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let mut items = Vec::with_capacity(self.kvs.len());
        for kv in &self.kvs {
            serde_json::from_slice::<serde::de::IgnoredAny>(&kv.value)?;
            let text = std::str::from_utf8(&kv.value).map_err(invalid)?;
            items.push((kv.key.as_str(), kv.create_revision, kv.mod_revision, text));
        }
        write_copy_file(path, &self.prefix, self.revision, items.into_iter())
    }

    /// [`LocalCopy::from_state`] written, without the copy: keys are formatted and sorted,
    /// the values streamed as the state holds them (JSON text, checked when stored). At
    /// 100,000 routes the copy and a parse of every value took ~170 MB and most of a core
    /// per write.
    pub fn write_state(prefix: &str, state: &ConfigState, path: &Path) -> std::io::Result<()> {
        let items = keyed_items(prefix, state);
        let items = items.iter().map(|(key, item)| {
            let text = item.value.text();
            (key.as_str(), item.create_revision, item.mod_revision, text)
        });
        write_copy_file(path, prefix, state.revision, items)
    }
}

/// The resources of `state` with their etcd keys, in key order.
fn keyed_items<'s>(prefix: &str, state: &'s ConfigState) -> Vec<(String, &'s StoredItem)> {
    let mut items: Vec<(String, &StoredItem)> = state
        .resources
        .iter()
        .flat_map(|(kind, items)| {
            items
                .values()
                .map(move |item| (format!("{prefix}/{}/{}", kind.dir(), item.id), item))
        })
        .collect();
    items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    items
}

/// Streams a [`CopyFile`] (key, create and mod revision, value as JSON text, per item) to a
/// temporary file, syncs it and renames it over `path`.
fn write_copy_file<'a>(
    path: &Path,
    prefix: &str,
    revision: i64,
    items: impl Iterator<Item = (&'a str, i64, i64, &'a str)>,
) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
    // The fields in `CopyFile`'s and `CopyItem`'s order.
    out.write_all(b"{\"format\":")?;
    serde_json::to_writer(&mut out, COPY_FORMAT)?;
    out.write_all(b",\"prefix\":")?;
    serde_json::to_writer(&mut out, prefix)?;
    write!(out, ",\"revision\":{revision},\"items\":[")?;
    for (i, (key, create_revision, mod_revision, value)) in items.enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"{\"key\":")?;
        serde_json::to_writer(&mut out, key)?;
        write!(
            out,
            ",\"create_revision\":{create_revision},\"mod_revision\":{mod_revision},\"value\":"
        )?;
        out.write_all(value.as_bytes())?;
        out.write_all(b"}")?;
    }
    out.write_all(b"]}")?;
    let out = out.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()?;
    drop(out);
    std::fs::rename(&tmp, path)?;
    // Make the rename itself durable; not every platform can sync a directory.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// At most one local-copy write per this long, and per [`COPY_SPACING`] times the last
/// write's duration: under a steady stream of changes a large configuration is not rewritten
/// (and synced) for each one, and the writer takes at most a twentieth of a core and of the
/// disk (at 100,000 routes a write is a 30 MB file). The copy lags etcd by at most that much;
/// the last state of a burst is always written.
const COPY_INTERVAL: Duration = Duration::from_secs(1);
const COPY_SPACING: u32 = 20;

/// Writes each state published from etcd to the local copy, coalescing bursts (the channel
/// keeps only the latest; see [`COPY_INTERVAL`]). Ends once the store is gone and the last
/// state is written.
pub(super) async fn copy_writer(
    path: PathBuf,
    prefix: String,
    mut states: watch::Receiver<Option<Arc<ConfigState>>>,
) {
    while states.changed().await.is_ok() {
        let Some(state) = states.borrow_and_update().clone() else {
            continue;
        };
        let (target, prefix) = (path.clone(), prefix.clone());
        let started = Instant::now();
        let result =
            tokio::task::spawn_blocking(move || LocalCopy::write_state(&prefix, &state, &target))
                .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), "cannot write the local copy: {e}")
            }
            Err(e) => tracing::warn!("local copy writer failed: {e}"),
        }
        tokio::time::sleep(COPY_INTERVAL.max(started.elapsed() * COPY_SPACING)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{kv, StateBuilder};

    #[test]
    fn local_copy_round_trips() {
        let mut b = StateBuilder::new("/apisix");
        b.reset(
            &[
                kv("/apisix/routes/2", r#"{"uri":"/2"}"#, 3),
                kv("/apisix/upstreams/u", r#"{"nodes":{}}"#, 4),
                kv("/apisix/gen_id", "1", 5),
                kv("/apisix/routes/bad", "not json", 6),
            ],
            7,
        );
        let copy = LocalCopy::from_state("/apisix", b.state());
        let keys: Vec<_> = copy.kvs.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, ["/apisix/routes/2", "/apisix/upstreams/u"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/copy.json");
        copy.write(&path).unwrap();
        assert_eq!(LocalCopy::read(&path).unwrap(), copy);
        // Written straight from the state: the same file, byte for byte.
        let direct = dir.path().join("direct.json");
        LocalCopy::write_state("/apisix", b.state(), &direct).unwrap();
        assert_eq!(
            std::fs::read(&direct).unwrap(),
            std::fs::read(&path).unwrap()
        );
        // A copy whose value is not JSON is refused, and the file it would replace kept.
        let mut broken = copy.clone();
        broken.kvs[0].value = b"{\"uri\":".to_vec();
        assert!(broken.write(&path).is_err());
        assert_eq!(LocalCopy::read(&path).unwrap(), copy);
        let mut again = StateBuilder::new("/apisix");
        again.reset(&copy.kvs, copy.revision);
        // The copy keeps what was served; unreadable keys are reported, not copied.
        assert_eq!(again.state().resources, b.state().resources);
        assert_eq!(again.state().revision, b.state().revision);
        assert!(again.state().unreadable.is_empty());

        std::fs::write(&path, "{}").unwrap();
        assert!(LocalCopy::read(&path).is_err());
    }
}
