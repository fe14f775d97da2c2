//! The real [`Router::run`] on tokio's paused clock against mock providers:
//! attempt counts, backoff bounds, nothing started after the deadline.
//! Start times come from the `provider_attempt` spans, not a re-implemented walk.

use super::*;
use crate::{
    config::Config,
    domain::{ChatMessage, ToolChoice, completion::Role},
    resilience::retry::Jitter,
};
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};
use tracing_subscriber::{
    Layer,
    layer::{Context, SubscriberExt},
};

const SEC: Duration = Duration::from_secs(1);

/// Latency of every mock call.
const CALL: Duration = Duration::from_millis(100);

/// `flaky` always fails with a retryable 503; `spare` always answers. Retry:
/// 3 attempts, caps 1 s, 2 s, 4 s; INTERACTIVE waits at most 250 ms.
fn config() -> Config {
    let toml = r#"
[database]
url = "sqlite://unused.db"
[providers.flaky]
kind = "mock"
timeout = "5s"
[providers.flaky.mock]
latency = "100ms"
failure_rate = 1.0
[providers.spare]
kind = "mock"
timeout = "5s"
[providers.spare.mock]
latency = "100ms"
[tasks.solo]
chain = [{ provider = "flaky", model = "m1" }]
[tasks.pair]
chain = [{ provider = "flaky", model = "m1" }, { provider = "spare", model = "m2" }]
[tasks.sure]
chain = [{ provider = "spare", model = "m2" }]
[pricing.m1]
price = "unknown"
[pricing.m2]
price = "unknown"
"#;
    Config::from_toml_str(toml, |_| None).unwrap()
}

fn router(config: Config, jitter: Jitter) -> Router {
    let providers = Providers::from_config(&config).unwrap();
    Router::new(Arc::new(config), providers, None).with_jitter(jitter)
}

fn request() -> CompletionRequest {
    CompletionRequest {
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        model: String::new(),
        system: None,
        messages: vec![ChatMessage {
            role: Role::User,
            content: "hi".into(),
            ..Default::default()
        }],
        temperature: None,
        max_tokens: 16,
        response_format: None,
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        traceparent: None,
        // The router sets each attempt's own deadline.
        deadline: Instant::now(),
    }
}

/// When each `provider_attempt` span was opened, with its provider.
#[derive(Clone, Default)]
struct AttemptStarts(Arc<Mutex<Vec<(String, Instant)>>>);

impl AttemptStarts {
    fn of(&self, provider: &str) -> Vec<Instant> {
        let starts = self.0.lock().unwrap();
        starts
            .iter()
            .filter(|(p, _)| p == provider)
            .map(|(_, at)| *at)
            .collect()
    }

    fn all(&self) -> Vec<Instant> {
        self.0.lock().unwrap().iter().map(|(_, at)| *at).collect()
    }
}

/// Picks the `provider` field out of a span's attributes.
struct ProviderField(Option<String>);

impl tracing::field::Visit for ProviderField {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "provider" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for AttemptStarts {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        if attrs.metadata().name() == "provider_attempt" {
            let mut provider = ProviderField(None);
            attrs.record(&mut provider);
            let provider = provider.0.unwrap_or_default();
            self.0.lock().unwrap().push((provider, Instant::now()));
        }
    }
}

/// Runs `task` until `deadline`, recording when each attempt started.
async fn run(
    router: &Router,
    task: &str,
    priority: Priority,
    deadline: Instant,
) -> (Result<Routed<String>, RouteError>, AttemptStarts) {
    let starts = AttemptStarts::default();
    // Thread-local, and #[tokio::test] polls everything on this thread.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(starts.clone()));
    let options = RouteOptions {
        priority,
        primary_model: None,
    };
    let result = router
        .run(
            router.chain(task).unwrap(),
            &request(),
            deadline,
            &options,
            |c| Ok(c.text.clone()),
        )
        .await;
    (result, starts)
}

