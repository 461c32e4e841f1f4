//! Every command the documentation shows is run by a test. Each fenced shell block (`sh`,
//! `bash`, `shell`) of `README.md` and `docs/**/*.md` names its tester in an HTML comment on
//! the lines just above it (`<!-- tested-by: PATH -->`, among other comment lines such as the
//! quick start's markers). This test:
//!
//! * fails when a shell block names no tester, or names a file that does not exist;
//! * runs, page by page and in the page's order, every block that names this file, with bash
//!   against a real ferrisix on the embedded store with an echo upstream, each on free
//!   127.0.0.1 ports. The blocks are written for a user's machine, so the quick start's
//!   addresses, the admin key placeholder and the data directory are replaced by the test
//!   node's before a block runs. Each command of a block (a line, with its `\`
//!   continuations) runs on its own and passes when bash exits 0 (`set -euo pipefail`; the
//!   blocks use `curl -fsS` or compare status codes themselves). Between two commands the
//!   test waits until the data plane serves the store's latest revision, as a user typing
//!   them would.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{Behaviour, StoreGateway, StoreGatewayBuilder, Upstream};

/// The tester name of the blocks this file runs.
const THIS_TESTER: &str = "tests/e2e/docs_commands.rs";

/// One fenced shell block of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ShellBlock {
    /// 1-based line of the opening fence.
    line: usize,
    /// The `tested-by` marker's path, if the block has one.
    tester: Option<String>,
    /// The block's text, without the fences.
    script: String,
}

fn is_shell_fence(line: &str) -> bool {
    matches!(
        line.trim_end().strip_prefix("```"),
        Some("sh" | "bash" | "shell")
    )
}

/// The shell blocks of a markdown page, each with the `tested-by` marker found among the HTML
/// comment lines directly above its opening fence.
fn shell_blocks(page: &str) -> Vec<ShellBlock> {
    let lines: Vec<&str> = page.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if !line.starts_with("```") {
            i += 1;
            continue;
        }
        // The closing fence of this block, whatever its language.
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .unwrap_or(lines.len());
        if is_shell_fence(line) {
            let tester = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let l = l.trim();
                    l.starts_with("<!--") && l.ends_with("-->")
                })
                .find_map(|l| {
                    l.trim()
                        .strip_prefix("<!--")
                        .and_then(|c| c.strip_suffix("-->"))
                        .and_then(|c| c.trim().strip_prefix("tested-by:"))
                        .map(|p| p.trim().to_owned())
                });
            blocks.push(ShellBlock {
                line: i + 1,
                tester,
                script: lines[i + 1..end.min(lines.len())].join("\n"),
            });
        }
        i = end + 1;
    }
    blocks
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every markdown page under `docs/`, as paths relative to the repository.
pub(super) fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = repo_root();
    let mut found = Vec::new();
    walk(&root.join("docs"), &mut found);
    found.sort();
    let mut pages = vec![PathBuf::from("README.md")];
    pages.extend(
        found
            .into_iter()
            .map(|p| p.strip_prefix(&root).unwrap().to_path_buf()),
    );
    pages
}

/// What is wrong with the markers of one page's blocks: a block without a tester, or one whose
/// tester does not exist under `root`.
fn marker_problems(page: &str, blocks: &[ShellBlock], root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for block in blocks {
        match &block.tester {
            None => problems.push(format!(
                "{page}:{}: a shell block with no `<!-- tested-by: PATH -->` line above it",
                block.line
            )),
            Some(tester) if tester.is_empty() || !root.join(tester).is_file() => {
                problems.push(format!(
                    "{page}:{}: tested by `{tester}`, which does not exist",
                    block.line
                ))
            }
            Some(_) => {}
        }
    }
    problems
}

