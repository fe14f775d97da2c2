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
        ("cluster", BOTTOM),
        ("guardrails", BOTTOM),
        ("audit", &["domain", "config", "telemetry", "store"][..]),
        (
            "tools",
            &["domain", "config", "telemetry", "store", "audit", "cluster"][..],
        ),
        (
            "usage",
            &["domain", "config", "telemetry", "store", "audit"][..],
        ),
        (
            "prompts",
            &["domain", "config", "telemetry", "store", "audit"][..],
        ),
        (
            "auth",
            &["domain", "config", "telemetry", "store", "audit"][..],
        ),
        // Providers, and the guards around them.
        ("providers", BOTTOM),
        (
            "resilience",
            &["domain", "config", "telemetry", "cluster"][..],
        ),
        (
            "router",
            &[
                "domain",
                "config",
                "telemetry",
                "providers",
                "resilience",
                "cluster",
            ][..],
        ),
        // The tasks, run inside a call.
        (
            "tasks",
            &[
                "domain",
                "config",
                "telemetry",
                "router",
                "prompts",
                "usage",
            ][..],
        ),
        // Agents' parts, run inside a call: conversations, prompt layers,
        // memory suggestions.
        ("agent", &["domain", "config", "telemetry", "store"][..]),
        // The pipeline.
        (
            "call",
            &[
                "agent",
                "domain",
                "config",
                "telemetry",
                "store",
                "auth",
                "providers",
                "router",
                "prompts",
                "usage",
                "audit",
                "tools",
                "tasks",
                "guardrails",
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
                "resilience",
                "cluster",
                "router",
                "prompts",
                "usage",
                "audit",
                "tools",
                "auth",
                "tasks",
                "agent",
                "call",
            ][..],
        ),
        // The HTTP edge renders failures through gRPC's one mapping
        // (`api::error`) and shares its envelope checks and access log.
        (
            "web",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "auth",
                "agent",
                "call",
                "api",
            ][..],
        ),
        // The ops console reads the services GetUsage, GetProviderHealth and
        // AuditService read, and decides approvals through the pipeline.
        (
            "console",
            &[
                "domain",
                "config",
                "telemetry",
                "store",
                "resilience",
                "usage",
                "audit",
                "tools",
                "auth",
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
                "audit",
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
                "cluster",
                "router",
                "prompts",
                "usage",
                "audit",
                "tools",
                "auth",
                "tasks",
                "agent",
                "call",
                "api",
                "web",
                "console",
                "guardrails",
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
            // The leading name of each depth-0 item of the group.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend(leading_name(&item));
                        item.clear();
                    }
                    c if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            found.extend(leading_name(&item));
        } else {
            found.extend(leading_name(rest));
        }
    }
    found
}

