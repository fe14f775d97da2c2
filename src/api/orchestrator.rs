//! The `Orchestrator` service: each AI RPC opens a call (one helper), runs
//! its task through the call pipeline, and maps the answer back to proto.

use super::{
    convert,
    error::{Failure, to_status},
    metrics_layer,
    open::{self, Caller, Unary},
    pb, reply, request,
};
use crate::{
    auth::Authenticator,
    call::{CallEvent, CallMeta, Pipeline},
    config::Config,
    domain::sms::SmsEncoding,
    prompts,
    store::Store,
    tasks::{execute::Execute, research, sms_classify, sms_generate},
};
use futures::{Stream, StreamExt};
use pb::orchestrator_server::Orchestrator;
use prost::Message;
use std::{pin::Pin, sync::Arc};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tracing::Instrument;

/// The `Orchestrator` service.
#[derive(Clone)]
pub struct OrchestratorApi {
    pub(super) config: Arc<Config>,
    pub(super) pipeline: Pipeline,
    pub(super) store: Store,
    pub(super) auth: Authenticator,
}

impl OrchestratorApi {
    /// A service over the call pipeline, the store (usage reads) and the authenticator.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, store: Store, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            store,
            auth,
        }
    }

    /// The caller of AI RPC `rpc` (see [`open::caller`]), with the request's `total` bytes
    /// (the largest of `fields` named on a violation) and `history` entries checked.
    fn caller(
        &self,
        rpc: &'static str,
        envelope: (Option<&pb::RequestContext>, Option<&pb::Budget>),
        parts: (&MetadataMap, &tonic::Extensions),
        (total, fields, history): (usize, &[(&str, usize)], usize),
    ) -> Result<Caller, Status> {
        let service = pb::orchestrator_server::SERVICE_NAME;
        let caller = open::caller(
            &self.config,
            &self.auth,
            (service, rpc),
            envelope,
            parts.0,
            parts.1,
        )?;
        request::check_history(history, &self.config.server)
            .and_then(|()| request::check_input(total, fields, &self.config.server))
            .map_err(|f| caller.fail(f))?;
        Ok(caller)
    }
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
            request::check_finite("input_struct", &s)?;
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

/// The request's `prompt_key`: none when empty, else a key a version could be stored under
/// (whether one is, the call finds out).
fn prompt_override(key: String) -> Result<Option<String>, Failure> {
    if key.is_empty() {
        return Ok(None);
    }
    prompts::check_key(&key).map_err(|why| Failure::invalid("prompt_key", &why))?;
    Ok(Some(key))
}

