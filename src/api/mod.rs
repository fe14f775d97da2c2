//! The gRPC surface: parse proto → domain types, call the task, record usage,
//! map errors once (in [`error`]).

pub mod admin;
pub mod auth;
pub mod convert;
pub mod error;
pub mod metrics_layer;
pub mod pb;
pub(crate) mod request;

use crate::{
    config::Config,
    router::AttemptRecord,
    store::Store,
    tasks::{
        CallContext, CallMeta, TaskError, TaskRunner, execute, research, sms_classify,
        sms_encoding::SmsEncoding, sms_generate,
    },
    telemetry::trace_id::TRACE_ID_HEADER,
    usage::{self, Meter, UsageRecord, ledger, pricing::usd, summary::Dimension},
};
use error::{Failure, to_status};
use futures::{FutureExt, Stream, StreamExt, future::Either};
use pb::orchestrator_server::Orchestrator;
use prost::Message;
use std::{pin::Pin, sync::Arc};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tracing::Instrument;

/// The `Orchestrator` service.
#[derive(Clone)]
pub struct OrchestratorApi {
    config: Arc<Config>,
    runner: TaskRunner,
    store: Store,
    meter: Meter,
    auth: crate::auth::Authenticator,
    inflight: Arc<tokio::sync::Semaphore>,
}

impl OrchestratorApi {
    /// A service over the given config, task runner, store and meter.
    pub fn new(
        config: Arc<Config>,
        runner: TaskRunner,
        store: Store,
        meter: Meter,
        auth: crate::auth::Authenticator,
    ) -> Self {
        let inflight = Arc::new(tokio::sync::Semaphore::new(
            config.server.max_concurrent_requests,
        ));
        Self {
            config,
            runner,
            store,
            meter,
            auth,
            inflight,
        }
    }

    fn begin(
        &self,
        context: Option<&pb::RequestContext>,
        budget: Option<&pb::Budget>,
        metadata: &MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<CallContext, Status> {
        let mut ctx =
            request::call_context(context, budget, metadata, &self.config.server, &self.meter)
                .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
        auth::principal(extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id))
            .map_err(|f| to_status(f, &ctx.trace_id))?;
        // Shed at once rather than queue: a caller can retry elsewhere.
        match self.inflight.clone().try_acquire_owned() {
            Ok(slot) => ctx.slot = Some(Arc::new(slot)),
            Err(_) => return Err(to_status(Failure::Overloaded, &ctx.trace_id)),
        }
        Ok(ctx)
    }

    /// Settles the call's metering (releasing its reservations, charging
    /// what it used, writing its usage record), then hands back the answer or
    /// the status. Input and quota errors are refused before any provider
    /// work and leave no record.
    ///
    /// Not an `async fn`: everything but the settlement is done before the
    /// future exists, and the settlement's future carries the rest as a
    /// `map`. An `async fn` holds its argument and the outcome twice over
    /// while the settlement is awaited, and every call in flight carries
    /// that state for the length of its settlement (docs/benchmarks.md,
    /// *Sizing*).
    fn finish<'a, T: 'a>(
        &'a self,
        ctx: &'a CallContext,
        task: &str,
        result: Result<(T, CallMeta), Failure>,
    ) -> impl Future<Output = Result<(T, CallMeta), Status>> + 'a {
        // Whether a provider was called: a call refused before that spent
        // nothing, and its reply does not wait for the disk.
        let (record, outcome, provider_time, reached) = match result {
            Ok((value, mut meta)) => {
                meta.cost_usd = self
                    .meter
                    .pricing()
                    .cost_of_attempts(&meta.attempts)
                    .map(usd);
                let provider_time = self.observe(task, &meta);
                (
                    self.record(ctx, task, &meta, "ok"),
                    Ok((value, meta)),
                    provider_time,
                    true,
                )
            }
            Err(Failure::Route(err)) => {
                let meta = CallMeta {
                    trace_id: ctx.trace_id.clone(),
                    usage: crate::router::total_usage(err.attempts()),
                    cost_usd: self
                        .meter
                        .pricing()
                        .cost_of_attempts(err.attempts())
                        .map(usd),
                    attempts: err.attempts().to_vec(),
                    latency: ctx.started.elapsed(),
                    ..CallMeta::default()
                };
                let provider_time = self.observe(task, &meta);
                let outcome = error::route_reason(&err);
                let reached = err.attempts().iter().any(AttemptRecord::reached_provider);
                (
                    self.record(ctx, task, &meta, outcome),
                    Err(to_status(Failure::Route(err), &ctx.trace_id)),
                    provider_time,
                    reached,
                )
            }
            Err(other) => {
                if matches!(other, Failure::Quota(_)) {
                    crate::telemetry::metrics::quota_rejection(&ctx.team_id);
                }
                return Either::Left(std::future::ready(Err(to_status(other, &ctx.trace_id))));
            }
        };