/// `(provider, retry, error code)` of every attempt.
fn summary(attempts: &[AttemptRecord]) -> Vec<(&str, u32, Option<&str>)> {
    attempts
        .iter()
        .map(|a| (a.provider.as_str(), a.retry, a.error_code.as_deref()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn background_makes_exactly_three_attempts_with_the_full_backoff() {
    let router = router(config(), Jitter::Fixed(1.0));
    let t0 = Instant::now();
    let (result, starts) = run(&router, "solo", Priority::Background, t0 + 60 * SEC).await;
    let Err(RouteError::AllProvidersFailed { attempts }) = &result else {
        panic!("{result:?}")
    };
    let failed = Some("HTTP_503");
    assert_eq!(
        summary(attempts),
        [
            ("flaky", 0, failed),
            ("flaky", 1, failed),
            ("flaky", 2, failed)
        ]
    );
    // Jitter 1.0 waits the whole cap: 1 s after attempt 1, 2 s after attempt 2.
    assert_eq!(
        starts.of("flaky"),
        [t0, t0 + CALL + SEC, t0 + 2 * CALL + 3 * SEC]
    );
    assert_eq!(t0.elapsed(), 3 * CALL + 3 * SEC, "no wait after the last");
    // The backoff is credited to the attempt it waited for.
    let waited: Vec<Duration> = attempts.iter().map(|a| a.waited).collect();
    assert_eq!(waited, [Duration::ZERO, SEC, 2 * SEC]);
}

#[tokio::test(start_paused = true)]
async fn random_backoff_waits_stay_within_their_caps() {
    let mut waits = std::collections::BTreeSet::new();
    for _ in 0..20 {
        // A fresh router each time: 60 failures would open the breaker.
        let router = router(config(), Jitter::Random);
        let t0 = Instant::now();
        let (result, starts) = run(&router, "solo", Priority::Background, t0 + 60 * SEC).await;
        assert!(
            matches!(result, Err(RouteError::AllProvidersFailed { ref attempts }) if attempts.len() == 3)
        );
        let starts = starts.of("flaky");
        assert_eq!(starts.len(), 3);
        for (i, cap) in [(1, SEC), (2, 2 * SEC)] {
            let wait = starts[i] - starts[i - 1] - CALL;
            assert!(wait <= cap, "wait {i} was {wait:?}, cap {cap:?}");
            waits.insert(wait);
        }
    }
    assert!(waits.len() > 10, "the jitter is random: {waits:?}");
}

#[tokio::test(start_paused = true)]
async fn nothing_starts_after_the_deadline() {
    // Attempt 2 starts at 1.1 s and is cut at the 1.15 s deadline; the next
    // wait (2 s) cannot fit, and the fallback is not called either.
    let router = router(config(), Jitter::Fixed(1.0));
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_millis(1_150);
    let (result, starts) = run(&router, "pair", Priority::Background, deadline).await;
    let Err(RouteError::DeadlineExceeded { attempts }) = &result else {
        panic!("{result:?}")
    };
    assert_eq!(
        summary(attempts),
        [
            ("flaky", 0, Some("HTTP_503")),
            ("flaky", 1, Some("DEADLINE_EXCEEDED"))
        ]
    );
    assert_eq!(starts.of("flaky"), [t0, t0 + CALL + SEC]);
    assert!(
        starts.of("spare").is_empty(),
        "no attempt after the deadline"
    );
    assert!(starts.all().iter().all(|at| *at < deadline));
    assert_eq!(
        Instant::now(),
        deadline,
        "answered at the deadline, not later"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_would_pass_the_deadline_moves_on_instead() {
    // After attempt 2 (ends at 1.2 s) the 2 s wait would end at 3.2 s, past
    // the 2.5 s deadline: the walk moves on to `spare` at once.
    let router = router(config(), Jitter::Fixed(1.0));
    let t0 = Instant::now();
    let (result, starts) = run(
        &router,
        "pair",
        Priority::Background,
        t0 + Duration::from_millis(2_500),
    )
    .await;
    let routed = result.unwrap();
    assert_eq!((routed.provider.as_str(), routed.degraded), ("spare", true));
    assert_eq!(starts.of("flaky"), [t0, t0 + CALL + SEC]);
    assert_eq!(starts.of("spare"), [t0 + 2 * CALL + SEC]);
}

#[tokio::test(start_paused = true)]
async fn interactive_fails_over_without_waiting() {
    let router = router(config(), Jitter::Fixed(1.0));
    let t0 = Instant::now();
    let (result, starts) = run(&router, "pair", Priority::Interactive, t0 + 60 * SEC).await;
    let routed = result.unwrap();
    assert_eq!(
        summary(&routed.attempts),
        [("flaky", 0, Some("HTTP_503")), ("spare", 0, None)]
    );
    assert_eq!(starts.of("spare"), [t0 + CALL], "no backoff sleep");
}

#[tokio::test(start_paused = true)]
async fn an_absurd_provider_timeout_is_bounded_by_the_deadline_not_a_panic() {
    let mut config = config();
    for p in config.providers.values_mut() {
        p.timeout = Duration::MAX;
    }
    let router = router(config, Jitter::Fixed(0.0));
    let t0 = Instant::now();
    let (result, _) = run(&router, "sure", Priority::Interactive, t0 + SEC).await;
    assert_eq!(result.unwrap().provider, "spare");
    assert_eq!(t0.elapsed(), CALL);
}

#[tokio::test(start_paused = true)]
async fn attempts_cut_by_the_callers_deadline_never_count_against_the_provider() {
    // `spare` answers in 100 ms; every caller gives up after 50 ms.
    let mut config = config();
    config
        .providers
        .get_mut("spare")
        .unwrap()
        .breaker
        .failure_threshold = 1;
    let router = router(config, Jitter::Fixed(0.0));
    for _ in 0..10 {
        let deadline = Instant::now() + Duration::from_millis(50);
        let (result, _) = run(&router, "sure", Priority::Background, deadline).await;
        let Err(RouteError::DeadlineExceeded { attempts }) = &result else {
            panic!("{result:?}")
        };
        assert_eq!(summary(attempts), [("spare", 0, Some("DEADLINE_EXCEEDED"))]);
        assert_eq!(attempts[0].outcome, AttemptOutcome::Deadline);
    }
    let guards = router.resilience().get("spare").unwrap();
    assert_eq!(guards.breaker.snapshot().consecutive_failures, 0);
    let health = guards.health.snapshot();
    assert_eq!((health.calls, health.deadline_exceeded), (0, 10));
    // A caller with time to wait is served.
    let (result, _) = run(&router, "sure", Priority::Background, Instant::now() + SEC).await;
    assert!(result.is_ok(), "{result:?}");
}
