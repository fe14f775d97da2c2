//! Caps from every side: a cost cap refusing with `QuotaFailure`, a refused
//! top-up settling what was already used, and the `limits` CLI (the real
//! binary) setting caps a server enforces.

use super::{Db, FAST, classify, month_now, traced};
use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::usage::bucket::Bucket;
use ai_orchestrator::{
    api::pb,
    usage::{ledger, policy::Caps, record, summary, sweeper},
};
use tonic::Code;
use tonic_types::StatusExt;

async fn cost_cap_refuses(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let store = db.store().await;
    // 0.002 USD: a classify call's worst-case estimate fits (~0.001), its
    // actual cost is far less, so a few calls are admitted before the cap.
    ledger::set_caps(
        &store,
        "t1",
        "",
        Caps {
            cost_micros: Some(2_000),
            ..Caps::default()
        }
        .into(),
        0,
    )
    .await
    .unwrap();
    let mut c = app.client.clone();
    let mut admitted = 0;
    let status = loop {
        match c.classify_sms(classify("What does it cost?")).await {
            Ok(_) => admitted += 1,
            Err(status) => break status,
        }
        assert!(admitted < 200, "the cost cap never refused");
    };
    assert!(admitted >= 1, "the first call fits the cap");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "QUOTA_EXCEEDED");
    assert_eq!(info.metadata["cap"], "monthly_cost_usd");
    assert_eq!(info.metadata["limit"], "0.002000");
    let quota = status.get_details_quota_failure().unwrap();
    assert_eq!(quota.violations[0].subject, "team:t1/month/cost_usd");
    assert_eq!(info.metadata["limit_subject"], "team:t1/month/cost_usd");
    let remaining = &info.metadata["remaining"];
    assert!(
        quota.violations[0]
            .description
            .contains(&format!("{remaining} remaining")),
        "{quota:?}"
    );

    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert!(b.spent_cost_micros <= 2_000, "{b:?}");
    assert_eq!((b.reserved_cost_micros, b.spent_requests), (0, admitted));
    // Refused before any provider call: only the admitted calls have records.
    let s = summary::summarize(&store, "t1", month_now(), i64::MAX, &[])
        .await
        .unwrap();
    assert_eq!(s.totals.requests, admitted as u64);
    assert_eq!(s.totals.cost_micros, b.spent_cost_micros);
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn cost_cap_refuses_with_quota_failure_sqlite() {
    cost_cap_refuses(false).await;
}

#[tokio::test]
async fn cost_cap_refuses_with_quota_failure_postgres() {
    cost_cap_refuses(true).await;
}

/// A server whose model's SMS reply never fits 2 segments, so GenerateSms
/// wants a second, stricter draft; a huge output cap makes each draft's
/// reservation ~100k tokens.
async fn redrafting_app(db: &Db) -> TestApp {
    let too_long = format!(
        "reply = '{{\"reply\":\"{}\",\"escalate\":false,\"escalate_reason\":\"\"}}'",
        "Thanks for reaching out! ".repeat(20)
    );
    let toml = config_toml_with(&db.url(), &too_long, FAST, "").replace(
        "[tasks.sms_generate]\n",
        "[tasks.sms_generate]\nmax_tokens = 100000\n",
    );
    TestApp::spawn_toml(&toml).await
}

