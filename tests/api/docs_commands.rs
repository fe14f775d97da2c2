//! The commands README.md and docs/ show, run as written against the bundled
//! configs, so a newcomer's copy and paste keeps working (issue #51). Every
//! line of a `sh`/`bash` block that runs the binary (`cargo run -- …`,
//! `ai-orchestrator …`) and every `$ ` line of a `console` block runs in
//! bash, where `cargo run --` and `ai-orchestrator` stand for the built
//! binary, against a server started on `config/local.toml` (its own ports
//! and SQLite file). A console block's command whose output starts with
//! `error:` must fail; every other must succeed. Not run: `serve` (the
//! server is already up), lines naming files under `/tmp/` (a page's own
//! scratch config) and lines with an `<id>` to fill in.

use super::observability::free_port;
use std::{path::Path, time::Duration};
use wiremock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{header, method, path},
};

/// One command a page shows.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    /// `file:line`.
    at: String,
    text: String,
    /// The page shows it failing (a console block's `error:` output).
    fails: bool,
}

/// The binary's commands in `doc`'s shell blocks, continuation lines joined.
fn shown(file: &str, doc: &str) -> Vec<Shown> {
    let mut found: Vec<Shown> = Vec::new();
    let mut block: Option<String> = None;
    let mut continues = false;
    let mut output_of_last = false;
    for (n, line) in doc.lines().enumerate() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None => Some(lang.trim().to_owned()),
            };
            continues = false;
            continue;
        }
        let Some(lang) = block.as_deref() else {
            continue;
        };
        if continues {
            if let Some(last) = found.last_mut() {
                last.text.push('\n');
                last.text.push_str(line);
            }
            continues = line.trim_end().ends_with('\\');
            continue;
        }
        let command = match lang {
            "console" => line.strip_prefix("$ "),
            "sh" | "bash" => Some(line).filter(|l| runs_the_binary(l)),
            _ => None,
        };
        match command {
            Some(text) => {
                found.push(Shown {
                    at: format!("{file}:{}", n + 1),
                    text: text.to_owned(),
                    fails: false,
                });
                continues = text.trim_end().ends_with('\\');
                output_of_last = lang == "console";
            }
            None if output_of_last && line.starts_with("error:") => {
                if let Some(last) = found.last_mut() {
                    last.fails = true;
                }
                output_of_last = false;
            }
            None => output_of_last = false,
        }
    }
    found.retain(|c| c.text.contains("printf ") || runs_the_binary(&c.text) && !skipped(&c.text));
    found
}

fn runs_the_binary(line: &str) -> bool {
    line.starts_with("cargo run -- ") || line.starts_with("ai-orchestrator ")
}

fn skipped(text: &str) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    words.contains(&"serve") || text.contains("/tmp/") || text.contains("<id>")
}

/// Runs `command` in bash in `dir`, the binary standing in for both spellings.
async fn run(command: &str, dir: &Path, env: &[(&str, String)]) -> (bool, String) {
    const PRELUDE: &str = r#"ai-orchestrator() { "$AIO_BIN" "$@"; }
cargo() { if [ "$1" = run ] && [ "$2" = -- ]; then shift 2; "$AIO_BIN" "$@"; else echo "not cargo run: $*" >&2; return 99; fi; }
"#;
    let child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!("{PRELUDE}{command}"))
        .current_dir(dir)
        .env("AIO_BIN", env!("CARGO_BIN_EXE_ai-orchestrator"))
        .env_remove("AIO_API_KEY")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .expect("the command ends within a minute")
        .expect("bash runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Starts the binary with `args` in `dir` and waits until it serves on `port`.
async fn serve(
    args: &[&str],
    dir: &Path,
    env: &[(&str, String)],
    port: u16,
) -> tokio::process::Child {
    let server = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    crate::common::connect(([127, 0, 0, 1], port).into()).await;
    server
}

/// The repository's root, as the pages' relative paths (`config/…`) expect.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<(String, String)> {
    let mut pages = vec![("README.md".to_owned(), root().join("README.md"))];
    let mut docs: Vec<_> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for doc in docs {
        let name = format!("docs/{}", doc.file_name().unwrap().to_string_lossy());
        pages.push((name, doc));
    }
    pages
        .into_iter()
        .map(|(name, file)| {
            let text = std::fs::read_to_string(file).unwrap();
            (name, text)
        })
        .collect()
}

#[test]
fn the_reader_finds_commands_continuations_and_expected_errors() {
    let doc = "text\n```sh\ncargo run -- call providers   # note\ncargo build\n```\n\
               ```console\n$ ai-orchestrator prompts add --key k \\\n    --actor a\nadded\n\n\
               $ ai-orchestrator prompts add --key bad\nerror: no\n```\n\
               ```sh\ncargo run -- serve\nai-orchestrator call converse --conversation <id> x\n```\n";
    let found = shown("p.md", doc);
    let texts: Vec<(&str, bool)> = found.iter().map(|c| (c.text.as_str(), c.fails)).collect();
    assert_eq!(
        texts,
        [
            ("cargo run -- call providers   # note", false),
            (
                "ai-orchestrator prompts add --key k \\\n    --actor a",
                false
            ),
            ("ai-orchestrator prompts add --key bad", true),
        ]
    );
    assert_eq!(found[0].at, "p.md:3");
}

