//! The import graph of `src/` flows one way (the layering written at the top
//! of `src/lib.rs`): a module may use only the modules its layer lists. This
//! reads every `crate::` path in the sources, so an upward import fails here
//! rather than in review.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Who may import whom: each top-level module of `src/` and the modules it
/// may use. Keep in step with the layering in `src/lib.rs`.
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    const BOTTOM: &[&str] = &["domain", "config", "telemetry"];
    BTreeMap::from([
        // Ground floor.
        ("domain", &[][..]),
        ("config", &["domain"][..]),
        ("telemetry", &["domain", "config"][..]),
        // Storage and the services the pipeline calls.
        ("store", BOTTOM),
        ("usage", &["domain", "config", "telemetry", "store"][..]),
        ("prompts", &["domain", "config", "telemetry", "store"][..]),
        ("auth", &["domain", "config", "telemetry", "store"][..]),
        // Providers, and the guards around them.
        ("providers", BOTTOM),
        (
            "resilience",
            &["domain", "config", "telemetry", "providers"][..],
        ),
        (
            "router",
            &["domain", "config", "telemetry", "providers", "resilience"][..],
        ),
        // The tasks, run inside a call.
        (
            "tasks",
            &[
                "domain",
                "config",
                "telemetry",
                "providers",
                "router",
                "prompts",
                "usage",
            ][..],
        ),
        // The pipeline.
        (
            "call",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "providers",
                "resilience",
                "router",
                "prompts",
                "usage",
                "tasks",
            ][..],
        ),
        // The edge.
        (
            "api",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "providers",
                "resilience",
                "router",
                "prompts",
                "usage",
                "auth",
                "tasks",
                "call",
            ][..],
        ),
        (
            "cli",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "prompts",
                "usage",
                "auth",
                "api",
                "server",
            ][..],
        ),
        (
            "server",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "providers",
                "resilience",
                "router",
                "prompts",
                "usage",
                "auth",
                "tasks",
                "call",
                "api",
            ][..],
        ),
    ])
}

/// The top-level modules named by `crate::` paths in `source`, comments
/// left out: `crate::a::b`, and each name of `use crate::{a, b::{c}}`.
fn imports(source: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The names at depth 0 of the group.
            let mut depth = 0;
            let mut name = String::new();
            let mut expect_name = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => expect_name = true,
                    c if depth == 0 && expect_name && (c.is_alphanumeric() || c == '_') => {
                        name.push(c)
                    }
                    _ if depth == 0 && expect_name && !name.is_empty() => {
                        found.insert(std::mem::take(&mut name));
                        expect_name = false;
                    }
                    _ => {}
                }
            }
            if !name.is_empty() {
                found.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            visit(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn imports_only_flow_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = allowed();
    let mut files = Vec::new();
    visit(&src, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        // The crate root and the binary wire everything.
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(may_use) = allowed.get(top.as_str()) else {
            broken.push(format!(
                "{}: module `{top}` has no layer in tests/layers.rs",
                relative.display()
            ));
            continue;
        };
        for used in imports(&fs::read_to_string(file).unwrap()) {
            // Macros exported at the crate root, and the module itself.
            if used == top || used.ends_with('!') || !allowed.contains_key(used.as_str()) {
                continue;
            }
            if !may_use.contains(&used.as_str()) {
                broken.push(format!(
                    "{}: `{top}` may not import `{used}`",
                    relative.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the layering (src/lib.rs):\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_import_reader_sees_groups_and_paths_but_not_comments() {
    let source = "use crate::{\n    config::Config,\n    router::{A, B},\n    usage,\n};\n\
                  let x = crate::tasks::run();\n// crate::api::nope\n";
    let found: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(found, ["config", "router", "tasks", "usage"]);
}
