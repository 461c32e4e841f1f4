//! Saving generated admin keys into config.yaml, so the next start uses the same key (APISIX
//! 3.10+ writes a generated key back the same way).
//!
//! The file is edited as text, so its comments and layout survive, and the edit is then proved
//! by parsing both versions: the new document must equal the old one with exactly the generated
//! keys set, or nothing is written. Handled: the block style of the key list, its flow style
//! (`admin_key: [{name: admin, key: '', role: admin}]`), flow-style entries in a block list, an
//! entry without a `key` field, and a file without an `admin_key` list (the default entry is
//! added). Anything else (a flow-style `deployment` or `admin` mapping, a key set through
//! `${{VAR}}`) is refused with [`SaveError::Unsupported`], and the caller tells the operator
//! what to write.
//!
//! The file is replaced atomically: a temporary file in the same directory (created `0600`, so
//! the key is never readable by others in between) gets the old file's mode and owner, is
//! synced, and is renamed over it. A symlinked config.yaml keeps its link: the link's target is
//! what gets written.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

/// A key generated for entry `index` of `deployment.admin.admin_key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedKey {
    pub index: usize,
    pub name: String,
    pub key: String,
}

/// Why the keys were not saved. In either case the file is as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SaveError {
    /// The file's text could not be edited safely.
    Unsupported(String),
    /// Reading the file or replacing it failed.
    Io(String),
}