#[test]
fn every_shell_block_names_an_existing_tester() {
    let root = repo_root();
    let mut problems = Vec::new();
    let mut count = 0;
    for page in pages() {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        let blocks = shell_blocks(&text);
        count += blocks.len();
        problems.extend(marker_problems(&page.display().to_string(), &blocks, &root));
    }
    assert!(count > 0, "no shell block found in README.md and docs/");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn markers_are_read_and_checked() {
    let page = "text\n\
                <!-- tested-by: tests/e2e/docs_commands.rs -->\n\
                <!-- quick-start:run -->\n\
                ```sh\n\
                echo one\n\
                ```\n\
                \n\
                ```bash\n\
                echo two\n\
                ```\n\
                <!-- tested-by: tests/no_such_test.rs -->\n\
                ```shell\n\
                echo three\n\
                ```\n\
                <!-- tested-by: tests/e2e/docs_commands.rs -->\n\
                words between\n\
                ```sh\n\
                echo four\n\
                ```\n\
                ```yaml\n\
                key: value\n\
                ```\n";
    let blocks = shell_blocks(page);
    let testers: Vec<_> = blocks.iter().map(|b| b.tester.as_deref()).collect();
    assert_eq!(
        testers,
        vec![
            Some(THIS_TESTER),
            None,
            Some("tests/no_such_test.rs"),
            // The marker is not directly above (a text line is between).
            None,
        ]
    );
    assert_eq!(blocks[0].script, "echo one");
    assert_eq!(blocks[0].line, 4);
    let problems = marker_problems("page.md", &blocks, &repo_root());
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("page.md:8: a shell block with no"));
    assert!(problems[1].contains("tests/no_such_test.rs"));
}

/// The commands of a block: its lines with their `\` continuations joined, blank lines and
/// comments left out.
fn commands(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if !line.trim_end().ends_with('\\') {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[test]
fn commands_join_continuations() {
    let script = "# a comment\ncurl a \\\n  -d b\n\ncurl c\n";
    assert_eq!(commands(script), vec!["curl a \\\n  -d b\n", "curl c\n"]);
}

/// A block made runnable against the test node: the quick start's addresses, the key
/// placeholder and the data directory replaced by the node's.
fn localise(script: &str, gw: &StoreGateway, upstream: &Upstream) -> String {
    let data_dir = format!("{}/", gw.data_dir().display());
    let out = script
        .replace("127.0.0.1:9080", &format!("127.0.0.1:{}", gw.data_port))
        .replace("127.0.0.1:9180", &format!("127.0.0.1:{}", gw.admin_port))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{}", gw.control_port))
        .replace("127.0.0.1:9091", &format!("127.0.0.1:{}", gw.metrics_port))
        .replace("127.0.0.1:1980", &upstream.node())
        .replace("<key>", &gw.admin_key)
        .replace("conf/data/", &data_dir);
    // A default port left over would reach whatever else runs on this machine.
    for port in [":9080", ":9180", ":9090", ":9091", ":1980"] {
        assert!(
            !out.contains(port),
            "a block still names {port} after the test's ports were put in: {script}"
        );
    }
    out
}

/// The store's revision, from the control API.
fn store_revision(gw: &StoreGateway) -> i64 {
    let report = gw.config_report();
    report["store"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("/v1/config has no store revision: {report}"))
}

/// When `command` wrote to the store (its revision moved past `before`), waits until the data
/// plane serves that revision, so that the next command sees what this one wrote (a user
/// typing the commands takes longer than that). Writes outside the configuration do not
/// happen in the pages' commands, so a revision that moved is one the data plane applies.
fn wait_applied(gw: &StoreGateway, before: i64, command: &str) {
    let written = store_revision(gw);
    if written == before {
        return;
    }
    let applied = support::poll_until(Duration::from_secs(10), || {
        gw.config_report()["revision"]
            .as_i64()
            .is_some_and(|applied| applied >= written)
    });
    assert!(
        applied.is_some(),
        "the data plane did not apply revision {written} after:\n{command}\n{}",
        gw.config_report()
    );
}

#[test]
fn blocks_run_against_a_real_node() {
    let root = repo_root();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ferrisix"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for page in pages() {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        let mine: Vec<ShellBlock> = shell_blocks(&text)
            .into_iter()
            .filter(|b| b.tester.as_deref() == Some(THIS_TESTER))
            .collect();
        if mine.is_empty() {
            continue;
        }
        // A fresh node per page: a page's blocks build on each other, pages do not.
        let upstream = Upstream::start("echo", Behaviour::Echo);
        let gw = StoreGatewayBuilder::embedded().start();
        for block in mine {
            let script = localise(&block.script, &gw, &upstream);
            for command in commands(&script) {
                let before = store_revision(&gw);
                run_command(&root, &path, &page, block.line, &command);
                wait_applied(&gw, before, &command);
                ran += 1;
            }
        }
    }
    assert!(ran > 0, "no block is marked `tested-by: {THIS_TESTER}`");
}

/// Runs one command with bash from the repository's root; panics with its output unless it
/// exits 0.
fn run_command(root: &Path, path: &str, page: &Path, line: usize, command: &str) {
    let out = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .env("PATH", path)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}: the block at line {line} failed ({}):\n{command}\n--- stdout\n{}\n--- stderr\n{}",
        page.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
