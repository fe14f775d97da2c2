//! Trace ID: context field, then x-trace-id, then traceparent, else generated;
//! echoed in meta and in the x-trace-id response metadata.

use crate::common::{TestApp, ctx};
use ai_orchestrator::api::pb;
use tonic::{Code, Request};
use tonic_types::StatusExt;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn classify(trace_in_context: &str) -> pb::ClassifySmsRequest {
    let mut context = ctx().unwrap();
    context.trace_id = trace_in_context.into();
    pb::ClassifySmsRequest {
        context: Some(context),
        message: "What does it cost?".into(),
        ..Default::default()
    }
}

async fn call(
    app: &TestApp,
    body: pb::ClassifySmsRequest,
    headers: &[(&'static str, &'static str)],
) -> (String, String) {
    let mut request = Request::new(body);
    for (k, v) in headers {
        request.metadata_mut().insert(*k, v.parse().unwrap());
    }
    let response = app
        .client
        .clone()
        .classify_sms(request)
        .await
        .expect("call ok");
    let header = response
        .metadata()
        .get("x-trace-id")
        .expect("x-trace-id")
        .to_str()
        .unwrap()
        .to_owned();
    let meta = response.into_inner().meta.expect("meta").trace_id;
    (meta, header)
}

#[tokio::test]
async fn trace_id_sources_in_order() {
    let app = TestApp::spawn().await;
    let all = [("x-trace-id", "from-header"), ("traceparent", TRACEPARENT)];

    assert_eq!(
        call(&app, classify("from-context"), &all).await,
        ("from-context".into(), "from-context".into())
    );
    assert_eq!(
        call(&app, classify(""), &all).await,
        ("from-header".into(), "from-header".into())
    );
    let from_tp = call(&app, classify(""), &[("traceparent", TRACEPARENT)]).await;
    assert_eq!(from_tp.0, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(from_tp.1, from_tp.0);

    let (generated, header) = call(&app, classify(""), &[]).await;
    assert_eq!(generated, header);
    assert_eq!(generated.len(), 32);
    assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    let (second, _) = call(&app, classify(""), &[]).await;
    assert_ne!(generated, second, "each request gets its own");

    // A malformed traceparent is ignored (W3C), not an error.
    let (ignored, _) = call(&app, classify(""), &[("traceparent", "00-zz-bad-01")]).await;
    assert_eq!(ignored.len(), 32);
    app.stop().await;
}

#[tokio::test]
async fn trace_id_is_in_error_details_and_unusable_ids_are_refused() {
    let app = TestApp::spawn().await;
    let mut request = Request::new(pb::ClassifySmsRequest {
        context: ctx(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-trace-id", "err-trace-1".parse().unwrap());
    let status = app.client.clone().classify_sms(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.get_details_error_info().unwrap().metadata["trace_id"],
        "err-trace-1"
    );
    assert_eq!(status.metadata().get("x-trace-id").unwrap(), "err-trace-1");

    let status = app
        .client
        .clone()
        .classify_sms(classify("has spaces in it"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let bad = status.get_details_bad_request().unwrap();
    assert_eq!(bad.field_violations[0].field, "context.trace_id");
    // The field is named once: in the violation's field, and once in the
    // message.
    assert_eq!(
        bad.field_violations[0].description,
        "must be 1-128 characters of [A-Za-z0-9._:-]"
    );
    assert_eq!(
        status.message().matches("context.trace_id").count(),
        1,
        "{}",
        status.message()
    );

    let mut request = Request::new(classify(""));
    request
        .metadata_mut()
        .insert("x-trace-id", "no spaces please".parse().unwrap());
    let status = app.client.clone().classify_sms(request).await.unwrap_err();
    let bad = status.get_details_bad_request().unwrap();
    assert_eq!(bad.field_violations[0].field, "x-trace-id");
    assert_eq!(
        status.message().matches("x-trace-id").count(),
        1,
        "{}",
        status.message()
    );
    app.stop().await;
}

/// Ops RPCs answer with the trace ID too (SPEC §3: every response).
#[tokio::test]
async fn provider_health_carries_the_trace_id() {
    let app = TestApp::spawn().await;
    let mut request = Request::new(pb::GetProviderHealthRequest {});
    request
        .metadata_mut()
        .insert("x-trace-id", "health-trace-1".parse().unwrap());
    let response = app
        .client
        .clone()
        .get_provider_health(request)
        .await
        .unwrap();
    assert_eq!(
        response.metadata().get("x-trace-id").unwrap(),
        "health-trace-1"
    );
    assert!(!response.into_inner().providers.is_empty());

    let mut request = Request::new(pb::GetProviderHealthRequest {});
    request
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().unwrap());
    let response = app
        .client
        .clone()
        .get_provider_health(request)
        .await
        .unwrap();
    assert_eq!(
        response.metadata().get("x-trace-id").unwrap(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );

    let response = app
        .client
        .clone()
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await
        .unwrap();
    let generated = response
        .metadata()
        .get("x-trace-id")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(generated.len(), 32, "generated when none is given");

    // A malformed one is refused, as on every RPC.
    let mut request = Request::new(pb::GetProviderHealthRequest {});
    request
        .metadata_mut()
        .insert("x-trace-id", "has spaces!".parse().unwrap());
    let refused = app
        .client
        .clone()
        .get_provider_health(request)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    app.stop().await;
}

/// Admin RPCs answer with the trace ID too, and refuse a malformed one
/// as every RPC does.
#[tokio::test]
async fn admin_rpcs_carry_the_trace_id_and_refuse_a_malformed_one() {
    let app = TestApp::spawn().await;
    let mut admin = pb::prompt_admin_client::PromptAdminClient::new(app.channel.clone());
    let list = |trace: &str| {
        let mut request = Request::new(pb::ListPromptsRequest {
            team_id: "t1".into(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("x-trace-id", trace.parse().unwrap());
        request
    };
    let response = admin.list_prompts(list("admin-trace-1")).await.unwrap();
    assert_eq!(
        response.metadata().get("x-trace-id").unwrap(),
        "admin-trace-1"
    );
    let status = admin.list_prompts(list("has spaces!")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    app.stop().await;
}