impl fmt::Display for SaveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaveError::Unsupported(why) | SaveError::Io(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SaveError {}

/// What to write by hand when saving failed: one line per key, naming its place.
pub fn what_to_write(keys: &[GeneratedKey]) -> String {
    keys.iter()
        .map(|k| {
            format!(
                "deployment.admin.admin_key[{}] (name: {}): key: {}",
                k.index, k.name, k.key
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Sets the generated `keys` in the config.yaml at `path` (or, when `path` is a symlink, in
/// its target). Returns the file written.
pub fn save_admin_keys(path: &Path, keys: &[GeneratedKey]) -> Result<PathBuf, SaveError> {
    let target =
        fs::canonicalize(path).map_err(|e| SaveError::Io(format!("{}: {e}", path.display())))?;
    let text = fs::read_to_string(&target)
        .map_err(|e| SaveError::Io(format!("{}: {e}", target.display())))?;
    let edited = set_admin_keys(&text, keys)?;
    replace_file(&target, edited.as_bytes())
        .map_err(|e| SaveError::Io(format!("{}: {e}", target.display())))?;
    Ok(target)
}

/// Creates a minimal config.yaml at `path` holding the generated keys, readable by its owner
/// only; refuses when a file is already there.
pub fn write_new_config(path: &Path, keys: &[GeneratedKey]) -> Result<PathBuf, SaveError> {
    let io = |e: std::io::Error| SaveError::Io(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io)?;
    }
    let mut text = String::from(
        "# Written by ferrisix at first start: the generated Admin API key.\n# Every other key keeps its default; see config/config.yaml in the repository.\ndeployment:\n  admin:\n",
    );
    text.push_str(&key_list(keys, "    "));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    Ok(path.to_path_buf())
}

/// The `admin_key:` list of `keys` at `indent`, as this module writes it.
fn key_list(keys: &[GeneratedKey], indent: &str) -> String {
    let mut out = format!("{indent}admin_key:\n");
    for k in keys {
        out.push_str(&format!(
            "{indent}  - name: {}\n{indent}    key: {}\n{indent}    role: admin\n",
            k.name, k.key
        ));
    }
    out
}

/// The edited text: `text` with `keys` set, proved equal to the intended document.
pub fn set_admin_keys(text: &str, keys: &[GeneratedKey]) -> Result<String, SaveError> {
    let unsupported = |why: &str| SaveError::Unsupported(why.to_owned());
    if keys.is_empty() {
        return Ok(text.to_owned());
    }
    let original: Value = serde_yaml::from_str(text)
        .map_err(|e| SaveError::Unsupported(format!("the file is not valid YAML: {e}")))?;
    let expected = intended(original, keys)?;
    let mut edits = plan_edits(text, keys)?;
    let mut edited = text.to_owned();
    edits.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    for (range, replacement) in edits {
        edited.replace_range(range, &replacement);
    }
    let reparsed: Value = serde_yaml::from_str(&edited)
        .map_err(|_| unsupported("the edited file would not be valid YAML"))?;
    if reparsed != expected {
        return Err(unsupported(
            "the file's layout could not be edited without changing other values",
        ));
    }
    Ok(edited)
}

/// The document as it must read after the edit.
fn intended(mut doc: Value, keys: &[GeneratedKey]) -> Result<Value, SaveError> {
    let unsupported = |why: &str| SaveError::Unsupported(why.to_owned());
    if doc.is_null() {
        doc = Value::Mapping(Mapping::new());
    }
    let root = doc
        .as_mapping_mut()
        .ok_or_else(|| unsupported("the file is not a mapping"))?;
    let deployment = child_mapping(root, "deployment")?;
    let admin = child_mapping(deployment, "admin")?;
    match admin.get_mut("admin_key") {
        Some(Value::Sequence(list)) => {
            for k in keys {
                let entry = list
                    .get_mut(k.index)
                    .and_then(Value::as_mapping_mut)
                    .ok_or_else(|| unsupported("an admin_key entry is not a mapping"))?;
                entry.insert("key".into(), Value::String(k.key.clone()));
            }
        }
        None | Some(Value::Null) => {
            // The default list: its entries are the keys generated for it.
            let list = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    if k.index != i {
                        return Err(unsupported("admin_key is not in the file"));
                    }
                    let mut entry = Mapping::new();
                    entry.insert("name".into(), Value::String(k.name.clone()));
                    entry.insert("key".into(), Value::String(k.key.clone()));
                    entry.insert("role".into(), Value::String("admin".into()));
                    Ok(Value::Mapping(entry))
                })
                .collect::<Result<Vec<_>, _>>()?;
            admin.insert("admin_key".into(), Value::Sequence(list));
        }
        Some(_) => return Err(unsupported("admin_key is not a list")),
    }
    Ok(doc)
}

fn child_mapping<'a>(parent: &'a mut Mapping, name: &str) -> Result<&'a mut Mapping, SaveError> {
    let slot = parent
        .entry(name.into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if slot.is_null() {
        *slot = Value::Mapping(Mapping::new());
    }
    slot.as_mapping_mut()
        .ok_or_else(|| SaveError::Unsupported(format!("{name} is not a mapping")))
}

type Edit = (Range<usize>, String);

/// One line of the text: where it starts, its indentation, and its content without the
/// newline.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    start: usize,
    indent: usize,
    text: &'a str,
}

impl Line<'_> {
    fn content(&self) -> &str {
        &self.text[self.indent..]
    }

    /// Holds something other than blanks and comments.
    fn is_content(&self) -> bool {
        let c = self.content().trim_end();
        !c.is_empty() && !c.starts_with('#')
    }

    fn end(&self) -> usize {
        self.start + self.text.len()
    }
}

fn lines(text: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    for raw in text.split_inclusive('\n') {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let indent = line.len() - line.trim_start_matches(' ').len();
        out.push(Line {
            start,
            indent,
            text: line,
        });
        start += raw.len();
    }
    out
}

/// `name: rest` at the start of `content`: the rest (after the colon), else `None`.
fn key_rest<'a>(content: &'a str, name: &str) -> Option<&'a str> {
    let rest = content.strip_prefix(name)?.strip_prefix(':')?;
    (rest.is_empty() || rest.starts_with([' ', '\t'])).then_some(rest)
}

