//! Holds this crate to the plugin API's word on what plugins use besides it: every path of
//! `ferrisix_config`, `ferrisix_net` or `ferrisix_router` named in this crate's code is in the
//! lists of `ferrisix-plugin-api`'s crate doc (plugin modules to the first list, the registry,
//! chains and consumer set to both, tests to any), every listed path is used, and `Cargo.toml`
//! depends on exactly the plugin API and the crates those lists name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const LOWER: [&str; 3] = ["ferrisix_config", "ferrisix_net", "ferrisix_router"];

/// What the plugin API's crate doc allows.
struct Allowed {
    /// For plugin modules (families and `support/`).
    plugins: Vec<String>,
    /// Also for the rest of the crate's code.
    crate_code: Vec<String>,
    /// Also for tests.
    tests: Vec<String>,
}

impl Allowed {
    fn from_doc(doc: &str) -> Allowed {
        let mut allowed = Allowed {
            plugins: Vec::new(),
            crate_code: Vec::new(),
            tests: Vec::new(),
        };
        let section = doc
            .split("# What plugins use besides this crate")
            .nth(1)
            .expect("the plugin API's crate doc says what plugins use besides it");
        // Items start with `- `; their lines go on indented.
        let mut in_rest = false;
        let mut items: Vec<String> = Vec::new();
        let mut open = false;
        // The first line is the heading's own.
        for line in section.lines().skip(1) {
            let Some(text) = line.strip_prefix("//!") else {
                break;
            };
            if text.contains("may also use") {
                in_rest = true;
            }
            if let Some(item) = text.strip_prefix(" - ") {
                items.push(format!("{}{item}", if in_rest { "+" } else { "" }));
                open = true;
            } else if open && text.starts_with("   ") {
                items.last_mut().unwrap().push_str(text);
            } else {
                open = false;
            }
        }
        for item in items {
            let rest = item.starts_with('+');
            let paths = item
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| LOWER.iter().any(|c| p.starts_with(c)))
                .map(str::to_owned);
            let list = match (rest, item.contains("in tests only")) {
                (false, _) => &mut allowed.plugins,
                (true, false) => &mut allowed.crate_code,
                (true, true) => &mut allowed.tests,
            };
            list.extend(paths);
        }
        assert!(!allowed.plugins.is_empty(), "no list for plugins found");
        allowed
    }
}

/// `path` is `allowed` or an item inside it.
fn covers(allowed: &str, path: &str) -> bool {
    path == allowed || path.starts_with(&format!("{allowed}::"))
}

/// The `ferrisix_config::a::b` paths named in `line`, a `use` list giving one per item.
fn lower_paths(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for krate in LOWER {
        let mut rest = line;
        while let Some(at) = rest.find(krate) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let path = tail[..end].trim_end_matches(':');
            let list = tail[end..]
                .strip_prefix('{')
                .and_then(|l| l.split('}').next());
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                // Part of another name.
            } else if let Some(list) = list {
                // `use a::{B, c::D}`: each item, by its first segment.
                for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let head = item.split("::").next().unwrap_or(item);
                    found.push(format!("{path}::{head}"));
                }
            } else {
                found.push(path.to_owned());
            }
            rest = &tail[end..];
        }
    }
    found
}

/// One source file: whether it is test code throughout, and its code lines with whether each
/// is test code.
struct Source {
    rel: String,
    lines: Vec<(String, bool)>,
}

/// The modules a file declares under a `cfg` naming `test`, as file paths.
fn test_modules(dir: &Path, file: &Path, text: &str) -> Vec<PathBuf> {
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let base = if file.parent() == Some(dir) && stem == "lib" {
        dir.to_path_buf()
    } else {
        file.with_extension("")
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0].starts_with("#[cfg(") && w[0].contains("test"))
        .filter_map(|w| {
            let decl = w[1]
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            let name = decl.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(base.join(format!("{name}.rs")))
        })
        .collect()
}