/// Every shown command does what its page says, on the defaults.
#[tokio::test]
async fn every_command_the_docs_show_runs_on_the_defaults() {
    let commands: Vec<Shown> = pages()
        .iter()
        .flat_map(|(name, text)| shown(name, text))
        .collect();
    assert!(
        commands.len() >= 25,
        "the reader lost the pages' commands: {commands:#?}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("config"), dir.path().join("config")).unwrap();
    let port = free_port();
    let env = vec![
        (
            "AIO_CONFIG",
            root().join("config/local.toml").display().to_string(),
        ),
        ("AIO_SERVER__LISTEN", format!("127.0.0.1:{port}")),
        (
            "AIO_SERVER__METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("AIO_HTTP__LISTEN", "127.0.0.1:0".to_owned()),
        ("AIO_ADDR", format!("127.0.0.1:{port}")),
        (
            "DATABASE_URL",
            format!("sqlite://{}", dir.path().join("aio.db").display()),
        ),
        // example.toml's providers read their keys; nothing here calls them.
        ("OPENAI_API_KEY", "sk-docs".to_owned()),
        ("ANTHROPIC_API_KEY", "sk-docs".to_owned()),
        ("PERPLEXITY_API_KEY", "sk-docs".to_owned()),
    ];
    let _server = serve(&["serve"], dir.path(), &env, port).await;
    let mut wrong = Vec::new();
    for command in &commands {
        let (ok, output) = run(&command.text, dir.path(), &env).await;
        if ok == command.fails {
            let wanted = if command.fails { "fail" } else { "succeed" };
            wrong.push(format!(
                "{}: should {wanted}: {}\n{output}",
                command.at, command.text
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// `config/openai.toml`, README's one-key run: every task and the agent on
/// OpenAI, the key read from `OPENAI_API_KEY` and sent as OpenAI expects.
#[tokio::test]
async fn the_one_key_openai_config_serves_calls() {
    let openai = MockServer::start().await;
    let answer = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": "{\"intent\":\"CALLBACK_LATER\",\"confidence\":0.9,\"reason\":\"asks for a call\"}"},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    });
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-one-key"))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer))
        .mount(&openai)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env = vec![
        ("OPENAI_API_KEY", "sk-one-key".to_owned()),
        (
            "AIO_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", openai.uri()),
        ),
        ("AIO_SERVER__LISTEN", format!("127.0.0.1:{port}")),
        (
            "AIO_SERVER__METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("AIO_ADDR", format!("127.0.0.1:{port}")),
        (
            "DATABASE_URL",
            format!("sqlite://{}", dir.path().join("aio.db").display()),
        ),
    ];
    let config = root().join("config/openai.toml").display().to_string();
    let (ok, output) = run(
        &format!("ai-orchestrator --config {config} check-config"),
        dir.path(),
        &env,
    )
    .await;
    assert!(ok, "{output}");
    let _server = serve(&["--config", &config, "serve"], dir.path(), &env, port).await;
    let (ok, output) = run(
        "ai-orchestrator call --team t1 classify-sms \"Yes - call me tomorrow\"",
        dir.path(),
        &env,
    )
    .await;
    assert!(ok, "{output}");
    assert!(output.contains("CALLBACK_LATER"), "{output}");
    assert!(output.contains("\"provider\": \"openai\""), "{output}");
    assert_eq!(openai.received_requests().await.unwrap().len(), 1);
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `doc`'s headings (outside code blocks).
fn anchors(doc: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Every relative link between the pages names a file that exists and, with
/// a `#fragment`, a heading it has.
#[test]
fn links_between_the_pages_resolve() {
    let pages = pages();
    let mut broken = Vec::new();
    for (name, text) in &pages {
        let dir = Path::new(name).parent().unwrap_or(Path::new(""));
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                Path::new(name).to_path_buf()
            } else {
                dir.join(file)
            };
            let Ok(linked) = std::fs::read_to_string(root().join(&path)) else {
                if !root().join(&path).is_dir() {
                    broken.push(format!("{name}: {target}: no such file"));
                }
                continue;
            };
            if !fragment.is_empty()
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&linked).iter().any(|a| a == fragment)
            {
                broken.push(format!("{name}: {target}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor(" 13. Tracing (OpenTelemetry)"),
        "13-tracing-opentelemetry"
    );
    assert_eq!(anchor(" `call --team` and `x`"), "call---team-and-x");
}
