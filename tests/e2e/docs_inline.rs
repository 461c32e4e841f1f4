//! The commands the documentation names inline, in backticks within its prose: the results
//! page's reproducing commands, the developer guide's test filters, the scripts it points to.
//! Most take minutes on a quiet machine (a benchmark row, a scale run), so CI does not run
//! them; `docs_commands` runs the fenced blocks. What this test keeps from going stale is that
//! each inline command still names what exists and is called as its program accepts:
//!
//! * a script or bench path exists (`scripts/...`, `benches/...`, a glob matches something);
//! * a Python script accepts every `--flag` given to it (its `--help` lists it), a shell
//!   script handles it (its text names it);
//! * `cargo` names a workspace package (`-p`), a test, bench or example target of it, and an
//!   end-to-end test filter `module::` names a module of the `e2e` binary; an example's own
//!   flags (after `--`) appear in its source;
//! * `ferrisix` is given flags its `--help` lists.
//!
//! Placeholders (`FILE`, `WORKDIR`, `<target>`) stand for the reader's values and are not checked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Backticked spans of a page outside its fenced blocks, with their 1-based line.
fn inline_spans(page: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (n, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Double-backtick spans are not used by these pages; single ones alternate.
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            spans.push((n + 1, code.to_owned()));
        }
    }
    spans
}

/// The commands a span holds (`a && b` is two), each as its words, when the span is a command
/// this test knows how to check.
fn commands(span: &str) -> Vec<Vec<String>> {
    span.split("&&")
        .map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|words| words.first().is_some_and(|w| is_checked_program(w)))
        .collect()
}

fn is_checked_program(word: &str) -> bool {
    matches!(word, "cargo" | "python3" | "ferrisix") || is_repo_path(word)
}

fn is_repo_path(word: &str) -> bool {
    let word = word.strip_prefix("./").unwrap_or(word);
    word.starts_with("scripts/") || word.starts_with("benches/") || word.starts_with("examples/")
}

fn is_placeholder(word: &str) -> bool {
    (word.starts_with('<') && word.ends_with('>'))
        || (word.len() > 1
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()))
}

/// How to learn what a program accepts; a cache, as many rows call the same script.
struct Programs {
    root: PathBuf,
    help: BTreeMap<PathBuf, Result<String, String>>,
    ferrisix_help: Option<String>,
}

impl Programs {
    fn new(root: &Path) -> Programs {
        Programs {
            root: root.to_owned(),
            help: BTreeMap::new(),
            ferrisix_help: None,
        }
    }

