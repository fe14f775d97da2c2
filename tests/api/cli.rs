//! The command line, running the real binary: `prompts add|list|activate`
//! against a temp SQLite database then served from it, the `call` client
//! mode against a real server (flags before or after the RPC name), and
//! `check-config` exit codes.

use crate::common::{TestApp, config_toml};
use ai_orchestrator::api::pb;
use std::path::Path;

/// Runs the binary with `args`; returns (success, stdout, stderr).
async fn run(args: &[&str]) -> (bool, String, String) {
    run_env(args, &[]).await
}

/// Like [`run`], with `vars` set in the binary's environment.
pub(crate) async fn run_env(args: &[&str], vars: &[(&str, &str)]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(args)
        // Only the arguments given here count, not the developer's shell.
        .env_remove("AIO_CONFIG")
        .env_remove("AIO_ADDR")
        .env_remove("AIO_API_KEY")
        .env_remove("DATABASE_URL")
        .envs(vars.iter().copied())
        .output()
        .await
        .expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

#[tokio::test]
async fn prompts_managed_by_the_cli_are_served_from_the_same_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("cli.db").display());
    let toml = config_toml(&url, "latency = \"1ms\"", "latency = \"1ms\"");
    let config = dir.path().join("aio.toml");
    std::fs::write(&config, &toml).unwrap();
    let template_file = dir.path().join("t1.txt");
    std::fs::write(&template_file, "<message>{{message}}</message>").unwrap();
    let config = path_str(&config);
    let add = |extra: &'static [&'static str]| {
        let mut args = vec![
            "--config",
            config,
            "prompts",
            "add",
            "--key",
            "sms_classify",
            "--system",
            "Classify the SMS; answer JSON.",
            "--actor",
            "alice",
        ];
        args.extend_from_slice(extra);
        args
    };
    let template = "<history>{{history}}</history> <message>{{message}}</message>";

    // Global v1, v2; v3 added active; then v2 activated by bob.
    for (expected, activate) in [("v1", false), ("v2", false), ("v3", true)] {
        let mut args = add(&[]);
        args.extend(["--template", template]);
        if activate {
            args.push("--activate");
        }
        let (ok, out, err) = run(&args).await;
        assert!(ok, "{err}");
        assert!(
            out.starts_with(&format!("added sms_classify {expected} for (global)")),
            "{out}"
        );
    }
    let (ok, out, err) = run(&[
        "--config",
        config,
        "prompts",
        "activate",
        "--key",
        "sms_classify",
        "--version",
        "2",
        "--actor",
        "bob",
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "activated sms_classify v2 for (global)\n");
    // Team t1's own version, template read from a file.
    let mut args = add(&["--team", "t1", "--activate"]);
    let at_file = format!("@{}", path_str(&template_file));
    args.extend(["--template", at_file.as_str()]);
    let (ok, out, err) = run(&args).await;
    assert!(ok, "{err}");
    assert_eq!(out, "added sms_classify v1 for t1 (active)\n");
    // A variable ClassifySms does not provide is refused up front.
    let mut args = add(&[]);
    args.extend(["--template", "{{message}} at {{company}}"]);
    let (ok, _, err) = run(&args).await;
    assert!(!ok && err.contains("`company`"), "{err}");

    let (ok, out, err) = run(&[
        "--config",
        config,
        "prompts",
        "list",
        "--key",
        "sms_classify",
    ])
    .await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let active: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l.contains("ACTIVE"))
        .map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next().unwrap(), cols.nth(1).unwrap())
        })
        .collect();
    assert_eq!(active, [("(global)", "v2"), ("t1", "v1")], "{out}");
    assert!(lines.iter().all(|l| l.ends_with("by=alice")), "{out}");

    // A server on the same database uses the activated versions.
    let app = TestApp::spawn_toml(&toml).await;
    let mut client = app.client.clone();
    for (team, version) in [("t2", 2), ("t1", 1)] {
        let r = client
            .classify_sms(pb::ClassifySmsRequest {
                context: Some(pb::RequestContext {
                    team_id: team.into(),
                    ..Default::default()
                }),
                message: "What's the price?".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let meta = r.meta.unwrap();
        assert_eq!(
            (meta.prompt_key.as_str(), meta.prompt_version),
            ("sms_classify", version),
            "team {team}"
        );
    }
    app.stop().await;
    // The calls updated the stats the CLI shows.
    let (ok, out, err) = run(&[
        "--config",
        config,
        "prompts",
        "list",
        "--team",
        "",
        "--key",
        "sms_classify",
    ])
    .await;
    assert!(ok, "{err}");
    let v2 = out.lines().find(|l| l.contains(" v2 ")).unwrap();
    assert!(
        v2.contains("uses=1 ") && v2.contains("success=1.00"),
        "{out}"
    );
}

#[tokio::test]
async fn call_prints_the_answer_with_flags_before_or_after_the_rpc() {
    let app = TestApp::spawn().await;
    let addr = format!("http://{}", app.addr);
    for args in [
        vec![
            "call",
            "--addr",
            &addr,
            "--team",
            "t1",
            "classify-sms",
            "STOP",
        ],
        vec![
            "call",
            "classify-sms",
            "--team",
            "t1",
            "--addr",
            &addr,
            "STOP",
        ],
        vec![
            "call",
            "classify-sms",
            "STOP",
            "--trace-id",
            "cli-trace-1",
            "--team",
            "t1",
            "--addr",
            &addr,
        ],
    ] {
        let (ok, out, err) = run(&args).await;
        assert!(ok, "{args:?}: {err}");
        // The proto3 JSON mapping, as grpcurl prints it.
        let reply: serde_json::Value = serde_json::from_str(&out).expect(&out);
        assert_eq!(reply["intent"], "SMS_INTENT_OPT_OUT", "{out}");
        assert_eq!(reply["confidence"], 1.0, "{out}");
        assert_eq!(reply["meta"]["promptKey"], "opt_out_keyword", "{out}");
    }
    let (_, out, _) = run(&[
        "call",
        "classify-sms",
        "STOP",
        "--trace-id",
        "cli-trace-1",
        "--addr",
        &addr,
    ])
    .await;
    let reply: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(reply["meta"]["traceId"], "cli-trace-1", "{out}");
    // A line per field for reading.
    let (ok, out, err) = run(&[
        "call",
        "classify-sms",
        "STOP",
        "--output",
        "text",
        "--addr",
        &addr,
    ])
    .await;
    assert!(ok, "{err}");
    assert!(
        err.starts_with("acting for team `demo` (the default"),
        "{err}"
    );
    assert!(
        out.lines().any(|l| l == "intent: SMS_INTENT_OPT_OUT"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l == "meta.promptKey: opt_out_keyword"),
        "{out}"
    );
    // Errors exit non-zero with the reason.
    let (ok, _, err) = run(&["call", "classify-sms", "", "--team", "t1", "--addr", &addr]).await;
    assert!(!ok && err.contains("INVALID_INPUT"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn check_config_exit_codes_name_the_bad_key() {
    let (ok, out, err) = run(&["--config", "config/local.toml", "check-config"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("config OK"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let local = std::fs::read_to_string("config/local.toml").unwrap();
    for (from, to, key) in [
        (
            "shutdown_grace = ",
            "shutdown_grase = ",
            "server.shutdown_grase",
        ),
        (
            "review_threshold = 0.70",
            "review_threshold = 1.5",
            "tasks.sms_classify.review_threshold",
        ),
    ] {
        assert!(local.contains(from), "local.toml changed: {from}");
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, local.replacen(from, to, 1)).unwrap();
        let (ok, _, err) = run(&["--config", path_str(&bad), "check-config"]).await;
        assert!(!ok, "{key}: must fail");
        assert!(err.contains(key) && err.contains("bad.toml"), "{err}");
    }
}

/// A value set by the environment is blamed on its variable, not on the
/// config file; a misspelled `AIO_` variable is refused, naming it.
#[tokio::test]
async fn config_errors_name_the_environment_variable_that_set_the_value() {
    let config = ["--config", "config/local.toml", "check-config"];
    for (var, value, expected) in [
        (
            "DATABASE_URL",
            "mysql://db/aio",
            "environment variable DATABASE_URL: database.url:",
        ),
        (
            "AIO_SERVER__BOGUS",
            "1",
            "environment variable AIO_SERVER__BOGUS: server.bogus:",
        ),
        (
            "AIO_SERVER__SHUTDOWN_GRACE",
            "soon",
            "environment variable AIO_SERVER__SHUTDOWN_GRACE: server.shutdown_grace:",
        ),
        (
            "AIO_SERVER_LISTEN",
            "0.0.0.0:50051",
            "environment variable AIO_SERVER_LISTEN: server: maps to no config key",
        ),
    ] {
        let (ok, _, err) = run_env(&config, &[(var, value)]).await;
        assert!(!ok, "{var} must fail");
        assert!(err.contains(expected), "{var}: {err}");
        assert!(!err.contains("config/local.toml"), "{var}: {err}");
    }
    // A wrong value in the file still names the file.
    let dir = tempfile::tempdir().unwrap();
    let local = std::fs::read_to_string("config/local.toml").unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        local.replacen("shutdown_grace = ", "shutdown_grace = 7 #", 1),
    )
    .unwrap();
    let (ok, _, err) = run(&["--config", path_str(&bad), "check-config"]).await;
    assert!(!ok);
    assert!(err.contains("bad.toml: server.shutdown_grace:"), "{err}");
}

/// `healthcheck` is a gRPC health client: exit 0 and `SERVING` from a
/// running server, non-zero when nothing answers.
#[tokio::test]
async fn healthcheck_asks_the_grpc_health_service() {
    let app = TestApp::spawn().await;
    let addr = format!("http://{}", app.addr);
    let (ok, out, err) = run(&["healthcheck", "--addr", &addr]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "SERVING");
    let closed = format!("http://127.0.0.1:{}", app.addr.port());
    app.stop().await;
    let (ok, _, err) = run(&["healthcheck", "--addr", &closed]).await;
    assert!(!ok);
    assert!(err.contains(&closed), "{err}");
}

#[tokio::test]
async fn converse_into_a_pipe_its_reader_closed_stops_quietly() {
    // `looper` answers with tool calls twice: a turn of many events.
    let app = crate::agents::spawn("http://127.0.0.1:9", "http://127.0.0.1:9", "").await;
    let addr = format!("http://{}", app.addr);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["call", "converse", "--agent", "looper", "--team", "t1"])
        .args(["--api-key", crate::tools::CALLER, "--addr", &addr, "go"])
        .env_remove("AIO_ADDR")
        .env_remove("AIO_API_KEY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // As `| head -0`: the reader is gone before the first event.
    drop(child.stdout.take());
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    app.stop().await;
}
