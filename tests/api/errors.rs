//! Invalid input gets INVALID_ARGUMENT with a stable reason and field
//! violations; failures carry ErrorInfo with the trace ID.

use crate::common::{TestApp, ctx};
use ai_orchestrator::api::pb;
use tonic::Code;
use tonic_types::StatusExt;

/// Asserts the status code, ErrorInfo reason/domain, trace_id metadata and
/// (when given) the field of the first BadRequest violation.
fn assert_error(status: &tonic::Status, code: Code, reason: &str, field: Option<&str>) {
    assert_eq!(status.code(), code, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo present");
    assert_eq!(info.reason, reason);
    assert_eq!(info.domain, "ai-orchestrator");
    let trace = info
        .metadata
        .get("trace_id")
        .expect("trace_id in ErrorInfo");
    assert!(!trace.is_empty());
    let header = status
        .metadata()
        .get("x-trace-id")
        .expect("x-trace-id on the status");
    assert_eq!(header.to_str().unwrap(), trace);
    if let Some(field) = field {
        let bad = status
            .get_details_bad_request()
            .expect("BadRequest present");
        assert_eq!(bad.field_violations[0].field, field, "{bad:?}");
        assert!(!bad.field_violations[0].description.is_empty());
    }
    // Never internals.
    let text = status.message().to_owned();
    assert!(
        !text.contains("panicked") && !text.contains("sqlx"),
        "{text}"
    );
}

#[tokio::test]
async fn invalid_inputs_are_invalid_argument_with_field_violations() {
    let app = TestApp::spawn().await;
    let mut c = app.client.clone();

    let missing_context = c
        .classify_sms(pb::ClassifySmsRequest {
            message: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &missing_context,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("context"),
    );

    let no_team = c
        .classify_sms(pb::ClassifySmsRequest {
            context: Some(pb::RequestContext::default()),
            message: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &no_team,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("context.team_id"),
    );

    let bad_team = c
        .classify_sms(pb::ClassifySmsRequest {
            context: Some(pb::RequestContext {
                team_id: "t1; DROP TABLE".into(),
                ..Default::default()
            }),
            message: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &bad_team,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("context.team_id"),
    );

    let empty = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "   ".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &empty,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("message"),
    );

    // The test config caps input at 2048 bytes.
    let oversized = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "a".repeat(4096),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &oversized,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("message"),
    );

    let history_too_big = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "ok".into(),
            history: vec![pb::SmsMessage {
                text: "b".repeat(3000),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    // The violation names the field that holds the bytes.
    assert_error(
        &history_too_big,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("history"),
    );

    let empty_inbound = c
        .generate_sms(pb::GenerateSmsRequest {
            context: ctx(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &empty_inbound,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("inbound_message"),
    );

    let too_many_segments = c
        .generate_sms(pb::GenerateSmsRequest {
            context: ctx(),
            inbound_message: "hi".into(),
            max_segments: 50,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &too_many_segments,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("max_segments"),
    );

    let empty_query = c
        .research(pb::ResearchRequest {
            context: ctx(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &empty_query,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("query"),
    );

    let no_usage_team = c
        .get_usage(pb::GetUsageRequest::default())
        .await
        .unwrap_err();
    assert_error(
        &no_usage_team,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("team_id"),
    );

    let bad_dimension = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            group_by: vec![0],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &bad_dimension,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("group_by[0]"),
    );

    let bad_budget = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            budget: Some(pb::Budget {
                max_latency_ms: 0,
                max_cost_usd: -1.0,
            }),
            message: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &bad_budget,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("budget.max_cost_usd"),
    );

    let mut bad_timeout = tonic::Request::new(pb::ClassifySmsRequest {
        context: ctx(),
        message: "hi".into(),
        ..Default::default()
    });
    bad_timeout
        .metadata_mut()
        .insert("grpc-timeout", "soon".parse().unwrap());
    let bad_timeout = c.classify_sms(bad_timeout).await.unwrap_err();
    assert_error(
        &bad_timeout,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("grpc-timeout"),
    );
    app.stop().await;
}

#[tokio::test]
async fn execute_rejects_unknown_tasks_and_bad_json() {
    let app = TestApp::spawn().await;
    let mut c = app.client.clone();
    let execute = |task: &str, input: Option<pb::execute_request::Input>| pb::ExecuteRequest {
        context: ctx(),
        task: task.into(),
        input,
        ..Default::default()
    };
    let json = |s: &str| Some(pb::execute_request::Input::InputJson(s.into()));

    let unknown = c.execute(execute("no_such_task", None)).await.unwrap_err();
    assert_error(
        &unknown,
        Code::InvalidArgument,
        "TASK_UNKNOWN",
        Some("task"),
    );
    // It names the tasks there are, in the message and in ErrorInfo.
    assert!(
        unknown.message().contains("known tasks: ") && unknown.message().contains("meeting_brief"),
        "{}",
        unknown.message()
    );
    let known = &unknown.get_details_error_info().unwrap().metadata["known"];
    assert!(known.contains("meeting_brief"), "{known}");

    let missing = c.execute(execute("", None)).await.unwrap_err();
    assert_error(
        &missing,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("task"),
    );

    let not_json = c
        .execute(execute("meeting_brief", json("{not json")))
        .await
        .unwrap_err();
    assert_error(
        &not_json,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_json"),
    );

    let not_object = c
        .execute(execute("meeting_brief", json("[1,2]")))
        .await
        .unwrap_err();
    assert_error(
        &not_object,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_json"),
    );

    let big = format!("{{\"notes\":\"{}\"}}", "x".repeat(5000));
    let oversized = c
        .execute(execute("meeting_brief", json(&big)))
        .await
        .unwrap_err();
    assert_error(
        &oversized,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_json"),
    );

    // The stream RPC validates the same way before streaming.
    let unknown_stream = c
        .execute_stream(execute("no_such_task", None))
        .await
        .unwrap_err();
    assert_error(
        &unknown_stream,
        Code::InvalidArgument,
        "TASK_UNKNOWN",
        Some("task"),
    );
    assert!(
        unknown_stream.message().contains("meeting_brief"),
        "{}",
        unknown_stream.message()
    );
    app.stop().await;
}

#[tokio::test]
async fn all_providers_down_is_unavailable_with_every_attempt() {
    let app = TestApp::spawn_with_mocks("failure_rate = 1.0", "failure_rate = 1.0").await;
    let mut c = app.client.clone();
    let status = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "Is it still available?".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(&status, Code::Unavailable, "ALL_PROVIDERS_FAILED", None);
    let info = status.get_details_error_info().unwrap();
    let attempts = info.metadata.get("attempts").expect("attempt summary");
    assert!(
        attempts.contains("primary/gpt-4o-mini:HTTP_503"),
        "{attempts}"
    );
    assert!(
        attempts.contains("fallback/claude-3-haiku:HTTP_503"),
        "{attempts}"
    );
    assert!(
        status.get_details_retry_info().is_some(),
        "a later retry can succeed"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_over_limit_burst_is_shed_at_once_but_health_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shed.db").display());
    let toml = crate::common::config_toml(&url, "latency = \"600ms\"", "latency = \"600ms\"")
        .replace(
            "max_input_bytes = 2048",
            "max_input_bytes = 2048\nmax_concurrent_requests = 3",
        );
    let app = TestApp::spawn_toml(&toml).await;
    let mut calls = Vec::new();
    for _ in 0..12 {
        let mut c = app.client.clone();
        calls.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = c
                .classify_sms(pb::ClassifySmsRequest {
                    context: ctx(),
                    message: "hi".into(),
                    ..Default::default()
                })
                .await;
            (r, started.elapsed())
        }));
    }
    // While the burst is in flight, health checks are not shed.
    let mut health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone());
    // Three calls are in flight once their reservations are written.
    let store = app.store().await;
    crate::common::wait_for(|| async {
        ai_orchestrator::usage::sweeper::open_reservations(&store)
            .await
            .unwrap()
            == 3
    })
    .await;
    store.close().await;
    assert!(
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new()
            })
            .await
            .is_ok()
    );
    let (mut ok, mut shed) = (0, 0);
    for call in calls {
        let (result, took) = call.await.unwrap();
        match result {
            Ok(_) => ok += 1,
            Err(status) => {
                assert_error(&status, Code::ResourceExhausted, "OVERLOADED", None);
                assert!(status.get_details_retry_info().is_some());
                assert!(
                    took < std::time::Duration::from_millis(400),
                    "shed at once, not queued: {took:?}"
                );
                shed += 1;
            }
        }
    }
    assert_eq!((ok, shed), (3, 9));
    app.stop().await;
}

#[tokio::test]
async fn an_oversized_grpc_message_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("big.db").display());
    let toml = crate::common::config_toml(&url, "", "").replace(
        "max_input_bytes = 2048",
        "max_input_bytes = 2048\nmax_message_bytes = 4096",
    );
    let app = TestApp::spawn_toml(&toml).await;
    let status = app
        .client
        .clone()
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "x".repeat(100_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    app.stop().await;
}

/// The SMS and research RPCs decode up to limits of their own, far below
/// `Execute`'s: a 4 MB request of empty history entries never gets decoded.
#[tokio::test]
async fn each_rpc_family_decodes_up_to_its_own_limit() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("families.db").display());
    let toml = crate::common::config_toml(&url, "", "").replace(
        "max_input_bytes = 2048",
        "max_input_bytes = 2048\nmax_message_bytes = 65536\n\
         max_sms_message_bytes = 4096\nmax_research_message_bytes = 8192",
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    let text = |n: usize| "x".repeat(n);
    let empty_entries = vec![pb::SmsMessage::default(); 3_000];
    let classify = |message: String, history: Vec<pb::SmsMessage>| pb::ClassifySmsRequest {
        context: ctx(),
        message,
        history,
        ..Default::default()
    };
    // Within the limit, the same route serves the call.
    assert!(
        c.classify_sms(classify("Any discount?".into(), Vec::new()))
            .await
            .is_ok()
    );
    for request in [
        classify(text(6_000), Vec::new()),
        classify(String::new(), empty_entries.clone()),
    ] {
        let status = c.classify_sms(request).await.unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    }
    let generate = pb::GenerateSmsRequest {
        context: ctx(),
        inbound_message: text(6_000),
        ..Default::default()
    };
    let status = c.generate_sms(generate).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let research = |query: String| pb::ResearchRequest {
        context: ctx(),
        query,
        ..Default::default()
    };
    // 6 KB passes Research's limit, then fails the field bound on its query.
    let status = c.research(research(text(6_000))).await.unwrap_err();
    assert_error(&status, Code::InvalidArgument, "INVALID_INPUT", None);
    let status = c.research(research(text(10_000))).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // Execute keeps max_message_bytes: decoded, then refused by its field bound.
    let execute = pb::ExecuteRequest {
        context: ctx(),
        task: "meeting_brief".into(),
        input: Some(pb::execute_request::Input::InputJson(format!(
            "{{\"notes\":\"{}\"}}",
            text(10_000)
        ))),
        ..Default::default()
    };
    let status = c.execute(execute).await.unwrap_err();
    assert_error(&status, Code::InvalidArgument, "INVALID_INPUT", None);
    app.stop().await;
}

