//! Records what `ferrisix --version` prints about the build: the git commit (with `-dirty`
//! when the tree had changes), or `FERRISIX_COMMIT` from the environment, or `unknown` when
//! built outside a git checkout (a source tarball, a container build without `.git`); the
//! cargo features; the target and profile.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FERRISIX_COMMIT");
    let commit = match std::env::var("FERRISIX_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(hash) => {
                // Rebuilt when HEAD moves (a commit, a checkout) or the index changes.
                for file in ["HEAD", "index"] {
                    if let Some(p) = git(&["rev-parse", "--git-path", file]) {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    if let Some(p) = git(&["rev-parse", "--git-path", &head_ref]) {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                // --no-optional-locks: no index refresh, which would rerun this script every build.
                let dirty = git(&[
                    "--no-optional-locks",
                    "status",
                    "--porcelain",
                    "--untracked-files=no",
                ])
                .is_some();
                if dirty {
                    format!("{hash}-dirty")
                } else {
                    hash
                }
            }
            None => "unknown".to_owned(),
        },
    };
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| {
            k.strip_prefix("CARGO_FEATURE_")
                .map(|f| f.to_lowercase().replace('_', "-"))
        })
        .collect();
    features.sort();
    let features = if features.is_empty() {
        "none".to_owned()
    } else {
        features.join(",")
    };
    println!("cargo:rustc-env=FERRISIX_COMMIT={commit}");
    println!("cargo:rustc-env=FERRISIX_FEATURES={features}");
    println!(
        "cargo:rustc-env=FERRISIX_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=FERRISIX_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_default()
    );
}