async fn refused_top_up_settles_the_first_draft(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = redrafting_app(&db).await;
    let store = db.store().await;
    // Admits the first draft's reservation (~102k), never a second one too.
    ledger::set_caps(
        &store,
        "t1",
        "",
        Caps {
            tokens: Some(150_000),
            ..Caps::default()
        }
        .into(),
        0,
    )
    .await
    .unwrap();
    let reply = app
        .client
        .clone()
        .generate_sms(traced(
            pb::GenerateSmsRequest {
                context: ctx(),
                inbound_message: "Can you tell me about the offer?".into(),
                ..Default::default()
            },
            "top-up-refused",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.escalate && reply.response.is_empty());
    assert!(
        reply.escalate_reason.contains("monthly_tokens"),
        "{}",
        reply.escalate_reason
    );
    let meta = reply.meta.unwrap();
    assert_eq!(meta.attempts.len(), 1, "only the first draft was made");
    let usage = meta.usage.unwrap();

    // Settled at the first draft's actual usage, not cancelled at an estimate.
    let records = record::by_trace(&store, "top-up-refused").await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.outcome, "ok");
    assert_eq!(
        (r.input_tokens as u64, r.output_tokens as u64),
        (usage.input_tokens, usage.output_tokens)
    );
    assert!(r.output_tokens < 1_000, "actual, not the 100k estimate");
    let cost = r.cost_micros.expect("priced model");
    assert!((usage.cost_usd - cost as f64 / 1e6).abs() < 1e-12);
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!(
        (
            b.spent_tokens,
            b.spent_requests,
            b.spent_cost_micros,
            b.reserved_tokens,
            b.reserved_requests
        ),
        (r.input_tokens + r.output_tokens, 1, cost, 0, 0)
    );
    assert_eq!(sweeper::open_reservations(&store).await.unwrap(), 0);
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn refused_top_up_settles_the_first_draft_sqlite() {
    refused_top_up_settles_the_first_draft(false).await;
}

#[tokio::test]
async fn refused_top_up_settles_the_first_draft_postgres() {
    refused_top_up_settles_the_first_draft(true).await;
}

/// `budget.max_cost_usd` bounds the whole request: a redrafted reply's
/// second reservation counts what the first one holds (each is ~$0.126 at
/// the chain's worst price for 100k output tokens; the budget is $0.20).
#[tokio::test]
async fn the_budget_bounds_both_drafts_together() {
    let db = Db::new(false).await;
    let app = redrafting_app(&db).await;
    let reply = app
        .client
        .clone()
        .generate_sms(traced(
            pb::GenerateSmsRequest {
                context: ctx(),
                inbound_message: "Can you tell me about the offer?".into(),
                budget: Some(pb::Budget {
                    max_cost_usd: 0.20,
                    ..Default::default()
                }),
                ..Default::default()
            },
            "budget-both-drafts",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.escalate && reply.response.is_empty());
    assert!(
        reply.escalate_reason.contains("budget.max_cost_usd"),
        "{}",
        reply.escalate_reason
    );
    assert_eq!(reply.meta.unwrap().attempts.len(), 1, "no second draft");
    app.stop().await;
    db.cleanup().await;
}

/// Runs `ai-orchestrator --config <config> limits <args>`; returns stdout.
pub(super) async fn limits_cli(config: &std::path::Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .arg("--config")
        .arg(config)
        .arg("limits")
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run the binary");
    assert!(
        out.status.success(),
        "limits {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn limits_cli_sets_shows_clears_and_the_server_enforces() {
    let db = Db::new(false).await;
    let Db::Sqlite(dir) = &db else { unreachable!() };
    let toml = config_toml_with(
        &db.url(),
        FAST,
        FAST,
        "[metering]\nlimits_refresh = \"100ms\"\n",
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, &toml).unwrap();

    let set = limits_cli(
        &config,
        &[
            "set",
            "--team",
            "t1",
            "--max-requests",
            "2",
            "--max-cost-usd",
            "5",
        ],
    )
    .await;
    assert!(set.starts_with("updated\n"), "{set}");
    let show = limits_cli(&config, &["show", "--team", "t1"]).await;
    assert!(
        show.contains("max_requests 2  (used 0 + reserved 0)"),
        "{show}"
    );
    assert!(show.contains("max_cost_usd 5.000000"), "{show}");
    assert!(show.contains("max_tokens   unlimited"), "{show}");

    // A server on the same database enforces the cap the CLI set.
    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    for _ in 0..2 {
        c.classify_sms(classify("Hello there")).await.unwrap();
    }
    let status = c.classify_sms(classify("Hello again")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.get_details_quota_failure().unwrap().violations[0].subject,
        "team:t1/month/requests"
    );
    let show = limits_cli(&config, &["show", "--team", "t1"]).await;
    assert!(
        show.contains("max_requests 2  (used 2 + reserved 0)"),
        "{show}"
    );

    let cleared = limits_cli(&config, &["clear", "--team", "t1"]).await;
    assert_eq!(
        cleared,
        "team t1: override removed, config defaults apply\n"
    );
    let show = limits_cli(&config, &["show", "--team", "t1"]).await;
    assert!(show.contains("max_requests unlimited"), "{show}");
    // The running server admits in memory (SQLite file) and reads a team's
    // caps again once they are older than `metering.limits_refresh`: a
    // call is refused (no record, nothing charged) until it has.
    crate::common::wait_for(|| {
        let mut c = c.clone();
        async move { c.classify_sms(classify("Third time lucky")).await.is_ok() }
    })
    .await;
    let again = limits_cli(&config, &["clear", "--team", "t1"]).await;
    assert_eq!(again, "team t1 had no override\n");
    app.stop().await;
    db.cleanup().await;
}

/// `limits set` with one cap never lifts the others: a cap not given keeps
/// its value in force (here the config's default cost cap), and the output
/// says so; `unlimited` lifts a cap on purpose.
#[tokio::test]
async fn setting_one_cap_keeps_the_others_in_force() {
    let db = Db::new(false).await;
    let Db::Sqlite(dir) = &db else { unreachable!() };
    let toml = config_toml_with(
        &db.url(),
        FAST,
        FAST,
        "[metering.default_limits]\nmax_cost_usd = 5.0\nmax_tokens = 900000\n",
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, &toml).unwrap();

    let set = limits_cli(&config, &["set", "--team", "t2", "--max-requests", "1"]).await;
    assert!(set.contains("max_requests 1 "), "{set}");
    assert!(set.contains("max_cost_usd 5.000000"), "{set}");
    assert!(set.contains("max_tokens   900000"), "{set}");
    assert!(
        set.contains("kept as in force: max_tokens, max_cost_usd"),
        "{set}"
    );

    let set = limits_cli(
        &config,
        &["set", "--team", "t2", "--max-cost-usd", "unlimited"],
    )
    .await;
    assert!(set.contains("max_cost_usd unlimited"), "{set}");
    assert!(set.contains("max_requests 1 "), "the override stays: {set}");
    assert!(
        set.contains("kept as in force: max_tokens, max_requests"),
        "{set}"
    );
    let show = limits_cli(&config, &["show", "--team", "t2"]).await;
    assert!(show.contains("max_cost_usd unlimited"), "{show}");
    assert!(show.contains("max_tokens   900000"), "{show}");
    db.cleanup().await;
}

/// A prompt version's model override is what the primary calls, so it must
/// have a price, and it is what is reserved: gpt-4o at 1,000 output tokens
/// (~$0.011) does not fit a $0.005 budget, though the chain's own models
/// (gpt-4o-mini, haiku) do. Priced as the chain, concurrent calls on an
/// override would overshoot a cost cap.
#[tokio::test]
async fn a_prompt_model_override_must_be_priced_and_is_reserved_at_its_price() {
    use ai_orchestrator::api::pb::prompt_admin_client::PromptAdminClient;
    let db = Db::new(false).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let version = |model: &str| pb::CreatePromptVersionRequest {
        team_id: "t2".into(),
        prompt_key: "sms_classify".into(),
        system_prompt: "Classify the reply. Answer with JSON.".into(),
        user_prompt_template: "{{message}}".into(),
        model: model.into(),
        max_tokens: Some(1000),
        activate: true,
        ..Default::default()
    };
    let mut admin = PromptAdminClient::new(app.channel.clone());
    // A model with no price could never count against a cost cap.
    let unpriced = admin
        .create_prompt_version(version("mystery-model"))
        .await
        .unwrap_err();
    assert_eq!(unpriced.code(), Code::InvalidArgument, "{unpriced:?}");
    let field = &unpriced.get_details_bad_request().unwrap().field_violations[0];
    assert_eq!(field.field, "model");
    assert!(
        field.description.contains("no price for `mystery-model`"),
        "{field:?}"
    );
    // Nor can one stored without the check (before metering was on)
    // become active.
    {
        use ai_orchestrator::prompts::store::{NewPrompt, PromptStore};
        let unchecked = NewPrompt {
            team_id: "t3".into(),
            key: "sms_classify".into(),
            system: "Classify.".into(),
            user_template: "{{message}}".into(),
            model: Some("mystery-model".into()),
            temperature: None,
            max_tokens: None,
            activate: false,
        };
        let store = db.store().await;
        let stored = PromptStore::new(store.clone())
            .add(unchecked, "test", 0)
            .await;
        assert_eq!(stored.unwrap(), 1);
        store.close().await;
    }
    let activate = pb::ActivatePromptVersionRequest {
        team_id: "t3".into(),
        prompt_key: "sms_classify".into(),
        version: 1,
    };
    let refused = admin.activate_prompt_version(activate).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    // Team t2 classifies with gpt-4o; t1 with the chain.
    admin
        .create_prompt_version(version("gpt-4o"))
        .await
        .unwrap();
    let request = |team: &str| {
        let mut context = ctx().unwrap();
        context.team_id = team.into();
        pb::ClassifySmsRequest {
            context: Some(context),
            message: "What does it cost?".into(),
            budget: Some(pb::Budget {
                max_cost_usd: 0.005,
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let mut c = app.client.clone();
    c.classify_sms(request("t1")).await.expect("the chain fits");
    let refused = c.classify_sms(request("t2")).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(info.reason, "BUDGET_EXCEEDED");
    let estimate: f64 = info.metadata["estimated_cost_usd"].parse().unwrap();
    assert!(estimate > 0.01, "gpt-4o's price: {estimate}");
    app.stop().await;
    db.cleanup().await;
}
