//! The method list against the compiled descriptors, and each phase of a
//! call recorded exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};

/// Every `service/method` of an encoded descriptor set.
fn methods_of(set: &[u8]) -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(set).unwrap();
    let mut out = Vec::new();
    for file in set.file {
        for service in &file.service {
            for method in &service.method {
                let kind = match (method.client_streaming(), method.server_streaming()) {
                    (false, false) => UNARY,
                    (false, true) => SERVER_STREAM,
                    (true, true) => BIDI_STREAM,
                    (true, false) => "client_stream",
                };
                out.push(format!(
                    "{}.{}/{} {kind}",
                    file.package(),
                    service.name(),
                    method.name()
                ));
            }
        }
    }
    out
}

#[test]
fn the_allow_list_is_exactly_the_served_methods() {
    let served: BTreeSet<String> = [
        crate::api::pb::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ]
    .into_iter()
    .flat_map(methods_of)
    .collect();
    let listed: BTreeSet<String> = METHODS.iter().map(|(m, k)| format!("{m} {k}")).collect();
    assert_eq!(listed, served);
    assert_eq!(listed.len(), METHODS.len(), "no duplicates");
    use crate::api::pb::{orchestrator_server, prompt_admin_server};
    for service in [
        orchestrator_server::SERVICE_NAME,
        prompt_admin_server::SERVICE_NAME,
    ] {
        assert!(
            METHODS
                .iter()
                .any(|(m, _)| m.starts_with(&format!("{service}/")))
        );
    }
}

#[test]
fn labels_are_bounded() {
    assert_eq!(
        method_label("/ai.orchestrator.v1.Orchestrator/ClassifySms"),
        ("ai.orchestrator.v1.Orchestrator/ClassifySms", "unary")
    );
    for unknown in [
        "/evil.Service/Random123",
        "/ai.orchestrator.v1.Xq8Zr1",
        "/ai.orchestrator.v1.Orchestrator/ClassifySmsX",
        "/ai.orchestrator.v1.Orchestrator/",
        "/grpc.health.v1.Health/Check/extra",
        "/grpc.reflection.v2.ServerReflection/ServerReflectionInfo",
        "ai.orchestrator.v1.Orchestrator/Execute/",
        "",
        "/",
    ] {
        assert_eq!(method_label(unknown), ("other", "other"), "{unknown}");
    }
    assert_eq!(code_name(Code::from_bytes(b"8")), "RESOURCE_EXHAUSTED");
    assert_eq!(code_name(Code::from_bytes(b"99")), "UNKNOWN");
    assert_eq!(code_name(Code::from_bytes(b"x")), "UNKNOWN");
}

#[test]
fn a_deferred_call_is_recorded_once_by_whoever_owns_it() {
    let phase = |c: &GrpcCall| *c.phase();
    // Stream started: the guard records, at its drop.
    let call = GrpcCall::new((OTHER, OTHER));
    let mut end = call.defer();
    call.responded(None);
    assert_eq!(phase(&call), Phase::Streaming);
    end.finish(Code::Unavailable);
    assert_eq!(phase(&call), Phase::Done, "recorded before the trailers");
    drop(end);
    assert_eq!(phase(&call), Phase::Done);

    // Dropped unfinished (client gone): recorded at the drop.
    let call = GrpcCall::new((OTHER, OTHER));
    let end = call.defer();
    call.responded(None);
    drop(end);
    assert_eq!(phase(&call), Phase::Done);

    // The handler failed after deferring: the layer records the error.
    let call = GrpcCall::new((OTHER, OTHER));
    drop(call.defer());
    assert_eq!(phase(&call), Phase::Head);
    call.responded(Some(Code::ResourceExhausted));
    assert_eq!(phase(&call), Phase::Done);

    // Trailers-only error while the guard lives: the layer records, not the guard.
    let call = GrpcCall::new((OTHER, OTHER));
    let end = call.defer();
    call.responded(Some(Code::NotFound));
    assert_eq!(phase(&call), Phase::Done);
    drop(end);
    assert_eq!(phase(&call), Phase::Done);
}

/// `grpc_server_handled_total` by code for `f`, in its own recorder (the global one is shared).
fn handled_by(f: impl FnOnce()) -> BTreeMap<String, u64> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    ::metrics::with_local_recorder(&recorder, f);
    handle
        .render()
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .map(|l| {
            let code = l.split("grpc_code=\"").nth(1).unwrap();
            let code = code.split('"').next().unwrap().to_owned();
            (code, l.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect()
}

type Answer = Result<http::Response<()>, ()>;

/// `call`'s response future, around a handler that never answers.
fn unanswered(call: &GrpcCall) -> ResponseFuture<std::future::Pending<Answer>> {
    ResponseFuture {
        inner: std::future::pending(),
        call: call.clone(),
    }
}

/// `call`'s response future, answering a head without `grpc-status` (success, stream start).
fn answered(call: &GrpcCall) -> ResponseFuture<std::future::Ready<Answer>> {
    ResponseFuture {
        inner: std::future::ready(Ok(http::Response::new(()))),
        call: call.clone(),
    }
}

#[test]
fn a_call_dropped_before_its_response_is_counted_cancelled_once() {
    use futures::FutureExt;
    let only = |code: &str| BTreeMap::from([(code.to_owned(), 1_u64)]);

    // A unary handler still working when the client went away.
    let handled = handled_by(|| {
        let call = GrpcCall::new((OTHER, OTHER));
        drop(unanswered(&call));
        assert_eq!(*call.phase(), Phase::Done);
    });
    assert_eq!(handled, only("CANCELLED"));

    // A stream still being prepared: its guard, in the dropped future, drops last.
    let handled = handled_by(|| {
        let call = GrpcCall::new((OTHER, OTHER));
        let end = call.defer();
        let inner = async move {
            let _end = end;
            std::future::pending::<Answer>().await
        };
        drop(ResponseFuture {
            inner,
            call: call.clone(),
        });
        assert_eq!(*call.phase(), Phase::Done);
    });
    assert_eq!(handled, only("CANCELLED"));

    // The guard already gone (the handler failed after deferring).
    let handled = handled_by(|| {
        let call = GrpcCall::new((OTHER, OTHER));
        drop(call.defer());
        drop(unanswered(&call));
    });
    assert_eq!(handled, only("CANCELLED"));

    // Resolved, then dropped (as the transport does): recorded at the head only.
    let handled = handled_by(|| {
        let call = GrpcCall::new((OTHER, OTHER));
        assert!(answered(&call).now_or_never().is_some());
    });
    assert_eq!(handled, only("OK"));

    // A deferred stream whose head went out: the guard records, not the future's drop.
    let handled = handled_by(|| {
        let call = GrpcCall::new((OTHER, OTHER));
        let mut end = call.defer();
        assert!(answered(&call).now_or_never().is_some());
        assert_eq!(*call.phase(), Phase::Streaming);
        end.finish(Code::Unavailable);
        drop(end);
    });
    assert_eq!(handled, only("UNAVAILABLE"));
}