/// Parses an `Execute` request: caller, task, sizes, prompt key, input.
fn parse_execute(
    api: &OrchestratorApi,
    rpc: &'static str,
    parts: (&MetadataMap, &tonic::Extensions),
    req: pb::ExecuteRequest,
) -> Result<(Caller, Execute), Status> {
    let input = match &req.input {
        Some(pb::execute_request::Input::InputStruct(s)) => ("input_struct", s.encoded_len()),
        Some(pb::execute_request::Input::InputJson(j)) => ("input_json", j.len()),
        None => ("input_struct", 0),
    };
    let fields = [
        input,
        ("task", req.task.len()),
        ("prompt_key", req.prompt_key.len()),
        ("context", context_bytes(req.context.as_ref())),
    ];
    let envelope = (req.context.as_ref(), req.budget.as_ref());
    let caller = api.caller(rpc, envelope, parts, (req.encoded_len(), &fields, 0))?;
    if req.task.is_empty() {
        return Err(caller.fail(Failure::invalid("task", "is required")));
    }
    let prompt_key = prompt_override(req.prompt_key).map_err(|f| caller.fail(f))?;
    let input = execute_input(api, req.input).map_err(|f| caller.fail(f))?;
    let execute = Execute {
        task: req.task,
        input,
        prompt_key,
    };
    Ok((caller, execute))
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
        let parsed = parse_execute(self, "Execute", (&metadata, &extensions), req);
        open::unary(&self.pipeline, parsed, |output, meta| pb::ExecuteResponse {
            output: output.json.map(convert::json_to_struct),
            text: output.text,
            meta: Some(convert::meta(meta)),
        })
    }

    type ExecuteStreamStream = EventStream;

    async fn execute_stream(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStreamStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let (Caller { ctx, span, .. }, execute) =
            parse_execute(self, "ExecuteStream", (&metadata, &extensions), req)?;
        let trace_id = ctx.trace_id.clone();
        let events = self
            .pipeline
            .stream(ctx, execute)
            .instrument(span.clone())
            .await
            .map_err(|e| to_status(e.into(), &trace_id))?;
        // From here the call cannot fail before streaming: the gRPC metrics
        // wait for the stream's final status.
        let stream_end = extensions
            .get::<metrics_layer::GrpcCall>()
            .map(metrics_layer::GrpcCall::defer);
        let stream = execute_events(events, trace_id.clone(), stream_end);
        // The request span covers the whole stream (settlement included), and
        // provider attempts made while it is polled are its children.
        let stream = crate::telemetry::InSpan::new(Box::pin(stream), span);
        // Polled by the transport, outside the handler: it carries the access record along.
        let stream = super::access::Noted::current(stream);
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
        let fields = [
            ("message", req.message.len()),
            ("history", history_bytes(&req.history)),
            ("context", context_bytes(req.context.as_ref())),
        ];
        let parsed = self
            .caller(
                "ClassifySms",
                (req.context.as_ref(), req.budget.as_ref()),
                (&metadata, &extensions),
                (req.encoded_len(), &fields, req.history.len()),
            )
            .map(|caller| {
                let input = sms_classify::ClassifyInput {
                    history: convert::history(&req.history),
                    message: req.message,
                };
                (caller, input)
            });
        open::unary(&self.pipeline, parsed, |answer, meta| {
            pb::ClassifySmsResponse {
                intent: intent(answer.intent) as i32,
                confidence: answer.confidence,
                needs_review: answer.needs_review,
                reason: answer.reason,
                meta: Some(convert::meta(meta)),
            }
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
        let fields = [
            ("inbound_message", req.inbound_message.len()),
            ("history", history_bytes(&req.history)),
            ("lead", req.lead.as_ref().map_or(0, Message::encoded_len)),
            ("goal", req.goal.len()),
            ("context", context_bytes(req.context.as_ref())),
        ];
        let parsed = self
            .caller(
                "GenerateSms",
                (req.context.as_ref(), req.budget.as_ref()),
                (&metadata, &extensions),
                (req.encoded_len(), &fields, req.history.len()),
            )
            .map(|caller| (caller, convert::generate_input(req)));
        open::unary(&self.pipeline, parsed, |answer, meta| {
            pb::GenerateSmsResponse {
                encoding: encoding(sms_generate::encoding(&answer)) as i32,
                segments: answer.size.map_or(0, |s| s.segments),
                response: answer.text,
                escalate: answer.escalate,
                escalate_reason: answer.escalate_reason,
                meta: Some(convert::meta(meta)),
            }
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
        let depth = match pb::ResearchDepth::try_from(req.depth) {
            Ok(pb::ResearchDepth::Deep) => research::Depth::Deep,
            _ => research::Depth::Verify,
        };
        let fields = [
            ("query", req.query.len()),
            ("context", context_bytes(req.context.as_ref())),
        ];
        let parsed = self
            .caller(
                "Research",
                (req.context.as_ref(), req.budget.as_ref()),
                (&metadata, &extensions),
                (req.encoded_len(), &fields, 0),
            )
            .map(|caller| {
                let query = research::Query {
                    query: req.query,
                    depth,
                };
                (caller, query)
            });
        open::unary(&self.pipeline, parsed, |answer, meta| {
            research_response(answer, meta)
        })
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageResponse>, Status> {
        self.usage(request).await
    }

    async fn get_provider_health(
        &self,
        request: Request<pb::GetProviderHealthRequest>,
    ) -> Result<Response<pb::GetProviderHealthResponse>, Status> {
        self.provider_health(&request)
    }
}

fn research_response(answer: research::Answer, meta: &CallMeta) -> pb::ResearchResponse {
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
        citations: answer
            .citations
            .into_iter()
            .map(|c| pb::Citation {
                url: c.url,
                title: c.title.unwrap_or_default(),
            })
            .collect(),
        meta: Some(convert::meta(meta)),
    }
}

/// A streamed call's events in proto terms; a failure ends the stream with
/// its status, and the RPC's metrics end with the stream.
fn execute_events(
    events: impl Stream<Item = CallEvent> + Send + 'static,
    trace_id: String,
    mut stream_end: Option<metrics_layer::StreamEnd>,
) -> impl Stream<Item = Result<pb::ExecuteEvent, Status>> + Send + 'static {
    async_stream::stream! {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            use pb::execute_event::Event;
            let out = match event {
                CallEvent::Started { provider, model } => Event::Started(
                    pb::execute_event::Started { trace_id: trace_id.clone(), provider, model },
                ),
                CallEvent::Fallback { from, to, reason } => {
                    Event::Fallback(pb::execute_event::Fallback { from, to, reason })
                }
                CallEvent::Delta(text) => Event::Delta(pb::execute_event::Delta { text }),
                CallEvent::Completed { completion, json, meta } => {
                    Event::Completed(pb::ExecuteResponse {
                        output: json.map(convert::json_to_struct),
                        text: completion.text,
                        meta: Some(convert::meta(&meta)),
                    })
                }
                CallEvent::Failed(err) => {
                    let status = to_status(err.into(), &trace_id);
                    if let Some(end) = stream_end.as_mut() { end.finish(status.code()); }
                    yield Err(status);
                    return;
                }
            };
            yield Ok(pb::ExecuteEvent { event: Some(out) });
        }
        if let Some(end) = stream_end.as_mut() { end.finish(tonic::Code::Ok); }
    }
}
