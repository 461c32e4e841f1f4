//! Keeps `docs/adding-a-plugin.md` true to the code: every Rust snippet is cut verbatim from
//! the file its `<!-- from: ... -->` line names, and every shell block this module is named
//! as testing runs `cargo test` with a filter that selects tests which exist.

use std::path::PathBuf;

const GUIDE: &str = "docs/adding-a-plugin.md";
const THIS: &str = "crates/plugins/src/guide.rs";

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The fenced blocks of `doc` as (language, the line before the fence, body).
fn blocks(doc: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    let mut before = "";
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            out.push((lang.to_owned(), before.to_owned(), body.join("\n")));
        }
        before = line;
    }
    out
}

/// The `<!-- key: value -->` on `line`.
fn marker<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.strip_prefix("<!-- ")?
        .strip_suffix(" -->")?
        .strip_prefix(key)?
        .strip_prefix(": ")
}

#[test]
fn rust_snippets_are_cut_from_the_code() {
    let guide = repo_file(GUIDE);
    let mut seen = 0;
    for (lang, before, body) in blocks(&guide) {
        if lang != "rust" {
            continue;
        }
        let from = marker(&before, "from").unwrap_or_else(|| {
            panic!("{GUIDE}: a rust block without `<!-- from: <file> -->`:\n{body}")
        });
        let code = repo_file(from);
        assert!(
            code.contains(&body),
            "{GUIDE}: this snippet is not in {from} (any more):\n{body}"
        );
        seen += 1;
    }
    assert!(seen > 0, "{GUIDE} shows no code");
}

/// `#[test]` functions in `code` whose name contains `filter`.
fn tests_named(code: &str, filter: &str) -> usize {
    let lines: Vec<&str> = code.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[test]" || w[0].starts_with("#[tokio::test"))
        .filter_map(|w| w[1].strip_prefix("fn ").or(w[1].strip_prefix("async fn ")))
        .filter(|f| {
            f.split('(')
                .next()
                .is_some_and(|name| name.contains(filter))
        })
        .count()
}

/// A command the guide shows, checked for selecting tests that exist.
fn check_command(command: &str) {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["cargo", "test", "-p", "ferrisix-plugins", "--lib", module] => {
            let file = format!("crates/plugins/src/{}.rs", module.replace("::", "/"));
            assert!(
                tests_named(&repo_file(&file), "") > 0,
                "`{command}`: {file} has no tests"
            );
        }
        // The end-to-end tests are one binary, `e2e`, with a module per file.
        ["cargo", "test", "--test", "e2e", path] => {
            let (module, filter) = path
                .split_once("::")
                .unwrap_or_else(|| panic!("`{command}`: name the module, `<module>::<test>`"));
            let file = format!("tests/e2e/{module}.rs");
            assert!(
                tests_named(&repo_file(&file), filter) > 0,
                "`{command}`: no test of {file} is named like `{filter}`"
            );
        }
        _ => panic!("{GUIDE}: `{command}` is not a command this test knows how to check"),
    }
}

#[test]
fn shell_commands_select_tests_that_exist() {
    let guide = repo_file(GUIDE);
    let mut seen = 0;
    for (lang, before, body) in blocks(&guide) {
        if lang != "sh" {
            continue;
        }
        let by = marker(&before, "tested-by").unwrap_or_else(|| {
            panic!("{GUIDE}: a sh block without `<!-- tested-by: -->`:\n{body}")
        });
        if by != THIS {
            continue;
        }
        for command in body.lines().filter(|l| !l.trim().is_empty()) {
            check_command(command);
            seen += 1;
        }
    }
    assert!(seen > 0, "{GUIDE} shows no command this test checks");
}

#[test]
fn commands_that_select_nothing_are_refused() {
    let missing = std::panic::catch_unwind(|| {
        check_command("cargo test --test e2e plugins_http::no_such_test_anywhere")
    });
    assert!(missing.is_err());
    assert_eq!(
        tests_named(
            "#[test]\nfn uri_blocker_x() {}\nfn uri_blocker_y() {}",
            "uri_blocker"
        ),
        1
    );
}
