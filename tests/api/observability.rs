//! The metrics endpoint: real scrape, exposition parsed, every metric the
//! operations guide promises present with its labels; plain HTTP probes.

use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::api::pb;
use std::collections::BTreeSet;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn metrics_are_scraped_and_parse() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let toml = config_toml_with(
        &url,
        "failure_rate = 1.0",
        "latency = \"1ms\"",
        "[metering.default_limits]\nmax_requests = 2\n",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    for _ in 0..3 {
        // Two served by the fallback (primary always fails), the third refused by the cap.
        let _ = c
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: "Any discount?".into(),
                ..Default::default()
            })
            .await;
    }
    let _ = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: String::new(),
            ..Default::default()
        })
        .await;

    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let body = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exposition parses");

    let names: BTreeSet<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    let has = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .any(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    };
    assert!(
        has(
            "llm_requests_total",
            &[
                ("provider", "primary"),
                ("model", "gpt-4o-mini"),
                ("status", "HTTP_503")
            ]
        ),
        "{names:?}"
    );
    assert!(
        has(
            "llm_requests_total",
            &[("provider", "fallback"), ("status", "ok")]
        ),
        "{}",
        body.lines()
            .filter(|l| l.starts_with("llm_req"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        names.contains("llm_response_time_seconds_bucket")
            || names.contains("llm_response_time_seconds"),
        "{names:?}"
    );
    assert!(has(
        "llm_tokens_total",
        &[("provider", "fallback"), ("type", "input")]
    ));
    assert!(has(
        "llm_tokens_total",
        &[("provider", "fallback"), ("type", "output")]
    ));
    assert!(has(
        "llm_cost_usd_total",
        &[("provider", "fallback"), ("model", "claude-3-haiku")]
    ));
    assert!(has("circuit_breaker_state", &[("provider", "primary")]));
    assert!(has(
        "orchestrator_fallbacks_total",
        &[
            ("task", "sms_classify"),
            ("from", "primary"),
            ("to", "fallback")
        ]
    ));
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("orchestrator_overhead_seconds")),
        "{names:?}"
    );
    assert!(scrape.samples.iter().any(|s| {
        s.metric == "usage_quota_rejections_total"
            && s.labels
                .get("team_bucket")
                .is_some_and(|b| b.starts_with('b'))
    }));
    assert!(has(
        "grpc_server_requests_total",
        &[
            ("method", "ai.orchestrator.v1.Orchestrator/ClassifySms"),
            ("code", "OK")
        ]
    ));
    assert!(has(
        "grpc_server_requests_total",
        &[
            ("method", "ai.orchestrator.v1.Orchestrator/ClassifySms"),
            ("code", "INVALID_ARGUMENT")
        ]
    ));
    assert!(has(
        "grpc_server_requests_total",
        &[("code", "RESOURCE_EXHAUSTED")]
    ));
    assert!(
        !body.contains("Any discount"),
        "message contents never reach metrics"
    );
    app.stop().await;
}
