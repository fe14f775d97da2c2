//! The typed tasks end to end: reply escalation paths and SMS encoding, the
//! versioned prompt store (resolution, stats, audit), template variables,
//! and output schemas of generic tasks. Classification, research and
//! `Execute`'s prompt key override have their own files under `tasks/`.

mod classify;
mod generate;
mod prompt_key;
mod research;

use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::{
    api::pb::{self, prompt_admin_client::PromptAdminClient},
    config::DatabaseConfig,
    prompts::store::PromptStore,
    store::Store,
};
use tonic::Code;
use tonic_types::StatusExt;

/// A mock whose every answer is `reply` (TOML-escaped here).
pub(crate) fn replying(reply: &str) -> String {
    format!("reply = '''{reply}'''")
}

pub(crate) async fn app_with(
    primary: &str,
    fallback: &str,
    extra: &str,
) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tasks.db").display());
    (
        TestApp::spawn_toml(&config_toml_with(&url, primary, fallback, extra)).await,
        dir,
    )
}

pub(crate) fn classify(message: &str) -> pb::ClassifySmsRequest {
    pb::ClassifySmsRequest {
        context: ctx(),
        message: message.into(),
        ..Default::default()
    }
}

fn generate(message: &str, max_segments: u32) -> pb::GenerateSmsRequest {
    pb::GenerateSmsRequest {
        context: ctx(),
        inbound_message: message.into(),
        goal: "book a demo".into(),
        max_segments,
        lead: Some(pb::Lead {
            first_name: "Ann".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn generate_escalates_when_the_model_asks_for_a_human() {
    let wants_human = replying(
        r#"{"reply":"Let me get a colleague to help.","escalate":true,"escalate_reason":"asks for a manager"}"#,
    );
    let (app, _dir) = app_with(&wants_human, "", "").await;
    let r = app
        .client
        .clone()
        .generate_sms(generate("I want to talk to your manager", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(r.escalate);
    assert_eq!(r.escalate_reason, "asks for a manager");
    assert_eq!(r.response, "Let me get a colleague to help.");
    app.stop().await;
}

#[tokio::test]
async fn a_reply_that_cannot_fit_is_regenerated_once_then_escalated() {
    let long = "x".repeat(400);
    let too_long = replying(&format!(
        r#"{{"reply":"{long}","escalate":false,"escalate_reason":""}}"#
    ));
    let (app, _dir) = app_with(&too_long, "", "").await;
    let r = app
        .client
        .clone()
        .generate_sms(generate("Tell me everything", 2))
        .await
        .unwrap()
        .into_inner();
    assert!(r.escalate);
    assert!(
        r.escalate_reason.contains("does not fit in 2"),
        "{}",
        r.escalate_reason
    );
    assert_eq!(
        (r.response.as_str(), r.segments),
        ("", 0),
        "an escalated reply carries no text"
    );
    let meta = r.meta.unwrap();
    assert_eq!(
        meta.attempts.len(),
        2,
        "first draft + one stricter regeneration"
    );
    app.stop().await;
}

#[tokio::test]
async fn reply_encoding_and_segments_are_reported() {
    let emoji =
        replying(r#"{"reply":"Great, see you Tuesday 😀","escalate":false,"escalate_reason":""}"#);
    let (app, _dir) = app_with(&emoji, "", "").await;
    let r = app
        .client
        .clone()
        .generate_sms(generate("Tuesday works", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.encoding, r.segments, r.escalate),
        (pb::SmsEncoding::Ucs2 as i32, 1, false)
    );
    app.stop().await;

    let gsm =
        replying(r#"{"reply":"Price is 10€ [incl. tax]","escalate":false,"escalate_reason":""}"#);
    let (app, _dir) = app_with(&gsm, "", "").await;
    let r = app
        .client
        .clone()
        .generate_sms(generate("price?", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.encoding, r.segments), (pb::SmsEncoding::Gsm7 as i32, 1));
    app.stop().await;
}

#[tokio::test]
async fn prompts_resolve_team_then_global_then_builtin_and_collect_stats() {
    let (app, dir) = app_with("latency = \"2ms\"", "", "").await;
    let mut admin = PromptAdminClient::new(app.channel.clone());
    let mut c = app.client.clone();
    let as_team = |team: &str| {
        let mut r = classify("What's the price?");
        r.context.as_mut().unwrap().team_id = team.into();
        r
    };
    let version_for =
        |meta: Option<pb::ResponseMeta>| meta.map(|m| (m.prompt_key, m.prompt_version)).unwrap();

    // Nothing stored: the built-in default.
    let r = c.classify_sms(as_team("t1")).await.unwrap().into_inner();
    assert_eq!(version_for(r.meta), ("sms_classify".to_owned(), 0));

    let create = |team: &str, activate: bool| {
        let mut req = tonic::Request::new(pb::CreatePromptVersionRequest {
            team_id: team.into(),
            prompt_key: "sms_classify".into(),
            system_prompt: "Classify the SMS. Answer JSON.".into(),
            user_prompt_template: "<message>{{message}}</message> <history>{{history}}</history>"
                .into(),
            activate,
            ..Default::default()
        });
        req.metadata_mut()
            .insert("x-actor", "alice".parse().unwrap());
        req
    };
    // Global v1 (active), global v2 (inactive until activated), team t1 v1.
    admin.create_prompt_version(create("", true)).await.unwrap();
    let v2 = admin
        .create_prompt_version(create("", false))
        .await
        .unwrap()
        .into_inner()
        .prompt
        .unwrap();
    assert_eq!(
        (v2.version, v2.is_active, v2.created_by.as_str()),
        (2, false, "alice")
    );
    let mut activate = tonic::Request::new(pb::ActivatePromptVersionRequest {
        team_id: String::new(),
        prompt_key: "sms_classify".into(),
        version: 2,
    });
    activate
        .metadata_mut()
        .insert("x-actor", "bob".parse().unwrap());
    assert!(
        admin
            .activate_prompt_version(activate)
            .await
            .unwrap()
            .into_inner()
            .prompt
            .unwrap()
            .is_active
    );
    admin
        .create_prompt_version(create("t1", true))
        .await
        .unwrap();

    for _ in 0..3 {
        let r = c.classify_sms(as_team("t2")).await.unwrap().into_inner();
        assert_eq!(
            version_for(r.meta),
            ("sms_classify".to_owned(), 2),
            "t2 has no own version: global v2"
        );
    }
    let r = c.classify_sms(as_team("t1")).await.unwrap().into_inner();
    assert_eq!(
        version_for(r.meta),
        ("sms_classify".to_owned(), 1),
        "t1's own version wins"
    );

    // Stats come from the real calls (written with each call's usage record).
    let listed = admin
        .list_prompts(pb::ListPromptsRequest {
            team_id: String::new(),
            prompt_key: "sms_classify".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .prompts;
    let global_v2 = listed.iter().find(|p| p.version == 2).unwrap();
    assert_eq!(global_v2.usage_count, 3);
    assert_eq!(global_v2.success_rate, 1.0);
    assert!(global_v2.avg_latency_ms > 0.0);
    assert_eq!(
        listed.iter().find(|p| p.version == 1).unwrap().usage_count,
        0
    );

    // Audited: who did what to which version.
    let store = Store::connect(&DatabaseConfig {
        url: format!("sqlite://{}", dir.path().join("tasks.db").display()),
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    let trail = PromptStore::new(store.clone())
        .audit_trail("", "sms_classify")
        .await
        .unwrap();
    let trail: Vec<(String, String, i64)> = trail
        .into_iter()
        .map(|(_, who, what, v)| (who, what, v))
        .collect();
    assert_eq!(
        trail,
        [
            ("alice".into(), "create".into(), 1),
            ("alice".into(), "activate".into(), 1),
            ("alice".into(), "create".into(), 2),
            ("bob".into(), "activate".into(), 2),
        ]
    );
    store.close().await;

    // Activating a version that does not exist.
    let missing = admin
        .activate_prompt_version(pb::ActivatePromptVersionRequest {
            team_id: "t1".into(),
            prompt_key: "sms_classify".into(),
            version: 9,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    // A template that does not parse.
    let mut bad = create("t3", true).into_inner();
    bad.user_prompt_template = "{{message".into();
    let invalid = admin.create_prompt_version(bad).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    app.stop().await;
}

#[tokio::test]
async fn a_missing_template_variable_is_invalid_argument_naming_it() {
    let (app, _dir) = app_with("", "", "").await;
    PromptAdminClient::new(app.channel.clone())
        .create_prompt_version(pb::CreatePromptVersionRequest {
            prompt_key: "meeting_brief".into(),
            system_prompt: "Write a brief.".into(),
            user_prompt_template: "Company: {{company}}\nAgenda: {{agenda}}".into(),
            activate: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let status = app
        .client
        .clone()
        .execute(pb::ExecuteRequest {
            context: ctx(),
            task: "meeting_brief".into(),
            input: Some(pb::execute_request::Input::InputJson(
                r#"{"company":"Acme"}"#.into(),
            )),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let bad = status.get_details_bad_request().unwrap();
    assert_eq!(bad.field_violations[0].field, "input.agenda");
    app.stop().await;
}

/// Typed RPCs have no `input` field: a stored prompt using a variable the
/// RPC does not provide is refused when created, and one that got into the
/// table anyway (an older release, manual SQL) is reported on `prompt`,
/// naming the variable, never as `input.<name>`.
#[tokio::test]
async fn a_typed_prompt_with_a_variable_its_rpc_lacks_names_the_prompt() {
    let (app, dir) = app_with("", "", "").await;
    let refused = PromptAdminClient::new(app.channel.clone())
        .create_prompt_version(pb::CreatePromptVersionRequest {
            prompt_key: "sms_classify".into(),
            system_prompt: "Classify.".into(),
            user_prompt_template: "{{message}} from {{company}}".into(),
            activate: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let violation = &refused.get_details_bad_request().unwrap().field_violations[0];
    assert_eq!(violation.field, "user_prompt_template");
    assert!(
        violation.description.contains("`company`")
            && violation.description.contains("history, message"),
        "{}",
        violation.description
    );

    let store = Store::connect(&DatabaseConfig {
        url: format!("sqlite://{}", dir.path().join("tasks.db").display()),
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    ai_orchestrator::on_store!(&store, |pool| {
        sqlx::query(
            "INSERT INTO ai_prompts (team_id, prompt_key, version, system_prompt, user_prompt_template, is_active, created_at_ms) \
             VALUES ('t1', 'sms_classify', 4, 'Classify.', '{{message}} from {{company}}', 1, 0)",
        )
        .execute(pool)
        .await
        .unwrap();
    });
    store.close().await;
    let status = app
        .client
        .clone()
        .classify_sms(classify("What's the price?"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let violations = status.get_details_bad_request().unwrap().field_violations;
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].field, "prompt");
    assert_eq!(
        violations[0].description,
        "prompt `sms_classify` v4 (team `t1`) uses template variable `company`, which ClassifySms \
does not provide (it provides: history, message); activate a version that uses only those"
    );
    app.stop().await;
}

#[tokio::test]
async fn generic_task_answers_must_match_the_output_schema() {
    let extra = r#"
[tasks.lead_summary]
chain = [{ provider = "primary", model = "gpt-4o-mini" }, { provider = "fallback", model = "claude-3-haiku" }]
output_schema = { type = "object", required = ["summary"], properties = { summary = { type = "string" } } }
"#;
    let (app, _dir) = app_with(
        &replying(r#"{"title":"no summary here"}"#),
        &replying(r#"{"summary":"Warm lead"}"#),
        extra,
    )
    .await;
    let r = app
        .client
        .clone()
        .execute(pb::ExecuteRequest {
            context: ctx(),
            task: "lead_summary".into(),
            input: Some(pb::execute_request::Input::InputJson(
                r#"{"notes":"met at expo"}"#.into(),
            )),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let meta = r.meta.unwrap();
    assert!(meta.degraded);
    assert_eq!(
        meta.attempts[0].outcome,
        pb::AttemptOutcome::Malformed as i32
    );
    let output = r.output.unwrap();
    assert_eq!(
        output.fields["summary"].kind,
        Some(prost_types::value::Kind::StringValue("Warm lead".into()))
    );
    app.stop().await;
}