/// A plain value with its trailing comment removed.
fn without_comment(rest: &str) -> &str {
    let cut = rest
        .char_indices()
        .find(|&(i, c)| c == '#' && (i == 0 || rest[..i].ends_with([' ', '\t'])))
        .map_or(rest.len(), |(i, _)| i);
    rest[..cut].trim()
}

fn is_empty_value(value: &str) -> bool {
    matches!(value, "" | "''" | "\"\"" | "~" | "null" | "Null" | "NULL")
}

/// Where a block mapping's key was found among `lines[from..to]` (the block of its parent).
enum Child {
    Found(usize),
    /// Absent; new children go at this indentation.
    Absent(usize),
}

fn find_child(lines: &[Line<'_>], block: Range<usize>, min_indent: usize, name: &str) -> Child {
    let indent = lines[block.clone()]
        .iter()
        .find(|l| l.is_content())
        .map_or(min_indent, |l| l.indent);
    for i in block {
        let l = &lines[i];
        if l.is_content() && l.indent == indent && key_rest(l.content(), name).is_some() {
            return Child::Found(i);
        }
    }
    Child::Absent(indent)
}

/// The lines under line `parent`: those after it until the next content line indented no
/// deeper than it.
fn block_of(lines: &[Line<'_>], parent: usize) -> Range<usize> {
    let indent = lines[parent].indent;
    let end = (parent + 1..lines.len())
        .find(|&i| lines[i].is_content() && lines[i].indent <= indent)
        .unwrap_or(lines.len());
    parent + 1..end
}

/// The text to insert after line `after` (or at the end of the text).
fn insert_after(text: &str, lines: &[Line<'_>], after: Option<usize>, insert: String) -> Edit {
    let at = match after {
        Some(i) if i + 1 < lines.len() => lines[i + 1].start,
        _ => text.len(),
    };
    let needs_newline = at == text.len() && !text.is_empty() && !text.ends_with('\n');
    let insert = if needs_newline {
        format!("\n{insert}")
    } else {
        insert
    };
    (at..at, insert)
}

fn plan_edits(text: &str, keys: &[GeneratedKey]) -> Result<Vec<Edit>, SaveError> {
    let unsupported = |why: &str| Err(SaveError::Unsupported(why.to_owned()));
    let lines = lines(text);
    let block_parent = |i: usize, what: &str| -> Result<Range<usize>, SaveError> {
        let rest = key_rest(lines[i].content(), what).unwrap_or_default();
        if !without_comment(rest).is_empty() {
            return Err(SaveError::Unsupported(format!(
                "{what} is not written as a block mapping"
            )));
        }
        Ok(block_of(&lines, i))
    };
    let deployment = match find_child(&lines, 0..lines.len(), 0, "deployment") {
        Child::Found(i) => i,
        Child::Absent(_) => {
            let insert = format!("deployment:\n  admin:\n{}", key_list(keys, "    "));
            return Ok(vec![insert_after(text, &lines, None, insert)]);
        }
    };
    let deployment_block = block_parent(deployment, "deployment")?;
    let child_min = lines[deployment].indent + 2;
    let admin = match find_child(&lines, deployment_block, child_min, "admin") {
        Child::Found(i) => i,
        Child::Absent(indent) => {
            let pad = " ".repeat(indent);
            let insert = format!("{pad}admin:\n{}", key_list(keys, &format!("{pad}  ")));
            return Ok(vec![insert_after(text, &lines, Some(deployment), insert)]);
        }
    };
    let admin_block = block_parent(admin, "admin")?;
    let child_min = lines[admin].indent + 2;
    let admin_key = match find_child(&lines, admin_block, child_min, "admin_key") {
        Child::Found(i) => i,
        Child::Absent(indent) => {
            let insert = key_list(keys, &" ".repeat(indent));
            return Ok(vec![insert_after(text, &lines, Some(admin), insert)]);
        }
    };
    let line = lines[admin_key];
    let rest = key_rest(line.content(), "admin_key").unwrap_or_default();
    let value = without_comment(rest);
    if value.starts_with('[') {
        let open = line.end() - rest.len() + rest.find('[').unwrap_or(0);
        return flow_sequence_edits(text, open, keys);
    }
    if !value.is_empty() {
        return unsupported("admin_key is neither a block nor a flow list");
    }
    block_sequence_edits(text, &lines, admin_key, keys)
}

/// The entries of a block list under line `parent`, by index: (dash line, last line).
fn block_items(lines: &[Line<'_>], parent: usize) -> Vec<(usize, usize)> {
    let parent_indent = lines[parent].indent;
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut dash_indent = None;
    for (i, l) in lines.iter().enumerate().skip(parent + 1) {
        if !l.is_content() {
            continue;
        }
        let is_dash = l.content().starts_with("- ") || l.content().trim_end() == "-";
        match dash_indent {
            None if is_dash && l.indent >= parent_indent => {
                dash_indent = Some(l.indent);
                items.push((i, i));
            }
            None => break,
            Some(d) if l.indent == d && is_dash => items.push((i, i)),
            Some(d) if l.indent > d => {
                if let Some(last) = items.last_mut() {
                    last.1 = i;
                }
            }
            Some(_) => break,
        }
    }
    items
}

fn block_sequence_edits(
    text: &str,
    lines: &[Line<'_>],
    admin_key: usize,
    keys: &[GeneratedKey],
) -> Result<Vec<Edit>, SaveError> {
    let items = block_items(lines, admin_key);
    let mut edits = Vec::new();
    for k in keys {
        let Some(&(dash, last)) = items.get(k.index) else {
            return Err(SaveError::Unsupported(format!(
                "admin_key[{}] was not found in the file",
                k.index
            )));
        };
        let line = lines[dash];
        let after_dash = &line.content()[1..];
        let offset = after_dash.len() - after_dash.trim_start().len();
        let column = line.indent + 1 + offset;
        let item = after_dash.trim_start();
        if item.starts_with('{') {
            let open = line.start + column;
            edits.extend(flow_mapping_edits(text, open, k)?);
            continue;
        }
        // A block mapping whose first key is on the dash line, the others at `column`.
        let mut found = None;
        for (i, l) in lines.iter().enumerate().take(last + 1).skip(dash) {
            let (content, at) = if i == dash {
                (item, line.start + column)
            } else if l.is_content() && l.indent == column {
                (l.content(), l.start + l.indent)
            } else {
                continue;
            };
            if let Some(rest) = key_rest(content, "key") {
                found = Some((at + "key:".len(), at + content.len(), without_comment(rest)));
                break;
            }
        }
        match found {
            Some((from, to, value)) if is_empty_value(value) => {
                edits.push((from..to, format!(" {}", k.key)));
            }
            Some(_) => {
                return Err(SaveError::Unsupported(format!(
                    "admin_key[{}]'s key is not empty in the file (is it set through a variable?)",
                    k.index
                )))
            }
            None => {
                let insert = format!("{}key: {}\n", " ".repeat(column), k.key);
                edits.push(insert_after(text, lines, Some(dash), insert));
            }
        }
    }
    Ok(edits)
}

/// The top-level elements of the flow collection opening at byte `open` (`[` or `{`): their
/// ranges, and where the collection closes.
fn flow_elements(text: &str, open: usize) -> Result<(Vec<Range<usize>>, usize), SaveError> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut elements = Vec::new();
    let mut start = open + 1;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => {
                // '' is an escaped quote inside a single-quoted scalar.
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == b'\'' {
                        if bytes.get(i + 1) == Some(&b'\'') {
                            i += 1;
                        } else {
                            break;
                        }
                    }
                    i += 1;
                }
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'#' if i > 0 && matches!(bytes[i - 1], b' ' | b'\t' | b'\n') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'[' | b'{' => depth += 1,
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    if !text[start..i].trim().is_empty() {
                        elements.push(start..i);
                    }
                    return Ok((elements, i));
                }
            }
            b',' if depth == 1 => {
                elements.push(start..i);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    Err(SaveError::Unsupported(
        "a flow collection in admin_key is not closed".into(),
    ))
}

/// The range of `range` without surrounding white space.
fn trimmed(text: &str, range: Range<usize>) -> Range<usize> {
    let s = &text[range.clone()];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    range.start + lead..range.end - trail
}

fn flow_sequence_edits(
    text: &str,
    open: usize,
    keys: &[GeneratedKey],
) -> Result<Vec<Edit>, SaveError> {
    let (elements, _) = flow_elements(text, open)?;
    let mut edits = Vec::new();
    for k in keys {
        let element = elements.get(k.index).map(|r| trimmed(text, r.clone()));
        match element {
            Some(r) if text[r.clone()].starts_with('{') => {
                edits.extend(flow_mapping_edits(text, r.start, k)?);
            }
            _ => {
                return Err(SaveError::Unsupported(format!(
                    "admin_key[{}] is not a flow mapping",
                    k.index
                )))
            }
        }
    }
    Ok(edits)
}

fn flow_mapping_edits(text: &str, open: usize, k: &GeneratedKey) -> Result<Vec<Edit>, SaveError> {
    let (entries, close) = flow_elements(text, open)?;
    for entry in entries {
        let entry = trimmed(text, entry);
        let s = &text[entry.clone()];
        let Some(colon) = s.find(':') else {
            continue;
        };
        let name = s[..colon].trim().trim_matches(['"', '\'']);
        if name != "key" {
            continue;
        }
        let value = trimmed(text, entry.start + colon + 1..entry.end);
        if !is_empty_value(&text[value.clone()]) {
            return Err(SaveError::Unsupported(format!(
                "admin_key[{}]'s key is not empty in the file (is it set through a variable?)",
                k.index
            )));
        }
        return Ok(vec![if value.is_empty() {
            (value.start..value.start, format!(" {}", k.key))
        } else {
            (value, k.key.clone())
        }]);
    }
    // No `key` entry: add one before the closing brace.
    let before = text[open + 1..close].trim_end();
    let at = open + 1 + before.len();
    let insert = if before.trim().is_empty() {
        format!("key: {}", k.key)
    } else {
        format!(", key: {}", k.key)
    };
    Ok(vec![(at..at, insert)])
}

/// Replaces `target` (a regular file) with `contents` atomically, keeping its mode and owner.
fn replace_file(target: &Path, contents: &[u8]) -> std::io::Result<()> {
    let old = fs::metadata(target)?;
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tmp, mut file) = {
        let mut attempt = 0;
        loop {
            let tmp = dir.join(format!(".{name}.ferrisix-{}-{attempt}", std::process::id()));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
            {
                Ok(f) => break (tmp, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    };
    let written = (|| {
        file.write_all(contents)?;
        let new = file.metadata()?;
        if (new.uid(), new.gid()) != (old.uid(), old.gid()) {
            std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid())).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot keep the owner {}:{} ({e})", old.uid(), old.gid()),
                )
            })?;
        }
        // After the chown, which may clear set-id bits.
        file.set_permissions(old.permissions())?;
        file.sync_all()?;
        fs::rename(&tmp, target)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
        return written;
    }
    // The rename is durable once the directory is.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::settings::Settings;

    const KEY: &str = "KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK";

    fn admin(index: usize) -> GeneratedKey {
        GeneratedKey {
            index,
            name: "admin".into(),
            key: KEY.into(),
        }
    }

    fn keys_in(text: &str) -> Vec<String> {
        let (s, _) = Settings::from_yaml_str(text).unwrap();
        s.deployment
            .admin
            .admin_key
            .iter()
            .map(|k| k.key.clone())
            .collect()
    }

    /// A block-style list whose one admin entry has no key.
    const BLOCK: &str = "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ''\n        role: admin\n";

    /// `config.yaml` with `text` in a new directory.
    fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn save(text: &str) -> (tempfile::TempDir, PathBuf, Result<PathBuf, SaveError>) {
        let (dir, path) = config_file(text);
        let saved = save_admin_keys(&path, &[admin(0)]);
        (dir, path, saved)
    }

    /// Nothing but config.yaml (and what the test put there) is left in the directory.
    fn no_temporary_files(dir: &Path) {
        let names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("ferrisix"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn empty_keys_are_written_back_in_place() {
        let (dir, path, saved) = save(
            "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ''   # generated\n        role: admin\n      - name: viewer\n        key: abc\n        role: viewer\n# end\n",
        );
        saved.unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains(&format!("        key: {KEY}\n")), "{text}");
        assert!(text.contains("key: abc"));
        assert!(text.ends_with("# end\n"));
        let (s, _) = Settings::load(&path).unwrap();
        assert_eq!(s.deployment.admin.admin_key[0].key, KEY);
        no_temporary_files(dir.path());
    }

    #[test]
    fn the_mode_is_kept() {
        let (_dir, path) = config_file(BLOCK);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        save_admin_keys(&path, &[admin(0)]).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert_eq!(keys_in(&fs::read_to_string(&path).unwrap()), [KEY]);

        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(
            &path,
            "deployment:\n  admin:\n    admin_key: [{name: admin, key: ''}]\n",
        )
        .unwrap();
        save_admin_keys(&path, &[admin(0)]).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640, "{mode:o}");
    }

    #[test]
    fn the_owner_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        fs::write(
            &path,
            "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ''\n",
        )
        .unwrap();
        let me = fs::metadata(&path).unwrap();
        if me.uid() != 0 {
            eprintln!("SKIPPED: changing a file's owner needs root");
            return;
        }
        // Another user's file, as /etc/apisix/config.yaml owned by the apisix user.
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        save_admin_keys(&path, &[admin(0)]).unwrap();
        let after = fs::metadata(&path).unwrap();
        assert_eq!((after.uid(), after.gid()), (65534, 65534));
        assert_eq!(keys_in(&fs::read_to_string(&path).unwrap()), [KEY]);
    }

    #[test]
    fn a_symlink_keeps_its_link_and_its_target_is_written() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        let target = dir.path().join("real/config.yaml");
        fs::write(
            &target,
            "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ''\n",
        )
        .unwrap();
        let link = dir.path().join("config.yaml");
        std::os::unix::fs::symlink("real/config.yaml", &link).unwrap();
        let written = save_admin_keys(&link, &[admin(0)]).unwrap();
        assert_eq!(written, fs::canonicalize(&target).unwrap());
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("real/config.yaml"));
        assert_eq!(keys_in(&fs::read_to_string(&target).unwrap()), [KEY]);
        no_temporary_files(dir.path());
        no_temporary_files(&dir.path().join("real"));
    }

    #[test]
    fn the_flow_style_is_saved() {
        let (_dir, path, saved) = save(
            "deployment:\n  role: traditional\n  admin:\n    admin_key: [{name: admin, key: '', role: admin}]  # one key\n    allow_admin: [127.0.0.0/24]\n",
        );
        saved.unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            format!("deployment:\n  role: traditional\n  admin:\n    admin_key: [{{name: admin, key: {KEY}, role: admin}}]  # one key\n    allow_admin: [127.0.0.0/24]\n")
        );
        // Over several lines, with the key last, and with no key at all.
        for text in [
            "deployment:\n  admin:\n    admin_key: [\n      {name: viewer, key: abc, role: viewer},\n      {name: admin, role: admin, key: \"\"}\n    ]\n",
            "deployment:\n  admin:\n    admin_key: [{name: viewer, key: abc, role: viewer}, {name: admin, role: admin}]\n",
        ] {
            let edited = set_admin_keys(text, &[admin(1)]).unwrap();
            assert_eq!(keys_in(&edited), ["abc", KEY], "{edited}");
        }
    }

    #[test]
    fn flow_entries_of_a_block_list_and_entries_without_a_key() {
        let text = "deployment:\n  admin:\n    admin_key:\n    - {name: admin, key: '', role: admin}\n    - name: second\n      role: admin\n";
        let keys = [
            admin(0),
            GeneratedKey {
                index: 1,
                name: "second".into(),
                key: "S".repeat(32),
            },
        ];
        let edited = set_admin_keys(text, &keys).unwrap();
        assert_eq!(
            keys_in(&edited),
            [KEY.to_owned(), "S".repeat(32)],
            "{edited}"
        );
    }

    #[test]
    fn only_the_generated_entry_changes() {
        // A viewer with an empty key is not given one (only admin keys are generated).
        let text = "deployment:\n  admin:\n    admin_key:\n      - name: viewer\n        key: ''\n        role: viewer\n      - name: admin\n        key: ~\n        role: admin\n";
        let edited = set_admin_keys(text, &[admin(1)]).unwrap();
        assert_eq!(keys_in(&edited), ["", KEY], "{edited}");
    }

    #[test]
    fn a_missing_key_list_is_added() {
        for (text, ends) in [
            (
                "apisix:\n  node_listen: 9080\n",
                "apisix:\n  node_listen: 9080\ndeployment:\n  admin:\n    admin_key:\n",
            ),
            (
                "deployment:\n  role: traditional\n",
                "deployment:\n  admin:\n    admin_key:\n",
            ),
            (
                "deployment:\n    role: traditional\n    admin:\n        allow_admin: ~\n",
                "    admin:\n        admin_key:\n",
            ),
            ("# only comments\n", "# only comments\ndeployment:\n"),
            ("apisix:\n  node_listen: 9080", "9080\ndeployment:\n"),
        ] {
            let edited = set_admin_keys(text, &[admin(0)]).unwrap();
            assert!(edited.contains(ends), "{edited}");
            assert_eq!(keys_in(&edited), [KEY], "{edited}");
        }
    }

    #[test]
    fn what_cannot_be_edited_safely_is_refused_and_the_file_left_alone() {
        for text in [
            // Flow style above the key list.
            "deployment: {admin: {admin_key: [{name: admin, key: ''}]}}\n",
            "deployment:\n  admin: {admin_key: [{name: admin, key: ''}]}\n",
            // The key comes from the environment: writing a literal would hide that.
            "deployment:\n  admin:\n    admin_key:\n      - name: admin\n        key: ${{ADMIN_KEY}}\n",
            "deployment:\n  admin:\n    admin_key: [{name: admin, key: \"${{ADMIN_KEY}}\"}]\n",
            // An anchor the edit would have to follow.
            "keys: &k\n  - name: admin\n    key: ''\ndeployment:\n  admin:\n    admin_key: *k\n",
        ] {
            let (dir, path, saved) = save(text);
            let Err(SaveError::Unsupported(why)) = saved else {
                panic!("{text}: {saved:?}");
            };
            assert!(!why.is_empty());
            assert_eq!(fs::read_to_string(&path).unwrap(), text);
            no_temporary_files(dir.path());
        }
        assert_eq!(
            what_to_write(&[admin(0)]),
            format!("deployment.admin.admin_key[0] (name: admin): key: {KEY}")
        );
    }

    #[test]
    fn a_new_config_holds_the_key_for_its_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conf/config.yaml");
        write_new_config(&path, &[admin(0)]).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert_eq!(keys_in(&fs::read_to_string(&path).unwrap()), [KEY]);
        assert!(matches!(
            write_new_config(&path, &[admin(0)]),
            Err(SaveError::Io(_))
        ));
    }
}
