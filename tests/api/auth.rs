//! API-key authentication: the matrix of no key, wrong key, another team's
//! key and admin-only RPCs, with keys from the config and from the database.

use crate::common::{TestApp, config_toml_with};
use ai_orchestrator::{
    api::pb::{self, prompt_admin_client::PromptAdminClient},
    auth::keys::{KeyRecord, KeyStore, hash_hex},
    config::DatabaseConfig,
    store::Store,
};
use std::time::Duration;
use tonic::{Code, Request};
use tonic_types::StatusExt;

const T1_CALLER: &str = "aio_test_t1_caller_key";
const T1_ADMIN: &str = "aio_test_t1_admin_key";
const OPS: &str = "aio_test_ops_all_teams_admin";
const STORED: &str = "aio_test_stored_in_database";

fn auth_toml(db_url: &str) -> String {
    let extra = format!(
        r#"
[auth]
enabled = true
refresh_interval = "100ms"
[[auth.keys]]
name = "sms-pipeline"
sha256 = "{}"
teams = ["t1"]
[[auth.keys]]
name = "t1-admin"
sha256 = "{}"
teams = ["t1"]
role = "admin"
[[auth.keys]]
name = "ops"
sha256 = "{}"
teams = ["*"]
role = "admin"
"#,
        hash_hex(T1_CALLER),
        hash_hex(T1_ADMIN),
        hash_hex(OPS)
    );
    config_toml_with(db_url, "latency = \"1ms\"", "latency = \"1ms\"", &extra)
}

fn with_key<T>(key: Option<&str>, body: T) -> Request<T> {
    let mut req = Request::new(body);
    req.metadata_mut()
        .insert("x-trace-id", "auth-test-trace".parse().unwrap());
    if let Some(key) = key {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    req
}

fn classify(team: &str) -> pb::ClassifySmsRequest {
    pb::ClassifySmsRequest {
        context: Some(pb::RequestContext {
            team_id: team.into(),
            ..Default::default()
        }),
        message: "Can you call me at 5?".into(),
        ..Default::default()
    }
}

fn assert_denied(status: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, reason, "{status:?}");
    assert_eq!(
        info.metadata.get("trace_id").map(String::as_str),
        Some("auth-test-trace")
    );
    assert_eq!(
        status.metadata().get("x-trace-id").unwrap(),
        "auth-test-trace"
    );
}

