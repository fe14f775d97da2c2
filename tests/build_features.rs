//! One feature set for the run and the test builds (ADR 0017): every crate
//! `cargo run` compiles is resolved with the same features when `cargo test
//! --workspace` compiles it, so the test build after a run build compiles
//! only what the tests alone use. Read from `cargo tree`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

use std::collections::{BTreeMap, BTreeSet};

/// `crate version` → its features, from `cargo tree` with `args`.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "--prefix", "none"])
        .args(["--format", "{p}|{f}"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((package, list)) = line.split_once('|') else {
            continue;
        };
        // `name vX.Y.Z (path)` or `name vX.Y.Z`; a repeat ends in ` (*)`.
        let mut words = package.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            continue;
        };
        let list = list.trim_end_matches(" (*)");
        found
            .entry(format!("{name} {version}"))
            .or_default()
            .extend(list.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
    }
    found
}

#[test]
fn the_test_build_resolves_the_run_builds_crates_with_the_same_features() {
    // The target graph: build scripts' dependencies resolve apart (resolver 2).
    let run = features(&["-p", "ai-orchestrator", "-e", "normal"]);
    let test = features(&["--workspace", "-e", "normal,dev"]);
    assert!(run.len() > 100, "cargo tree listed too little: {run:?}");
    let differ: Vec<String> = run
        .iter()
        .filter_map(|(krate, features)| {
            let other = test.get(krate)?;
            (other != features).then(|| {
                let added: Vec<_> = other.difference(features).collect();
                let dropped: Vec<_> = features.difference(other).collect();
                format!("{krate}: the test build adds {added:?}, drops {dropped:?}")
            })
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the test build would recompile these (and every crate above them); \
         turn the features on in the service's [dependencies] (docs/adr/0017):\n  {}",
        differ.join("\n  ")
    );
}
