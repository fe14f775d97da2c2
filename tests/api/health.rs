//! grpc.health.v1, reflection and graceful shutdown.

use crate::common::{TestApp, TestPostgres, config_toml, ctx};
use ai_orchestrator::api::pb;
use std::time::Duration;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

async fn status(app: &TestApp, service: &str) -> ServingStatus {
    let mut health = HealthClient::new(app.channel.clone());
    let response = health
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check answers");
    ServingStatus::try_from(response.into_inner().status).expect("known status")
}

/// The services the server answers, each with a health status of its own.
const EVERY_SERVICE: [&str; 5] = [
    "ai.orchestrator.v1.Orchestrator",
    "ai.orchestrator.v1.ToolService",
    "ai.orchestrator.v1.AgentService",
    "ai.orchestrator.v1.AuditService",
    "ai.orchestrator.v1.PromptAdmin",
];

#[tokio::test]
async fn health_is_serving_overall_and_per_service() {
    let app = TestApp::spawn().await;
    assert_eq!(status(&app, "").await, ServingStatus::Serving);
    for service in EVERY_SERVICE {
        assert_eq!(
            status(&app, service).await,
            ServingStatus::Serving,
            "{service}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn health_is_not_serving_while_the_database_is_unreachable() {
    let db = TestPostgres::create().await;
    let app = TestApp::spawn_toml(&config_toml(
        &db.url,
        "latency = \"1ms\"",
        "latency = \"1ms\"",
    ))
    .await;
    assert_eq!(status(&app, "").await, ServingStatus::Serving);

    db.drop_now().await;
    // The probe runs every 100 ms; watch the status flip.
    let mut health = HealthClient::new(app.channel.clone());
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "ai.orchestrator.v1.Orchestrator".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let flipped = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(update)) = watch.message().await.transpose() {
            if update.status == ServingStatus::NotServing as i32 {
                return true;
            }
        }
        false
    })
    .await
    .expect("status changes within 10 s");
    assert!(flipped);
    assert_eq!(status(&app, "").await, ServingStatus::NotServing);
    for service in EVERY_SERVICE {
        assert_eq!(
            status(&app, service).await,
            ServingStatus::NotServing,
            "{service}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let app = TestApp::spawn().await;
    let mut client = ServerReflectionClient::new(app.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("stream ok")
        .expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!(
            "expected a service list, got {:?}",
            response.message_response
        );
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["ai.orchestrator.v1.Orchestrator", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    app.stop().await;
}

/// grpcurl decodes error details through reflection: every type a status
/// carries in its details is served, with every file it depends on, so a
/// client that resolves `google.rpc.ErrorInfo` (and its imports) by
/// reflection alone finds them all.
#[tokio::test]
async fn reflection_serves_the_error_detail_types_and_their_imports() {
    use prost::Message;
    use std::collections::{BTreeSet, VecDeque};
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let app = TestApp::spawn().await;
    let client = ServerReflectionClient::new(app.channel.clone());
    let ask = |request: MessageRequest| {
        let mut client = client.clone();
        async move {
            let response = client
                .server_reflection_info(tokio_stream::iter(vec![ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(request),
                }]))
                .await
                .expect("reflection answers")
                .into_inner()
                .message()
                .await
                .expect("stream ok")
                .expect("one response");
            match response.message_response {
                Some(MessageResponse::FileDescriptorResponse(files)) => files
                    .file_descriptor_proto
                    .iter()
                    .map(|bytes| {
                        prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap()
                    })
                    .collect::<Vec<_>>(),
                other => panic!("{other:?}"),
            }
        }
    };
    for symbol in [
        "google.rpc.ErrorInfo",
        "google.rpc.BadRequest",
        "google.rpc.QuotaFailure",
        "google.rpc.RetryInfo",
        "google.rpc.Status",
    ] {
        // Follow every import, as a client building its descriptor pool does.
        let mut pending: VecDeque<prost_types::FileDescriptorProto> =
            ask(MessageRequest::FileContainingSymbol(symbol.into()))
                .await
                .into();
        let mut seen = BTreeSet::new();
        let mut declared = false;
        let name = symbol.rsplit('.').next().unwrap();
        while let Some(file) = pending.pop_front() {
            if !seen.insert(file.name().to_owned()) {
                continue;
            }
            declared |= file.package() == "google.rpc"
                && file.message_type.iter().any(|m| m.name() == name);
            for dependency in &file.dependency {
                if !seen.contains(dependency) {
                    pending.extend(ask(MessageRequest::FileByFilename(dependency.clone())).await);
                }
            }
        }
        assert!(declared, "{symbol} not declared in {seen:?}");
    }
    app.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_lets_an_in_flight_call_finish() {
    // Every provider call takes 800 ms; shut down while one is in flight.
    let mut app = TestApp::spawn_with_mocks("latency = \"800ms\"", "latency = \"800ms\"").await;
    let mut client = app.client.clone();
    let call = tokio::spawn(async move {
        client
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: "Sounds good".into(),
                ..Default::default()
            })
            .await
    });
    // A health watch opened before shutdown sees the flip to NOT_SERVING.
    let mut health = HealthClient::new(app.channel.clone());
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch
        .message()
        .await
        .expect("watch ok")
        .expect("first status");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    // The call is admitted and on its way to the provider once its
    // reservation is written.
    let store = app.store().await;
    crate::common::wait_for(|| async {
        ai_orchestrator::usage::sweeper::open_reservations(&store)
            .await
            .unwrap()
            == 1
    })
    .await;
    store.close().await;
    app.trigger_shutdown();
    let next = watch
        .message()
        .await
        .expect("watch ok")
        .expect("status update");
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    drop(watch); // an open watch would itself be an in-flight call

    let answer = call
        .await
        .expect("call task")
        .expect("in-flight call completes OK");
    assert_eq!(answer.into_inner().intent, pb::SmsIntent::Interested as i32);
    tokio::time::timeout(Duration::from_secs(5), &mut app.handle)
        .await
        .expect("serve returns after draining")
        .expect("join")
        .expect("serve ok");

    // New connections are refused once the server stopped.
    assert!(tokio::net::TcpStream::connect(app.addr).await.is_err());
}
