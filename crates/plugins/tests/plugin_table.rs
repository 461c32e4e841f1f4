//! The plugin table of `docs/plugins.md` and the coverage line of `README.md` cannot drift from
//! the registry: every plugin `builtin()` registers has a row whose state is `built`, every
//! `built` row names a registered plugin, and the README's `N of M APISIX 3.18 plugins` counts
//! the built rows and all the rows.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The table's rows as (plugin, state) from between the `plugin-table` markers.
fn table_rows(doc: &str) -> Vec<(String, String)> {
    let start = doc
        .find("<!-- plugin-table -->")
        .expect("docs/plugins.md has no `<!-- plugin-table -->` marker");
    let end = doc
        .find("<!-- /plugin-table -->")
        .expect("docs/plugins.md has no `<!-- /plugin-table -->` marker");
    assert!(start < end, "the plugin-table markers are out of order");
    let mut rows = Vec::new();
    for line in doc[start..end].lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        // The header and the separator row have no backticked name.
        let Some(name) = cells[0].strip_prefix('`').and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        let state = cells.get(1).copied().unwrap_or_default();
        rows.push((name.to_owned(), state.to_owned()));
    }
    rows
}

/// `built` or `not built`, from the start of the state column (words after it explain).
fn is_built(plugin: &str, state: &str) -> bool {
    // The state word ends where the column does or at a non-word character.
    let is_word = |word: &str| {
        state.strip_prefix(word).is_some_and(|rest| {
            rest.chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '-' && c != '_')
        })
    };
    if is_word("built") {
        true
    } else if is_word("not built") {
        false
    } else {
        panic!(
            "docs/plugins.md: the state of `{plugin}` starts with neither `built` nor `not built`: {state:?}"
        )
    }
}

/// The `N of M APISIX 3.18 plugins` line of the README, as (N, M).
fn readme_coverage(readme: &str) -> (usize, usize) {
    const TAIL: &str = " APISIX 3.18 plugins";
    let at = readme
        .find(TAIL)
        .expect("README.md does not say `N of M APISIX 3.18 plugins`");
    let head = &readme[..at];
    let words: Vec<&str> = head
        .rsplit(|c: char| c.is_whitespace() || c == '[')
        .take(3)
        .collect();
    // Reversed: M, "of", N.
    assert_eq!(
        words.get(1),
        Some(&"of"),
        "README.md: `{}` is not `N of M`",
        &head[head.len().saturating_sub(20)..]
    );
    let parse = |w: &str| {
        w.parse::<usize>()
            .unwrap_or_else(|_| panic!("README.md: `{w}` is not a count"))
    };
    (parse(words[2]), parse(words[0]))
}

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

#[test]
fn plugin_table_matches_the_registry_and_the_readme() {
    let rows = table_rows(&repo_file("docs/plugins.md"));
    let mut seen = BTreeSet::new();
    for (name, _) in &rows {
        assert!(
            seen.insert(name.as_str()),
            "docs/plugins.md: `{name}` has two rows"
        );
    }
    let built: BTreeSet<&str> = rows
        .iter()
        .filter(|(name, state)| is_built(name, state))
        .map(|(name, _)| name.as_str())
        .collect();
    let registered: BTreeSet<&str> = ferrisix_plugins::builtin().map(|def| def.name).collect();

    let without_row: Vec<_> = registered.iter().filter(|n| !seen.contains(*n)).collect();
    assert!(
        without_row.is_empty(),
        "registered plugins with no row in docs/plugins.md: {without_row:?}"
    );
    let not_marked: Vec<_> = registered.difference(&built).collect();
    assert!(
        not_marked.is_empty(),
        "registered plugins whose row in docs/plugins.md is not `built`: {not_marked:?}"
    );
    let unregistered: Vec<_> = built.difference(&registered).collect();
    assert!(
        unregistered.is_empty(),
        "`built` rows in docs/plugins.md that no plugin registers: {unregistered:?}"
    );

    let (readme_built, readme_total) = readme_coverage(&repo_file("README.md"));
    assert_eq!(
        (readme_built, readme_total),
        (built.len(), rows.len()),
        "README.md's `N of M APISIX 3.18 plugins` against docs/plugins.md's built rows and rows"
    );
}

#[test]
fn table_parser_reads_states_and_skips_the_header() {
    let doc = "x\n<!-- plugin-table -->\n| plugin | state |\n| --- | --- |\n| `a` | built |\n| `b` | not built — why |\n<!-- /plugin-table -->\n| `c` | built |\n";
    let rows = table_rows(doc);
    assert_eq!(
        rows,
        vec![
            ("a".into(), "built".into()),
            ("b".into(), "not built — why".into())
        ]
    );
    assert!(is_built("a", "built"));
    assert!(!is_built("b", "not built — why"));
    assert!(!is_built("c", "not built: why"));
    assert!(is_built("d", "built (see below)"));
    assert_eq!(
        readme_coverage("see [43 of 120 APISIX 3.18 plugins](docs/plugins.md)"),
        (43, 120)
    );
}