    /// The text that lists a script's options: `--help` for Python, the script for shell.
    fn options_text(&mut self, script: &Path) -> Result<String, String> {
        let root = self.root.clone();
        self.help
            .entry(script.to_owned())
            .or_insert_with(|| {
                let path = root.join(script);
                if path.extension().is_some_and(|e| e == "py") {
                    let out = Command::new("python3")
                        .arg(&path)
                        .arg("--help")
                        .current_dir(&root)
                        .output()
                        .map_err(|e| format!("python3 {}: {e}", script.display()))?;
                    if !out.status.success() {
                        return Err(format!(
                            "`python3 {} --help` failed: {}",
                            script.display(),
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
                } else {
                    std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", script.display()))
                }
            })
            .clone()
    }

    fn ferrisix_help(&mut self) -> &str {
        self.ferrisix_help.get_or_insert_with(|| {
            let out = Command::new(env!("CARGO_BIN_EXE_ferrisix"))
                .arg("--help")
                .output()
                .expect("ferrisix --help runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    }
}

/// The workspace's packages, by name, with their directories (relative to the root).
fn packages(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    out.insert("ferrisix".to_owned(), PathBuf::new());
    for entry in std::fs::read_dir(root.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'));
        if let Some(name) = name {
            out.insert(
                name.to_owned(),
                entry.path().strip_prefix(root).unwrap().to_owned(),
            );
        }
    }
    out
}

/// A cargo target file: `dir/NAME.rs` or `dir/NAME/main.rs`.
fn target_exists(root: &Path, dir: &Path, name: &str) -> bool {
    root.join(dir).join(format!("{name}.rs")).is_file()
        || root.join(dir).join(name).join("main.rs").is_file()
}

fn glob_matches(root: &Path, pattern: &str) -> bool {
    let (dir, file) = pattern.rsplit_once('/').unwrap_or((".", pattern));
    let (prefix, suffix) = file.split_once('*').unwrap_or((file, ""));
    std::fs::read_dir(root.join(dir))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(prefix) && name.ends_with(suffix)
        })
}

/// What is wrong with one command (empty when nothing is).
fn check_command(words: &[String], programs: &mut Programs) -> Vec<String> {
    let root = programs.root.clone();
    let mut problems = Vec::new();
    let (program, args) = words.split_first().expect("commands are never empty");
    match program.as_str() {
        "cargo" => check_cargo(args, &root, &mut problems),
        "ferrisix" => {
            for flag in args.iter().filter(|a| a.starts_with('-')) {
                if !programs.ferrisix_help().contains(flag.as_str()) {
                    problems.push(format!("ferrisix has no option `{flag}`"));
                }
            }
        }
        "python3" => match args.split_first() {
            Some((script, rest)) => check_script(script, rest, programs, &mut problems),
            None => problems.push("python3 without a script".to_owned()),
        },
        path => check_script(path, args, programs, &mut problems),
    }
    problems
}

fn check_script(
    script: &str,
    args: &[String],
    programs: &mut Programs,
    problems: &mut Vec<String>,
) {
    let root = programs.root.clone();
    let script = script.strip_prefix("./").unwrap_or(script);
    if script.contains('*') {
        if !glob_matches(&root, script) {
            problems.push(format!("`{script}` matches nothing"));
        }
        return;
    }
    let path = root.join(script);
    if script.ends_with('/') {
        if !path.is_dir() {
            problems.push(format!("`{script}` is not a directory"));
        }
        return;
    }
    if !path.is_file() {
        problems.push(format!("`{script}` does not exist"));
        return;
    }
    let flags: Vec<&String> = args.iter().filter(|a| a.starts_with("--")).collect();
    if flags.is_empty() {
        return;
    }
    match programs.options_text(Path::new(script)) {
        Ok(text) => {
            for flag in flags {
                let flag = flag.split('=').next().unwrap_or(flag);
                if !text.contains(flag) {
                    problems.push(format!("`{script}` does not accept `{flag}`"));
                }
            }
        }
        Err(e) => problems.push(e),
    }
}

fn check_cargo(args: &[String], root: &Path, problems: &mut Vec<String>) {
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('+'))
        .collect();
    let Some((&sub, rest)) = args.split_first() else {
        problems.push("cargo without a subcommand".to_owned());
        return;
    };
    if !matches!(
        sub,
        "build" | "check" | "test" | "bench" | "run" | "install" | "fmt" | "clippy" | "fuzz"
    ) {
        problems.push(format!("cargo `{sub}` is not a subcommand these docs use"));
        return;
    }
    let packages = packages(root);
    let (own, passed) = match rest.iter().position(|a| *a == "--") {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut dir = PathBuf::new();
    let mut example = None;
    let mut filters = Vec::new();
    let mut i = 0;
    while i < own.len() {
        let arg = own[i];
        let takes_value = matches!(
            arg,
            "-p" | "--package"
                | "--test"
                | "--bench"
                | "--example"
                | "--path"
                | "--bin"
                | "--features"
                | "--profile"
        );
        let value = if takes_value {
            own.get(i + 1).copied().unwrap_or("")
        } else {
            ""
        };
        match arg {
            "-p" | "--package" => match packages.get(value) {
                Some(d) => dir = d.clone(),
                None => problems.push(format!("no workspace package `{value}`")),
            },
            "--test" if !target_exists(root, &dir.join("tests"), value) => {
                problems.push(format!("no test target `{value}` in `{}`", dir.display()))
            }
            "--bench" if !target_exists(root, &dir.join("benches"), value) => {
                problems.push(format!("no bench target `{value}` in `{}`", dir.display()))
            }
            "--example" => {
                if !target_exists(root, &dir.join("examples"), value) {
                    problems.push(format!("no example `{value}` in `{}`", dir.display()));
                }
                example = Some(dir.join("examples").join(format!("{value}.rs")));
            }
            "--path" if !root.join(value).join("Cargo.toml").is_file() => {
                problems.push(format!("`--path {value}` holds no Cargo.toml"))
            }
            _ if arg.starts_with('-') => {}
            word => filters.push(word),
        }
        i += if takes_value { 2 } else { 1 };
    }
    // An e2e filter `module::` names a module of the e2e binary.
    if sub == "test" && own.windows(2).any(|w| w == ["--test", "e2e"]) {
        for filter in filters.iter().filter(|f| f.ends_with("::")) {
            let module = filter.trim_end_matches("::");
            if !target_exists(root, Path::new("tests/e2e"), module) {
                problems.push(format!("the e2e tests have no module `{module}`"));
            }
        }
    }
    // An example's own options appear in its source.
    if let Some(example) = example {
        let source = std::fs::read_to_string(root.join(&example)).unwrap_or_default();
        for flag in passed.iter().filter(|a| a.starts_with("--")) {
            if !source.contains(flag) {
                problems.push(format!("`{}` does not read `{flag}`", example.display()));
            }
        }
    }
}

/// Every problem of the inline commands of `page` (its text), named by page and line.
fn page_problems(name: &str, page: &str, programs: &mut Programs) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, span) in inline_spans(page) {
        for words in commands(&span) {
            let words: Vec<String> = words.into_iter().filter(|w| !is_placeholder(w)).collect();
            for problem in check_command(&words, programs) {
                problems.push(format!("{name}:{line}: `{span}`: {problem}"));
            }
        }
    }
    problems
}

#[test]
fn inline_commands_name_what_exists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut programs = Programs::new(&root);
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in super::docs_commands::pages() {
        let text = std::fs::read_to_string(root.join(&page)).expect("page reads");
        checked += inline_spans(&text)
            .iter()
            .map(|(_, s)| commands(s).len())
            .sum::<usize>();
        problems.extend(page_problems(
            &page.display().to_string(),
            &text,
            &mut programs,
        ));
    }
    assert!(
        checked > 50,
        "only {checked} inline commands found: is the parser broken?"
    );
    assert!(
        problems.is_empty(),
        "stale inline commands:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_catch_what_goes_stale() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut programs = Programs::new(&root);
    let page = "\
Run `python3 benches/e2e/bench.py --rounds 5 --no-such-flag` then `scripts/gone.sh`.
Filters: `cargo test --test e2e no_such_module::` and `cargo bench --bench nope`,
`cargo test -p ferrisix-nothing --lib`, `cargo run --release --example route_memory -- --bogus`,
`ferrisix -c FILE --frobnicate`, and prose like `etcd` or `kill -9` is left alone.
```sh
scripts/not-inline.sh
```
Fine: `cargo test --test e2e restart::`, `benches/*.rs`, `cargo bench --bench router -- compile`.
";
    let problems = page_problems("page.md", page, &mut programs);
    let expect = [
        "does not accept `--no-such-flag`",
        "`scripts/gone.sh` does not exist",
        "no module `no_such_module`",
        "no bench target `nope`",
        "no workspace package `ferrisix-nothing`",
        "does not read `--bogus`",
        "no option `--frobnicate`",
    ];
    for e in expect {
        assert!(
            problems.iter().any(|p| p.contains(e)),
            "expected a problem containing {e:?} in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
}