        // Durable before the response is sent: no acknowledged call that
        // reached a provider goes unrecorded.
        let settled = if reached {
            Either::Left(ctx.meter.settle(record))
        } else {
            Either::Right(ctx.meter.settle_refused(record))
        };
        Either::Right(settled.map(move |settled| {
            // Our overhead includes the settlement the response waits for.
            crate::telemetry::metrics::overhead(
                ctx.started.elapsed().saturating_sub(provider_time),
            );
            if let Err(err) = settled {
                return Err(to_status(Failure::Storage(err.to_string()), &ctx.trace_id));
            }
            outcome
        }))
    }

    /// Metrics of a finished call: tokens and cost per attempt, fallbacks.
    /// Returns the time spent waiting on providers (not our overhead):
    /// their calls, retry backoff and their rate/concurrency limits.
    fn observe(&self, task: &str, meta: &CallMeta) -> std::time::Duration {
        use crate::telemetry::metrics;
        let mut provider_time = std::time::Duration::ZERO;
        let resilience = self.runner.router.resilience();
        for a in &meta.attempts {
            if let Some(guards) = resilience.get(&a.provider) {
                metrics::breaker_state(&a.provider, guards.breaker.state().metric_value());
            }
            let (input, output) = (a.usage.input_tokens, a.usage.output_tokens);
            let cost = self
                .meter
                .pricing()
                .cost_micros(&a.provider, &a.model, input, output)
                .map(usd);
            metrics::usage(&a.provider, &a.model, input, output, cost);
            // Backoff and limiter waits are waiting on providers too.
            provider_time += a.latency + a.waited;
        }
        if let (true, Some(first)) = (meta.degraded, meta.attempts.first()) {
            metrics::fallback(task, &first.provider, &meta.provider);
        }
        provider_time
    }

    fn record(&self, ctx: &CallContext, task: &str, meta: &CallMeta, outcome: &str) -> UsageRecord {
        UsageRecord {
            created_at_ms: ctx.meter.started_at_ms(),
            team_id: ctx.team_id.clone(),
            user_id: ctx.user_id.clone(),
            task: task.to_owned(),
            provider: meta.provider.clone(),
            model: meta.model.clone(),
            prompt_key: meta.prompt_key.clone(),
            prompt_version: i64::from(meta.prompt_version),
            trace_id: ctx.trace_id.clone(),
            input_tokens: i64::try_from(meta.usage.input_tokens).unwrap_or(i64::MAX),
            output_tokens: i64::try_from(meta.usage.output_tokens).unwrap_or(i64::MAX),
            cost_micros: self.meter.pricing().cost_of_attempts(&meta.attempts),
            latency_ms: i64::try_from(meta.latency.as_millis()).unwrap_or(i64::MAX),
            outcome: outcome.to_owned(),
            attempts: attempts_json(&meta.attempts),
            degraded: meta.degraded,
            channel: ctx.channel.as_str().to_owned(),
            priority: ctx.priority.as_str().to_owned(),
        }
    }

    /// The request's size limits: its fields together (`total`, the
    /// largest of `fields` named on a violation) and its history entries.
    fn check_input(
        &self,
        total: usize,
        fields: &[(&str, usize)],
        history: usize,
    ) -> Result<(), Failure> {
        request::check_history(history, &self.config.server)?;
        request::check_input(total, fields, &self.config.server)
    }
}

