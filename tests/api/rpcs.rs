//! Every RPC answers through the real path (handler → task → router →
//! provider trait → mock) and writes usage that GetUsage reads back.

use crate::common::{TestApp, brief_events, ctx};
use ai_orchestrator::api::pb;

#[tokio::test]
async fn each_rpc_answers_from_the_mock_provider() {
    let app = TestApp::spawn().await;
    let mut c = app.client.clone();

    let classified = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "Yes please, tell me more".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // The mock's keyword rule (`yes`), never more than half sure, and
    // saying so: a newcomer cannot take it for a model.
    assert_eq!(classified.intent, pb::SmsIntent::Interested as i32);
    assert_eq!(classified.confidence, 0.5);
    assert!(classified.needs_review);
    assert_eq!(
        classified.reason,
        "mock provider: keyword `yes` means INTERESTED"
    );
    let meta = classified.meta.unwrap();
    assert_eq!(
        (meta.provider.as_str(), meta.model.as_str(), meta.degraded),
        ("primary", "gpt-4o-mini", false)
    );
    assert_eq!(meta.attempts.len(), 1);
    assert_eq!(meta.prompt_key, "sms_classify");
    assert!(meta.usage.unwrap().input_tokens > 0);

    let opt_out = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "STOP".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(opt_out.intent, pb::SmsIntent::OptOut as i32);
    assert_eq!(opt_out.confidence, 1.0);
    assert!(
        opt_out.meta.unwrap().attempts.is_empty(),
        "no provider call for a keyword"
    );

    let reply = c
        .generate_sms(pb::GenerateSmsRequest {
            context: ctx(),
            inbound_message: "When can we talk?".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.response.is_empty() && !reply.escalate);
    assert_eq!(
        (reply.segments, reply.encoding),
        (1, pb::SmsEncoding::Gsm7 as i32)
    );

    let no_reply = c
        .generate_sms(pb::GenerateSmsRequest {
            context: ctx(),
            inbound_message: "unsubscribe".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(no_reply.escalate && no_reply.response.is_empty());

    let research = c
        .research(pb::ResearchRequest {
            context: ctx(),
            query: "Is Acme Corp hiring?".into(),
            depth: pb::ResearchDepth::Deep as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!research.summary.is_empty());
    assert_eq!(research.findings.len(), 1);
    assert_eq!(
        research.findings[0].sources,
        vec!["https://example.com/source"]
    );

    let brief = c
        .execute(pb::ExecuteRequest {
            context: ctx(),
            task: "meeting_brief".into(),
            input: Some(pb::execute_request::Input::InputJson(
                r#"{"company":"Acme","attendees":["Ann"]}"#.into(),
            )),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!brief.text.is_empty());
    assert_eq!(brief.meta.unwrap().provider, "primary");

    let health = c
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = health
        .providers
        .iter()
        .map(|p| p.provider.as_str())
        .collect();
    assert_eq!(names, ["fallback", "primary"]);
    app.stop().await;
}

#[tokio::test]
async fn fallback_serves_when_the_primary_fails() {
    let app = TestApp::spawn_with_mocks("failure_rate = 1.0", "latency = \"1ms\"").await;
    let reply = app
        .client
        .clone()
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "call me later".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let meta = reply.meta.unwrap();
    assert!(meta.degraded);
    assert_eq!(meta.provider, "fallback");
    let outcomes: Vec<(String, i32, String)> = meta
        .attempts
        .iter()
        .map(|a| (a.provider.clone(), a.outcome, a.error_code.clone()))
        .collect();
    assert_eq!(
        outcomes[0],
        (
            "primary".into(),
            pb::AttemptOutcome::Error as i32,
            "HTTP_503".into()
        )
    );
    assert_eq!(
        outcomes.last().unwrap(),
        &(
            "fallback".into(),
            pb::AttemptOutcome::Success as i32,
            String::new()
        )
    );
    app.stop().await;
}

#[tokio::test]
async fn execute_stream_emits_started_deltas_and_completed() {
    let app = TestApp::spawn_with_mocks("failure_rate = 1.0", "reply = \"one two three\"").await;
    use pb::execute_event::Event;
    let mut events = brief_events(&app, ctx().unwrap()).await;
    // INTERACTIVE retries the primary in place when the backoff drawn is
    // within `interactive_max_wait` (250 ms), else fails over at once:
    // each try is a `started`, before any output.
    let tries = events
        .iter()
        .take_while(|e| matches!(e, Event::Started(s) if s.provider == "primary"))
        .count();
    assert!((1..=3).contains(&tries), "{events:?}");
    let events = events.split_off(tries - 1);
    assert!(
        matches!(&events[0], Event::Started(s) if s.provider == "primary" && s.trace_id.len() == 32)
    );
    assert!(
        matches!(&events[1], Event::Fallback(f) if f.from == "primary" && f.to == "fallback" && f.reason == "HTTP_503")
    );
    assert!(matches!(&events[2], Event::Started(s) if s.provider == "fallback"));
    let text: String = events
        .iter()
        .filter_map(|e| {
            if let Event::Delta(d) = e {
                Some(d.text.as_str())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(text, "one two three");
    let Some(Event::Completed(done)) = events.last() else {
        panic!("last event must be completed: {events:?}")
    };
    assert_eq!(done.text, "one two three");
    let meta = done.meta.as_ref().unwrap();
    assert!(meta.degraded);
    assert_eq!(meta.attempts.len(), tries + 1);
    app.stop().await;
}

#[tokio::test]
async fn get_usage_sums_what_the_calls_reported() {
    let app = TestApp::spawn().await;
    let mut c = app.client.clone();
    let (mut input, mut output) = (0, 0);
    for message in ["hello", "is this available", "STOP"] {
        let r = c
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: message.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let u = r.meta.unwrap().usage.unwrap();
        input += u.input_tokens;
        output += u.output_tokens;
    }
    let usage = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            group_by: vec![
                pb::UsageDimension::Provider as i32,
                pb::UsageDimension::Day as i32,
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let totals = usage.totals.unwrap();
    assert_eq!(
        (totals.requests, totals.input_tokens, totals.output_tokens),
        (3, input, output)
    );
    // One bucket for the provider-less opt-out, one for the primary, both today.
    assert_eq!(usage.buckets.len(), 2);
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    assert!(usage.buckets.iter().all(|b| b.day == today));
    let primary = usage
        .buckets
        .iter()
        .find(|b| b.provider == "primary")
        .unwrap();
    assert_eq!(primary.totals.as_ref().unwrap().requests, 2);

    let other_team = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t2".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other_team.totals.unwrap().requests, 0);
    app.stop().await;
}