#[tokio::test]
async fn the_auth_matrix_holds_for_every_rpc() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("auth.db").display());
    let app = TestApp::spawn_toml(&auth_toml(&url)).await;
    let mut client = app.client.clone();

    // No key, a wrong key: UNAUTHENTICATED, before anything else is looked at.
    let status = client
        .classify_sms(with_key(None, classify("t1")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::Unauthenticated, "API_KEY_MISSING");
    let status = client
        .classify_sms(with_key(Some("aio_wrong"), classify("t1")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::Unauthenticated, "API_KEY_INVALID");
    let status = client
        .get_provider_health(with_key(None, pb::GetProviderHealthRequest {}))
        .await
        .unwrap_err();
    assert_denied(&status, Code::Unauthenticated, "API_KEY_MISSING");

    // The right key for its team works; for another team it is refused.
    let ok = client
        .classify_sms(with_key(Some(T1_CALLER), classify("t1")))
        .await
        .unwrap();
    assert!(ok.into_inner().meta.is_some());
    let status = client
        .classify_sms(with_key(Some(T1_CALLER), classify("t2")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "TEAM_NOT_ALLOWED");
    let execute = pb::ExecuteRequest {
        context: classify("t2").context,
        task: "meeting_brief".into(),
        input: Some(pb::execute_request::Input::InputJson("{}".into())),
        ..Default::default()
    };
    let status = client
        .execute(with_key(Some(T1_CALLER), execute))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "TEAM_NOT_ALLOWED");

    // GetUsage: own team yes, another team no; an all-teams key reads any.
    let usage = |team: &str| pb::GetUsageRequest {
        team_id: team.into(),
        ..Default::default()
    };
    let own = client
        .get_usage(with_key(Some(T1_CALLER), usage("t1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.totals.unwrap().requests, 1, "the one allowed call");
    let status = client
        .get_usage(with_key(Some(T1_CALLER), usage("t2")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "TEAM_NOT_ALLOWED");
    client
        .get_usage(with_key(Some(OPS), usage("t2")))
        .await
        .unwrap();
    client
        .get_provider_health(with_key(Some(T1_CALLER), pb::GetProviderHealthRequest {}))
        .await
        .unwrap();

    // PromptAdmin: admin role only, within its teams; global prompts need
    // an all-teams admin. The audit trail names the key, not `x-actor`.
    let mut admin = PromptAdminClient::new(app.channel.clone());
    let create = |team: &str| pb::CreatePromptVersionRequest {
        team_id: team.into(),
        prompt_key: "sms_classify".into(),
        system_prompt: "You classify SMS.".into(),
        user_prompt_template: "{{message}}".into(),
        activate: true,
        ..Default::default()
    };
    let status = admin
        .create_prompt_version(with_key(Some(T1_CALLER), create("t1")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "ADMIN_REQUIRED");
    let status = admin
        .create_prompt_version(with_key(Some(T1_ADMIN), create("t2")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "ADMIN_REQUIRED");
    let status = admin
        .create_prompt_version(with_key(Some(T1_ADMIN), create("")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "ADMIN_REQUIRED");
    let status = admin
        .list_prompts(with_key(
            Some(T1_ADMIN),
            pb::ListPromptsRequest {
                team_id: "*".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "ADMIN_REQUIRED");
    let mut req = with_key(Some(T1_ADMIN), create("t1"));
    req.metadata_mut()
        .insert("x-actor", "someone-else".parse().unwrap());
    let created = admin
        .create_prompt_version(req)
        .await
        .unwrap()
        .into_inner()
        .prompt
        .unwrap();
    assert_eq!(created.created_by, "t1-admin");
    admin
        .create_prompt_version(with_key(Some(OPS), create("")))
        .await
        .unwrap();
    let status = admin
        .list_prompts(with_key(None, pb::ListPromptsRequest::default()))
        .await
        .unwrap_err();
    assert_denied(&status, Code::Unauthenticated, "API_KEY_MISSING");

    // Health checks and reflection need no key (probes carry none).
    let mut health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    app.stop().await;
}

#[tokio::test]
async fn keys_in_the_database_work_and_revocation_takes_effect_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("keys.db").display());
    // Created before start (as by `ai-orchestrator keys create`): loaded at start-up.
    let store = Store::connect(&DatabaseConfig {
        url: url.clone(),
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let keys = KeyStore::new(store.clone());
    keys.insert(&KeyRecord {
        name: "crm-sync".into(),
        key_sha256: hash_hex(STORED),
        teams: "t1,t3".into(),
        role: "caller".into(),
        created_at_ms: 0,
        revoked_at_ms: None,
    })
    .await
    .unwrap();

    let app = TestApp::spawn_toml(&auth_toml(&url)).await;
    let mut client = app.client.clone();
    client
        .classify_sms(with_key(Some(STORED), classify("t3")))
        .await
        .unwrap();
    let status = client
        .classify_sms(with_key(Some(STORED), classify("t2")))
        .await
        .unwrap_err();
    assert_denied(&status, Code::PermissionDenied, "TEAM_NOT_ALLOWED");

    assert!(keys.revoke("crm-sync", 1).await.unwrap());
    // The server reloads keys every 100 ms.
    let mut refused = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match client
            .classify_sms(with_key(Some(STORED), classify("t3")))
            .await
        {
            Err(s) if s.code() == Code::Unauthenticated => {
                refused = true;
                break;
            }
            Err(s) => panic!("unexpected {s:?}"),
            Ok(_) => {}
        }
    }
    assert!(refused, "a revoked key stops working without a restart");
    store.close().await;
    app.stop().await;
}

#[tokio::test]
async fn keys_cli_creates_lists_and_revokes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let url = format!("sqlite://{}", dir.path().join("cli.db").display());
    std::fs::write(&config, auth_toml(&url)).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&[
        "keys", "create", "--name", "billing", "--teams", "t1,t2", "--role", "admin",
    ]);
    assert!(ok, "{err}");
    let key = out
        .lines()
        .find(|l| l.starts_with("aio_"))
        .expect("the key is printed once")
        .to_owned();

    let store = Store::connect(&DatabaseConfig {
        url,
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    let stored = KeyStore::new(store.clone()).list().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].key_sha256,
        hash_hex(&key),
        "only the hash is stored"
    );
    assert_eq!(
        (stored[0].teams.as_str(), stored[0].role.as_str()),
        ("t1,t2", "admin")
    );
    store.close().await;

    let (ok, out, _) = run(&["keys", "list"]);
    assert!(
        ok && out.contains("billing") && !out.contains(&key),
        "{out}"
    );
    let (ok, _, err) = run(&["keys", "create", "--name", "billing", "--teams", "t1"]);
    assert!(
        !ok && err.contains("billing"),
        "duplicate names are refused: {err}"
    );
    let (ok, _, err) = run(&[
        "keys", "create", "--name", "x", "--teams", "t1", "--role", "root",
    ]);
    assert!(!ok && err.contains("--role"), "{err}");
    let (ok, out, _) = run(&["keys", "revoke", "--name", "billing"]);
    assert!(ok, "{out}");
    let (ok, out, _) = run(&["keys", "list"]);
    assert!(ok && out.contains("REVOKED"), "{out}");
}