/// Everything a request can make the server allocate is bounded, and a
/// violation names its field: history entries (an empty one still costs a
/// prompt line), the request's bytes over all its fields, the nesting of an
/// `Execute` input, and the prompt rendered from it.
#[tokio::test]
async fn every_input_a_request_can_grow_is_bounded_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bounds.db").display());
    let toml = crate::common::config_toml(&url, "", "").replace(
        "max_input_bytes = 2048",
        "max_input_bytes = 2048\nmax_history_entries = 20\nmax_input_depth = 8\nmax_prompt_bytes = 1500",
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    let entry = |text: &str| pb::SmsMessage {
        text: text.into(),
        ..Default::default()
    };
    let classify = |history: Vec<pb::SmsMessage>| pb::ClassifySmsRequest {
        context: ctx(),
        message: "hi".into(),
        history,
        ..Default::default()
    };

    // Many empty entries: refused by count, though nearly no bytes.
    let status = c
        .classify_sms(classify(vec![entry(""); 21]))
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("history"),
    );
    assert!(c.classify_sms(classify(vec![entry(""); 20])).await.is_ok());

    // Few entries, many bytes: the total over all fields, naming the largest.
    let status = c
        .classify_sms(classify(vec![entry(&"h".repeat(200)); 12]))
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("history"),
    );
    let bad = status.get_details_bad_request().unwrap();
    assert!(
        bad.field_violations[0]
            .description
            .contains("2048 byte input limit"),
        "{bad:?}"
    );
    let status = c
        .generate_sms(pb::GenerateSmsRequest {
            context: ctx(),
            inbound_message: "hi".into(),
            lead: Some(pb::Lead {
                attributes: (0..100)
                    .map(|i| (format!("k{i}"), "v".repeat(20)))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("lead"),
    );

    // Nesting: as JSON text and as a Struct.
    let nested = |depth: usize| {
        let mut v = serde_json::json!("leaf");
        for _ in 0..depth {
            v = serde_json::json!({ "a": v });
        }
        v
    };
    let execute = |input: pb::execute_request::Input| pb::ExecuteRequest {
        context: ctx(),
        task: "meeting_brief".into(),
        input: Some(input),
        ..Default::default()
    };
    let json = |depth| pb::execute_request::Input::InputJson(nested(depth).to_string());
    let status = c.execute(execute(json(9))).await.unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_json"),
    );
    assert!(c.execute(execute(json(8))).await.is_ok());
    let as_struct = |depth| {
        let serde_json::Value::Object(map) = nested(depth) else {
            unreachable!()
        };
        pb::execute_request::Input::InputStruct(ai_orchestrator::api::convert::json_to_struct(map))
    };
    let status = c.execute(execute(as_struct(9))).await.unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_struct"),
    );
    assert!(c.execute(execute(as_struct(8))).await.is_ok());

    // A number JSON cannot carry is refused, not turned into null.
    let mut with_nan = ai_orchestrator::api::convert::json_to_struct(
        serde_json::json!({"company": "Acme"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    with_nan.fields.insert(
        "attendees".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
        },
    );
    let status = c
        .execute(execute(pb::execute_request::Input::InputStruct(with_nan)))
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input_struct"),
    );

    // Under the input limit, but escaping grows the rendered prompt past its
    // own limit: refused before any provider call, naming the input.
    let escaped = serde_json::json!({ "company": "&".repeat(600) }).to_string();
    let status = c
        .execute(execute(pb::execute_request::Input::InputJson(escaped)))
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("input"),
    );
    let bad = status.get_details_bad_request().unwrap();
    assert!(
        bad.field_violations[0]
            .description
            .contains("max_prompt_bytes"),
        "{bad:?}"
    );

    // A prompt version whose own text passes the rendered limit could
    // serve no call: refused when created. Its variables do not count, as
    // a value may be shorter than its placeholder.
    let version = |system: String| pb::CreatePromptVersionRequest {
        prompt_key: "meeting_brief".into(),
        system_prompt: system,
        user_prompt_template: "{{company}}".into(),
        ..Default::default()
    };
    let mut admin = pb::prompt_admin_client::PromptAdminClient::new(app.channel.clone());
    let status = admin
        .create_prompt_version(version("s".repeat(1501)))
        .await
        .unwrap_err();
    assert_error(
        &status,
        Code::InvalidArgument,
        "INVALID_INPUT",
        Some("user_prompt_template"),
    );
    let placeholders = format!("{}{}", "s".repeat(1400), "{{company}}".repeat(20));
    admin
        .create_prompt_version(version(placeholders))
        .await
        .unwrap();
    app.stop().await;
}