fn sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect();
    let test_files: BTreeSet<PathBuf> = texts
        .iter()
        .flat_map(|(f, text)| test_modules(src, f, text))
        .collect();
    texts
        .into_iter()
        .map(|(f, text)| {
            let mut in_tests = test_files.contains(&f);
            let mut cfg_test = false;
            let mut lines = Vec::new();
            for line in text.lines() {
                let code = line.trim();
                if cfg_test && code.starts_with("mod ") && code.ends_with('{') {
                    in_tests = true;
                }
                cfg_test = code == "#[cfg(test)]";
                if !code.starts_with("//") {
                    lines.push((code.to_owned(), in_tests));
                }
            }
            let rel = f.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            Source { rel, lines }
        })
        .collect()
}

/// A file of a family (`<family>.rs`, `<family>/...`) or of `support/`.
fn is_plugin_module(rel: &str) -> bool {
    const CRATE_CODE: [&str; 7] = [
        "lib.rs",
        "registry.rs",
        "chain.rs",
        "consumers.rs",
        "secrets.rs",
        "testing.rs",
        "boundary.rs",
    ];
    !CRATE_CODE.contains(&rel)
        && !rel.starts_with("consumers/")
        && !rel.starts_with("chain/")
        && !rel.starts_with("secrets/")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn plugins_use_what_the_plugin_api_says() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let allowed = Allowed::from_doc(&read(&root.join("../plugin-api/src/lib.rs")));
    let mut used = BTreeSet::new();
    let mut wrong = Vec::new();
    for source in sources(&root.join("src")) {
        if source.rel == "boundary.rs" {
            continue;
        }
        let plugin = is_plugin_module(&source.rel);
        for (line, in_tests) in &source.lines {
            for path in lower_paths(line) {
                let lists: &[&Vec<String>] = match (in_tests, plugin) {
                    (true, _) => &[&allowed.plugins, &allowed.crate_code, &allowed.tests],
                    (false, true) => &[&allowed.plugins],
                    (false, false) => &[&allowed.plugins, &allowed.crate_code],
                };
                match lists
                    .iter()
                    .flat_map(|l| l.iter())
                    .find(|a| covers(a, &path))
                {
                    Some(a) => {
                        used.insert(a.clone());
                    }
                    None => wrong.push(format!("{}: {path}", source.rel)),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "not in the plugin API's lists of what plugins use (crates/plugin-api/src/lib.rs): {wrong:#?}"
    );
    let listed: BTreeSet<String> = [&allowed.plugins, &allowed.crate_code, &allowed.tests]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let unused: Vec<_> = listed.difference(&used).collect();
    assert!(unused.is_empty(), "listed but not used: {unused:?}");
}

#[test]
fn dependencies_are_the_plugin_api_and_what_it_lists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let allowed = Allowed::from_doc(&read(&root.join("../plugin-api/src/lib.rs")));
    let mut want: BTreeSet<String> = [&allowed.plugins, &allowed.crate_code]
        .into_iter()
        .flatten()
        .map(|p| p.split("::").next().unwrap().replace('_', "-"))
        .collect();
    want.insert("ferrisix-plugin-api".into());
    let manifest = read(&root.join("Cargo.toml"));
    let deps: BTreeSet<String> = manifest
        .split("\n[")
        .find(|s| s.starts_with("dependencies]"))
        .expect("a [dependencies] table")
        .lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|name| name.starts_with("ferrisix-"))
        .map(str::to_owned)
        .collect();
    assert_eq!(deps, want);
}

#[test]
fn paths_are_read_whole() {
    assert_eq!(
        lower_paths("use ferrisix_config::settings::{MetricAttr, PrometheusAttr};"),
        [
            "ferrisix_config::settings::MetricAttr",
            "ferrisix_config::settings::PrometheusAttr"
        ]
    );
    assert_eq!(
        lower_paths("use ferrisix_router::{Expr, VarSource};"),
        ["ferrisix_router::Expr", "ferrisix_router::VarSource"]
    );
    assert_eq!(
        lower_paths("x = ferrisix_router::VarSource + my_ferrisix_net::x"),
        ["ferrisix_router::VarSource"]
    );
    assert!(covers(
        "ferrisix_config::schema",
        "ferrisix_config::schema::lua"
    ));
    assert!(!covers(
        "ferrisix_config::schema",
        "ferrisix_config::schemas"
    ));
}