fn attempts_json(attempts: &[AttemptRecord]) -> String {
    let list: Vec<serde_json::Value> = attempts
        .iter()
        .map(|a| {
            serde_json::json!({
                "provider": a.provider,
                "model": a.model,
                "outcome": format!("{:?}", a.outcome),
                "latency_ms": a.latency.as_millis() as u64,
                "error_code": a.error_code,
                "retry": a.retry,
                "input_tokens": a.usage.input_tokens,
                "output_tokens": a.usage.output_tokens,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The span of one request: every log line inside it carries the trace ID.
/// Only identifiers go here, never message contents.
fn request_span(rpc: &'static str, ctx: &CallContext) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        rpc,
        trace_id = %ctx.trace_id,
        team_id = %ctx.team_id,
        priority = ctx.priority.as_str(),
    );
    if let Some(tp) = &ctx.traceparent {
        crate::telemetry::otel::continue_trace(&span, tp);
    }
    span
}

/// Wraps a body in a response carrying the `x-trace-id` metadata.
fn reply<T>(trace_id: &str, body: T) -> Response<T> {
    let mut response = Response::new(body);
    if let Ok(value) = trace_id.parse() {
        response.metadata_mut().insert(TRACE_ID_HEADER, value);
    }
    response
}

/// Encoded bytes of a history, entries' framing included: an empty entry
/// still costs a prompt line, so it counts.
fn history_bytes(history: &[pb::SmsMessage]) -> usize {
    history.iter().map(|m| m.encoded_len() + 2).sum()
}

fn context_bytes(context: Option<&pb::RequestContext>) -> usize {
    context.map_or(0, Message::encoded_len)
}

fn execute_input(
    api: &OrchestratorApi,
    input: Option<pb::execute_request::Input>,
) -> Result<serde_json::Map<String, serde_json::Value>, Failure> {
    let server = &api.config.server;
    match input {
        None => Ok(serde_json::Map::new()),
        Some(pb::execute_request::Input::InputStruct(s)) => {
            request::check_depth("input_struct", request::struct_depth(&s), server)?;
            Ok(convert::struct_to_json(s))
        }
        Some(pb::execute_request::Input::InputJson(json)) => match serde_json::from_str(&json) {
            Ok(serde_json::Value::Object(map)) => {
                let depth = 1 + map.values().map(request::json_depth).max().unwrap_or(0);
                request::check_depth("input_json", depth, server)?;
                Ok(map)
            }
            Ok(_) => Err(Failure::invalid("input_json", "must be a JSON object")),
            Err(e) => Err(Failure::invalid(
                "input_json",
                &format!("not valid JSON: {e}"),
            )),
        },
    }
}

/// The size check of an `Execute` request (see [`OrchestratorApi::check_input`]).
fn check_execute(api: &OrchestratorApi, req: &pb::ExecuteRequest) -> Result<(), Failure> {
    let input = match &req.input {
        Some(pb::execute_request::Input::InputStruct(s)) => ("input_struct", s.encoded_len()),
        Some(pb::execute_request::Input::InputJson(j)) => ("input_json", j.len()),
        None => ("input_struct", 0),
    };
    api.check_input(
        req.encoded_len(),
        &[
            input,
            ("task", req.task.len()),
            ("context", context_bytes(req.context.as_ref())),
        ],
        0,
    )
}

fn check_task_name(task: &str) -> Result<(), Failure> {
    if task.is_empty() {
        return Err(Failure::invalid("task", "is required"));
    }
    Ok(())
}

fn encoding(e: Option<SmsEncoding>) -> pb::SmsEncoding {
    match e {
        Some(SmsEncoding::Gsm7) => pb::SmsEncoding::Gsm7,
        Some(SmsEncoding::Ucs2) => pb::SmsEncoding::Ucs2,
        None => pb::SmsEncoding::Unspecified,
    }
}

fn intent(i: sms_classify::Intent) -> pb::SmsIntent {
    use sms_classify::Intent::*;
    match i {
        Interested => pb::SmsIntent::Interested,
        NotInterested => pb::SmsIntent::NotInterested,
        Question => pb::SmsIntent::Question,
        AppointmentRequest => pb::SmsIntent::AppointmentRequest,
        CallbackLater => pb::SmsIntent::CallbackLater,
        OptOut => pb::SmsIntent::OptOut,
        WrongNumber => pb::SmsIntent::WrongNumber,
        Other => pb::SmsIntent::Other,
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ExecuteEvent, Status>> + Send>>;

/// A unary handler's future, as `async_trait` declares it.
///
/// The AI handlers are written as plain functions returning one, not as
/// `async fn`s: theirs would keep the whole request (~300 bytes) as a
/// capture for the call's life, beside the parts taken out of it, and
/// `begin` runs before the future exists, so the request's metadata and
/// extensions are not held either. Every call in flight carries this future
/// for as long as its provider takes (docs/benchmarks.md, *Sizing*).
type Unary<'f, T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send + 'f>>;

#[tonic::async_trait]
impl Orchestrator for OrchestratorApi {
    fn execute<'a, 'f>(
        &'a self,
        request: Request<pb::ExecuteRequest>,
    ) -> Unary<'f, pb::ExecuteResponse>
    where
        'a: 'f,
        Self: 'f,
    {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = match self.begin(
            req.context.as_ref(),
            req.budget.as_ref(),
            &metadata,
            &extensions,
        ) {
            Ok(ctx) => ctx,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(async move {
            let span = request_span("Execute", &ctx);
            let sized = check_execute(self, &req);
            let result = async {
                check_task_name(&req.task)?;
                sized?;
                let input = execute_input(self, req.input)?;
                Ok(execute::execute(&self.runner, &ctx, &req.task, input).await?)
            }
            .instrument(span.clone())
            .await;
            let (output, meta) = self
                .finish(&ctx, &req.task, result)
                .instrument(span)
                .await?;
            Ok(reply(
                &ctx.trace_id,
                pb::ExecuteResponse {
                    output: output.json.map(convert::json_to_struct),
                    text: output.text,
                    meta: Some(convert::meta(&meta)),
                },
            ))
        })
    }

    type ExecuteStreamStream = EventStream;

    async fn execute_stream(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStreamStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = self.begin(
            req.context.as_ref(),
            req.budget.as_ref(),
            &metadata,
            &extensions,
        )?;
        let span = request_span("ExecuteStream", &ctx);
        let sized = check_execute(self, &req);
        let prepared = async {
            check_task_name(&req.task)?;
            sized?;
            let input = execute_input(self, req.input)?;
            let (rendered, request) =
                execute::prepare(&self.runner, &ctx, &req.task, input).await?;
            let chain = self
                .runner
                .router
                .chain(&req.task)
                .map_err(TaskError::from)?;
            ctx.meter
                .reserve(&req.task, chain, &request)
                .await
                .map_err(TaskError::from)?;
            Ok::<_, Failure>((rendered, request))
        }
        .instrument(span.clone())
        .await;
        let (rendered, completion_request) = prepared.map_err(|f| {
            // Refused before any provider work, so `finish` never sees it.
            if matches!(f, Failure::Quota(_)) {
                crate::telemetry::metrics::quota_rejection(&ctx.team_id);
            }
            to_status(f, &ctx.trace_id)
        })?;
        let events = self.runner.router.stream(
            &req.task,
            completion_request,
            ctx.deadline,
            &crate::router::RouteOptions {
                priority: ctx.priority,
                primary_model: rendered.prompt.model.clone(),
            },
        );
        let api = self.clone();
        let task = req.task.clone();
        let trace_id = ctx.trace_id.clone();
        let event_trace_id = trace_id.clone();
        // From here the call cannot fail before streaming: the gRPC metrics
        // wait for the stream's final status.
        let mut stream_end = extensions
            .get::<metrics_layer::GrpcCall>()
            .map(metrics_layer::GrpcCall::defer);
        let stream = async_stream::stream! {
            use crate::router::RouteEvent;
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let out = match event {
                    RouteEvent::Started { provider, model } => pb::execute_event::Event::Started(
                        pb::execute_event::Started { trace_id: event_trace_id.clone(), provider, model },
                    ),
                    RouteEvent::Fallback { from, to, reason } => {
                        pb::execute_event::Event::Fallback(pb::execute_event::Fallback { from, to, reason })
                    }
                    RouteEvent::Delta(text) => pb::execute_event::Event::Delta(pb::execute_event::Delta { text }),
                    RouteEvent::Completed { completion, provider, model, degraded, attempts } => {
                        let meta = CallMeta {
                            trace_id: event_trace_id.clone(),
                            usage: crate::router::total_usage(&attempts),
                            provider,
                            model,
                            degraded,
                            attempts,
                            cost_usd: None,
                            latency: ctx.started.elapsed(),
                            prompt_key: rendered.prompt.key.clone(),
                            prompt_version: rendered.prompt.version,
                        };
                        // Streamed text cannot be taken back: with an output schema,
                        // `output` is set only when the whole answer matches it.
                        let output = execute::parse(&completion.text, api.runner.output_validator(&task).as_deref())
                            .ok()
                            .and_then(|o| o.json);
                        match api.finish(&ctx, &task, Ok((completion.text, meta))).await {
                            Ok((text, meta)) => pb::execute_event::Event::Completed(pb::ExecuteResponse {
                                output: output.map(convert::json_to_struct),
                                text,
                                meta: Some(convert::meta(&meta)),
                            }),
                            Err(status) => {
                                if let Some(end) = stream_end.as_mut() { end.finish(status.code()); }
                                yield Err(status);
                                return;
                            }
                        }
                    }
                    RouteEvent::Failed(err) => {
                        let failure = Failure::from(TaskError::Route(err));
                        if let Err(status) = api.finish::<()>(&ctx, &task, Err(failure)).await {
                            if let Some(end) = stream_end.as_mut() { end.finish(status.code()); }
                            yield Err(status);
                        }
                        return;
                    }
                };
                yield Ok(pb::ExecuteEvent { event: Some(out) });
            }
            if let Some(end) = stream_end.as_mut() { end.finish(tonic::Code::Ok); }
        };
        // The request span covers the whole stream (settlement included), and
        // provider attempts made while it is polled are its children.
        let stream = crate::telemetry::InSpan::new(Box::pin(stream), span);
        Ok(reply(&trace_id, Box::pin(stream) as EventStream))
    }

    fn classify_sms<'a, 'f>(
        &'a self,
        request: Request<pb::ClassifySmsRequest>,
    ) -> Unary<'f, pb::ClassifySmsResponse>
    where
        'a: 'f,
        Self: 'f,
    {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = match self.begin(
            req.context.as_ref(),
            req.budget.as_ref(),
            &metadata,
            &extensions,
        ) {
            Ok(ctx) => ctx,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(async move {
            let span = request_span("ClassifySms", &ctx);
            let result = async {
                self.check_input(
                    req.encoded_len(),
                    &[
                        ("message", req.message.len()),
                        ("history", history_bytes(&req.history)),
                        ("context", context_bytes(req.context.as_ref())),
                    ],
                    req.history.len(),
                )?;
                let input = sms_classify::ClassifyInput {
                    message: req.message,
                    history: convert::history(&req.history),
                };
                Ok(sms_classify::classify(&self.runner, &ctx, input).await?)
            }
            .instrument(span.clone())
            .await;
            let (answer, meta) = self
                .finish(&ctx, sms_classify::TASK, result)
                .instrument(span)
                .await?;
            Ok(reply(
                &ctx.trace_id,
                pb::ClassifySmsResponse {
                    intent: intent(answer.intent) as i32,
                    confidence: answer.confidence,
                    needs_review: answer.needs_review,
                    reason: answer.reason,
                    meta: Some(convert::meta(&meta)),
                },
            ))
        })
    }

    fn generate_sms<'a, 'f>(
        &'a self,
        request: Request<pb::GenerateSmsRequest>,
    ) -> Unary<'f, pb::GenerateSmsResponse>
    where
        'a: 'f,
        Self: 'f,
    {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = match self.begin(
            req.context.as_ref(),
            req.budget.as_ref(),
            &metadata,
            &extensions,
        ) {
            Ok(ctx) => ctx,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(async move {
            let span = request_span("GenerateSms", &ctx);
            let result = async {
                self.check_input(
                    req.encoded_len(),
                    &[
                        ("inbound_message", req.inbound_message.len()),
                        ("history", history_bytes(&req.history)),
                        ("lead", req.lead.as_ref().map_or(0, Message::encoded_len)),
                        ("goal", req.goal.len()),
                        ("context", context_bytes(req.context.as_ref())),
                    ],
                    req.history.len(),
                )?;
                let lead = req.lead.unwrap_or_default();
                let mut lead_map: std::collections::BTreeMap<String, String> =
                    lead.attributes.into_iter().collect();
                for (k, v) in [
                    ("first_name", lead.first_name),
                    ("last_name", lead.last_name),
                    ("company", lead.company),
                ] {
                    if !v.is_empty() {
                        lead_map.insert(k.to_owned(), v);
                    }
                }
                let input = sms_generate::GenerateInput {
                    inbound_message: req.inbound_message,
                    history: convert::history(&req.history),
                    lead: lead_map,
                    goal: req.goal,
                    max_segments: req.max_segments,
                };
                Ok(sms_generate::generate(&self.runner, &ctx, input).await?)
            }
            .instrument(span.clone())
            .await;
            let (answer, meta) = self
                .finish(&ctx, sms_generate::TASK, result)
                .instrument(span)
                .await?;
            Ok(reply(
                &ctx.trace_id,
                pb::GenerateSmsResponse {
                    encoding: encoding(sms_generate::encoding(&answer)) as i32,
                    segments: answer.size.map_or(0, |s| s.segments),
                    response: answer.text,
                    escalate: answer.escalate,
                    escalate_reason: answer.escalate_reason,
                    meta: Some(convert::meta(&meta)),
                },
            ))
        })
    }

    fn research<'a, 'f>(
        &'a self,
        request: Request<pb::ResearchRequest>,
    ) -> Unary<'f, pb::ResearchResponse>
    where
        'a: 'f,
        Self: 'f,
    {
        let (metadata, extensions, req) = request.into_parts();
        let ctx = match self.begin(
            req.context.as_ref(),
            req.budget.as_ref(),
            &metadata,
            &extensions,
        ) {
            Ok(ctx) => ctx,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(async move {
            let span = request_span("Research", &ctx);
            let depth = match pb::ResearchDepth::try_from(req.depth) {
                Ok(pb::ResearchDepth::Deep) => research::Depth::Deep,
                _ => research::Depth::Verify,
            };
            let result = async {
                self.check_input(
                    req.encoded_len(),
                    &[
                        ("query", req.query.len()),
                        ("context", context_bytes(req.context.as_ref())),
                    ],
                    0,
                )?;
                Ok(research::research(&self.runner, &ctx, &req.query, depth).await?)
            }
            .instrument(span.clone())
            .await;
            let (answer, meta) = self
                .finish(&ctx, depth.task(), result)
                .instrument(span)
                .await?;
            Ok(reply(
                &ctx.trace_id,
                pb::ResearchResponse {
                    summary: answer.summary,
                    findings: answer
                        .findings
                        .into_iter()
                        .map(|f| pb::Finding {
                            claim: f.claim,
                            sources: f.sources,
                            confidence: f.confidence,
                        })
                        .collect(),
                    meta: Some(convert::meta(&meta)),
                },
            ))
        })
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let trace_id = crate::telemetry::trace_id::resolve("", &metadata)
            .map(|(t, _)| t)
            .unwrap_or_else(|_| crate::telemetry::trace_id::generate());
        let fail = |f: Failure| to_status(f, &trace_id);
        request::check_id(&req.team_id, true)
            .map_err(|why| fail(Failure::invalid("team_id", why)))?;
        auth::principal(&extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "team_id", &req.team_id))
            .map_err(fail)?;
        // It reads the database: shed with the calls under the same bound.
        let _slot = self
            .inflight
            .clone()
            .try_acquire_owned()
            .map_err(|_| fail(Failure::Overloaded))?;
        let (month_start, month_end) = usage::summary::month_of(chrono::Utc::now());
        // Caller-supplied: validated, never trusted to fit in the arithmetic.
        let instant = |field: &str, t: Option<prost_types::Timestamp>, default: i64| match t {
            None => Ok(default),
            Some(t) => usage::summary::timestamp_ms(t.seconds, t.nanos).ok_or_else(|| {
                fail(Failure::invalid(
                    field,
                    "must be a valid Timestamp between 0001-01-01 and 9999-12-31 UTC",
                ))
            }),
        };
        let start = instant("period_start", req.period_start, month_start)?;
        let end = instant("period_end", req.period_end, month_end)?;
        if end <= start {
            return Err(fail(Failure::invalid(
                "period_end",
                "must be after period_start",
            )));
        }
        let mut dims = Vec::new();
        for (i, d) in req.group_by.iter().enumerate() {
            dims.push(match pb::UsageDimension::try_from(*d) {
                Ok(pb::UsageDimension::Task) => Dimension::Task,
                Ok(pb::UsageDimension::Provider) => Dimension::Provider,
                Ok(pb::UsageDimension::Model) => Dimension::Model,
                Ok(pb::UsageDimension::Day) => Dimension::Day,
                _ => {
                    return Err(fail(Failure::invalid(
                        &format!("group_by[{i}]"),
                        "unknown dimension",
                    )));
                }
            });
        }
        let summary = usage::summary::summarize(&self.store, &req.team_id, start, end, &dims)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        let caps = ledger::caps_of(&self.store, &req.team_id, self.meter.default_caps())
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        // Limits and remaining describe the month the period starts in (caps
        // are per month; a period spanning months has no single "remaining").
        let start_month = usage::summary::month_of_ms(start).map_or(month_start, |(m, _)| m);
        let balance = ledger::balance_of(&self.store, &req.team_id, start_month)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        let (limits, remaining) = convert::limits(&caps, &balance);
        let ts = |ms: i64| prost_types::Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        };
        Ok(reply(
            &trace_id,
            pb::GetUsageResponse {
                team_id: req.team_id,
                period_start: Some(ts(start)),
                period_end: Some(ts(end)),
                totals: Some(convert::totals(&summary.totals)),
                buckets: summary
                    .buckets
                    .iter()
                    .map(|(k, t)| pb::UsageBucket {
                        task: k.task.clone().unwrap_or_default(),
                        provider: k.provider.clone().unwrap_or_default(),
                        model: k.model.clone().unwrap_or_default(),
                        day: k.day.clone().unwrap_or_default(),
                        totals: Some(convert::totals(t)),
                    })
                    .collect(),
                limits: Some(limits),
                remaining: Some(remaining),
            },
        ))
    }

    async fn get_provider_health(
        &self,
        request: Request<pb::GetProviderHealthRequest>,
    ) -> Result<Response<pb::GetProviderHealthResponse>, Status> {
        // No context here: the trace ID comes from the metadata or is new.
        let trace_id = crate::telemetry::trace_id::resolve("", request.metadata())
            .map(|(t, _)| t)
            .unwrap_or_else(|_| crate::telemetry::trace_id::generate());
        let resilience = self.runner.router.resilience();
        let providers = self
            .config
            .providers
            .iter()
            .map(|(name, p)| {
                let Some(guards) = resilience.get(name) else {
                    return pb::ProviderHealth {
                        provider: name.clone(),
                        kind: p.kind.as_str().to_owned(),
                        ..Default::default()
                    };
                };
                convert::provider_health(
                    name,
                    p.kind.as_str(),
                    &guards.breaker.snapshot(),
                    &guards.health.snapshot(),
                )
            })
            .collect();
        Ok(reply(
            &trace_id,
            pb::GetProviderHealthResponse { providers },
        ))
    }
}