/// The identifier `text` starts with (after whitespace), if any.
fn leading_name(text: &str) -> Option<String> {
    let name: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The module each `#[macro_export]` macro is defined in: a macro is
/// reached through the crate root (`crate::on_store!`), but it belongs to
/// its home module's layer.
fn macro_homes(files: &[(String, String)]) -> BTreeMap<String, String> {
    let mut homes = BTreeMap::new();
    for (top, source) in files {
        let mut rest = source.as_str();
        while let Some(at) = rest.find("#[macro_export]") {
            rest = &rest[at..];
            if let Some(def) = rest.find("macro_rules!") {
                let after = &rest[def + "macro_rules!".len()..];
                if let Some(name) = leading_name(after) {
                    homes.insert(name, top.clone());
                }
            }
            rest = &rest["#[macro_export]".len()..];
        }
    }
    homes
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
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|file| {
            let top = file
                .strip_prefix(&src)
                .unwrap()
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            (top, fs::read_to_string(file).unwrap())
        })
        .collect();
    let macros = macro_homes(&sources);
    let mut broken = Vec::new();
    for (file, (top, source)) in files.iter().zip(&sources) {
        let relative = file.strip_prefix(&src).unwrap();
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
        for used in imports(source) {
            let used = macros.get(&used).cloned().unwrap_or(used);
            if used == *top || !allowed.contains_key(used.as_str()) {
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
                  let x = crate::tasks::run();\n// crate::api::nope\n\
                  use crate::{store, call::X};\nuse crate::{self as c, prompts};\n";
    let found: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(
        found,
        [
            "call", "config", "prompts", "router", "self", "store", "tasks", "usage"
        ]
    );
}

#[test]
fn exported_macros_belong_to_their_home_module() {
    let files = [(
        "store".to_owned(),
        "#[macro_export]\nmacro_rules! on_store { () => {} }\n".to_owned(),
    )];
    let homes = macro_homes(&files);
    assert_eq!(homes.get("on_store").map(String::as_str), Some("store"));
}

/// The rules the one-driver shape rests on (docs/architecture.md), pinned
/// so that widening the table above cannot quietly break them: a feature
/// knows no edge and not the pipeline that runs it (it sees its session),
/// a provider knows no feature, the router, resilience nor the pipeline,
/// and resilience classifies errors without a provider.
#[test]
fn features_know_no_edge_and_providers_no_feature() {
    const EDGES: &[&str] = &["api", "cli", "server"];
    let allowed = allowed();
    let may = |module: &str, other: &str| allowed[module].contains(&other);
    let mut broken = Vec::new();
    for feature in ["tasks", "agent", "tools"] {
        for upper in EDGES.iter().chain(&["call"]) {
            if may(feature, upper) {
                broken.push(format!("feature `{feature}` may import `{upper}`"));
            }
        }
    }
    let above_providers = ["tasks", "agent", "tools", "router", "resilience", "call"];
    for upper in EDGES.iter().chain(&above_providers) {
        if may("providers", upper) {
            broken.push(format!("`providers` may import `{upper}`"));
        }
    }
    for module in ["resilience", "tasks", "agent", "api", "cli"] {
        if may(module, "providers") {
            broken.push(format!("`{module}` may import `providers`"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Whether `relative` (a path under `src/`) is a store implementation: the connections in
/// `store/`, or a room's `sql` module (`sql.rs`, or anything under a `sql/` folder).
fn is_store_implementation(relative: &Path) -> bool {
    relative.starts_with("store")
        || relative
            .components()
            .any(|c| c.as_os_str() == "sql" || c.as_os_str() == "sql.rs")
}

/// What gives a line away as SQL or a database driver: a statement literal, a driver path,
/// or running a query on either backend.
fn speaks_sql(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    const MARKS: &[&str] = &[
        "sqlx::",
        "rusqlite::",
        "on_store!",
        "impl_for_both_pools!",
        "\"SELECT ",
        "\"INSERT INTO",
        "\"UPDATE ",
        "\"DELETE FROM",
        "\"WITH ",
        "\"CREATE ",
    ];
    MARKS.iter().any(|mark| code.contains(mark))
}

/// Services reach their tables through a repository: SQL sits in the store
/// implementations only (docs/architecture.md, "Storage").
#[test]
fn no_sql_outside_the_store_implementations() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    visit(&src, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        if is_store_implementation(relative) || relative == Path::new("main.rs") {
            continue;
        }
        let source = fs::read_to_string(file).unwrap();
        for (n, line) in source.lines().enumerate() {
            if speaks_sql(line) {
                broken.push(format!("{}:{}: {}", relative.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "SQL outside a store implementation (move it to the room's `sql` module):\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_sql_reader_knows_store_implementations_and_statements() {
    assert!(is_store_implementation(Path::new("store/mod.rs")));
    assert!(is_store_implementation(Path::new("audit/store/sql.rs")));
    assert!(is_store_implementation(Path::new(
        "usage/ledger/sql/sqlite/writer.rs"
    )));
    assert!(!is_store_implementation(Path::new("usage/summary.rs")));
    assert!(!is_store_implementation(Path::new("tools/sqlish.rs")));
    assert!(speaks_sql("    sqlx::query(\"x\")"));
    assert!(speaks_sql("const Q: &str = \"SELECT id FROM t\";"));
    assert!(!speaks_sql("    // \"SELECT \" in a comment"));
    assert!(!speaks_sql("/// Selects the model."));
}
