//! The `Orchestrator` service: each AI RPC opens a call (one helper), runs
//! its task through the call pipeline, and maps the answer back to proto.

use super::{
    convert,
    error::{Failure, to_status},
    metrics_layer,
    open::{Opened, close, open_call},
    pb, reply, request,
};
use crate::{
    auth::Authenticator,
    call::{CallError, CallEvent, Pipeline},
    config::Config,
    domain::sms::SmsEncoding,
    store::Store,
    tasks::{execute, research, sms_classify, sms_generate},
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
    /// A service over the call pipeline, the store (usage reads) and the
    /// authenticator.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, store: Store, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            store,
            auth,
        }
    }

    /// The opening every AI RPC shares: the envelope validated (trace ID,
    /// team, deadline), the caller authorised for the team, and the call of
    /// `task` opened (its slot under `server.max_concurrent_requests`
    /// taken, or shed at once).
    fn open(
        &self,
        rpc: &'static str,
        task: &str,
        context: Option<&pb::RequestContext>,
        budget: Option<&pb::Budget>,
        metadata: &MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<Opened, Status> {
        open_call(
            &self.config,
            &self.pipeline,
            &self.auth,
            (pb::orchestrator_server::SERVICE_NAME, rpc),
            task,
            context,
            budget,
            metadata,
            extensions,
        )
        .map(|(opened, _)| opened)
    }

    /// The request's size limits: its fields together (`total`, the
    /// largest of `fields` named on a violation) and its history entries.
    fn check_input(
        &self,
        opened: &Opened,
        total: usize,
        fields: &[(&str, usize)],
        history: usize,
    ) -> Result<(), Status> {
        request::check_history(history, &self.config.server)
            .and_then(|()| request::check_input(total, fields, &self.config.server))
            .map_err(|f| to_status(f, &opened.call.context().trace_id))
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

/// Opens an `Execute` call: the task named, the sizes checked, the input
/// parsed.
fn open_execute(
    api: &OrchestratorApi,
    rpc: &'static str,
    metadata: &MetadataMap,
    extensions: &tonic::Extensions,
    req: pb::ExecuteRequest,
) -> Result<(Opened, String, serde_json::Map<String, serde_json::Value>), Status> {
    let opened = api.open(
        rpc,
        &req.task,
        req.context.as_ref(),
        req.budget.as_ref(),
        metadata,
        extensions,
    )?;
    let input = match &req.input {
        Some(pb::execute_request::Input::InputStruct(s)) => ("input_struct", s.encoded_len()),
        Some(pb::execute_request::Input::InputJson(j)) => ("input_json", j.len()),
        None => ("input_struct", 0),
    };
    let fields = [
        input,
        ("task", req.task.len()),
        ("context", context_bytes(req.context.as_ref())),
    ];
    let trace_id = &opened.call.context().trace_id;
    if req.task.is_empty() {
        return Err(to_status(Failure::invalid("task", "is required"), trace_id));
    }
    api.check_input(&opened, req.encoded_len(), &fields, 0)?;
    let input = execute_input(api, req.input).map_err(|f| to_status(f, trace_id))?;
    Ok((opened, req.task, input))
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
/// The AI handlers are plain functions returning one, not `async fn`s:
/// theirs would keep the whole request as a capture for the call's life,
/// and the opening runs before the future exists, so the request's
/// metadata and extensions are not held either. Every call in flight
/// carries this future for as long as its provider takes.
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
        let (Opened { call, span }, task, input) =
            match open_execute(self, "Execute", &metadata, &extensions, req) {
                Ok(opened) => opened,
                Err(status) => return Box::pin(std::future::ready(Err(status))),
            };
        Box::pin(
            async move {
                let tasks = self.pipeline.tasks();
                let result = execute::execute(tasks, &call, &task, input).await;
                let (output, meta) = close(call, result).await?;
                Ok(reply(
                    &meta.trace_id,
                    pb::ExecuteResponse {
                        output: output.json.map(convert::json_to_struct),
                        text: output.text,
                        meta: Some(convert::meta(&meta)),
                    },
                ))
            }
            .instrument(span),
        )
    }

    type ExecuteStreamStream = EventStream;

    async fn execute_stream(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStreamStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let (Opened { call, span }, task, input) =
            open_execute(self, "ExecuteStream", &metadata, &extensions, req)?;
        let trace_id = call.context().trace_id.clone();
        let fail = |e: CallError| to_status(e.into(), &trace_id);
        let events = async {
            let tasks = self.pipeline.tasks();
            let (rendered, format) = execute::prepare(tasks, &call, &task, input)
                .await
                .map_err(|e| fail(e.into()))?;
            call.stream(&task, &rendered, format).await.map_err(fail)
        }
        .instrument(span.clone())
        .await?;
        let validator = self.pipeline.tasks().output_validator(&task);
        let event_trace_id = trace_id.clone();
        // From here the call cannot fail before streaming: the gRPC metrics
        // wait for the stream's final status.
        let mut stream_end = extensions
            .get::<metrics_layer::GrpcCall>()
            .map(metrics_layer::GrpcCall::defer);
        let stream = async_stream::stream! {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                use pb::execute_event::Event;
                let out = match event {
                    CallEvent::Started { provider, model } => Event::Started(
                        pb::execute_event::Started { trace_id: event_trace_id.clone(), provider, model },
                    ),
                    CallEvent::Fallback { from, to, reason } => {
                        Event::Fallback(pb::execute_event::Fallback { from, to, reason })
                    }
                    CallEvent::Delta(text) => Event::Delta(pb::execute_event::Delta { text }),
                    CallEvent::Completed { completion, meta } => {
                        // Streamed text cannot be taken back: with an output
                        // schema, `output` is set only when the whole answer
                        // matches it.
                        let output = execute::parse(&completion.text, validator.as_deref())
                            .ok()
                            .and_then(|o| o.json);
                        Event::Completed(pb::ExecuteResponse {
                            output: output.map(convert::json_to_struct),
                            text: completion.text,
                            meta: Some(convert::meta(&meta)),
                        })
                    }
                    CallEvent::Failed(err) => {
                        let status = to_status(err.into(), &event_trace_id);
                        if let Some(end) = stream_end.as_mut() { end.finish(status.code()); }
                        yield Err(status);
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
        // Polled by the transport, outside the handler: carries its access
        // record along.
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
        let opened = self
            .open(
                "ClassifySms",
                sms_classify::TASK,
                req.context.as_ref(),
                req.budget.as_ref(),
                &metadata,
                &extensions,
            )
            .and_then(|opened| {
                let fields = [
                    ("message", req.message.len()),
                    ("history", history_bytes(&req.history)),
                    ("context", context_bytes(req.context.as_ref())),
                ];
                self.check_input(&opened, req.encoded_len(), &fields, req.history.len())
                    .map(|()| opened)
            });
        let Opened { call, span } = match opened {
            Ok(opened) => opened,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        let input = sms_classify::ClassifyInput {
            history: convert::history(&req.history),
            message: req.message,
        };
        Box::pin(
            async move {
                let result = sms_classify::classify(self.pipeline.tasks(), &call, input).await;
                let (answer, meta) = close(call, result).await?;
                Ok(reply(
                    &meta.trace_id,
                    pb::ClassifySmsResponse {
                        intent: intent(answer.intent) as i32,
                        confidence: answer.confidence,
                        needs_review: answer.needs_review,
                        reason: answer.reason,
                        meta: Some(convert::meta(&meta)),
                    },
                ))
            }
            .instrument(span),
        )
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
        let opened = self
            .open(
                "GenerateSms",
                sms_generate::TASK,
                req.context.as_ref(),
                req.budget.as_ref(),
                &metadata,
                &extensions,
            )
            .and_then(|opened| {
                let fields = [
                    ("inbound_message", req.inbound_message.len()),
                    ("history", history_bytes(&req.history)),
                    ("lead", req.lead.as_ref().map_or(0, Message::encoded_len)),
                    ("goal", req.goal.len()),
                    ("context", context_bytes(req.context.as_ref())),
                ];
                self.check_input(&opened, req.encoded_len(), &fields, req.history.len())
                    .map(|()| opened)
            });
        let Opened { call, span } = match opened {
            Ok(opened) => opened,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        let input = convert::generate_input(req);
        Box::pin(
            async move {
                let result = sms_generate::generate(self.pipeline.tasks(), &call, input).await;
                let (answer, meta) = close(call, result).await?;
                Ok(reply(
                    &meta.trace_id,
                    pb::GenerateSmsResponse {
                        encoding: encoding(sms_generate::encoding(&answer)) as i32,
                        segments: answer.size.map_or(0, |s| s.segments),
                        response: answer.text,
                        escalate: answer.escalate,
                        escalate_reason: answer.escalate_reason,
                        meta: Some(convert::meta(&meta)),
                    },
                ))
            }
            .instrument(span),
        )
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
        let opened = self
            .open(
                "Research",
                depth.task(),
                req.context.as_ref(),
                req.budget.as_ref(),
                &metadata,
                &extensions,
            )
            .and_then(|opened| {
                let fields = [
                    ("query", req.query.len()),
                    ("context", context_bytes(req.context.as_ref())),
                ];
                self.check_input(&opened, req.encoded_len(), &fields, 0)
                    .map(|()| opened)
            });
        let Opened { call, span } = match opened {
            Ok(opened) => opened,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(
            async move {
                let result = research::research(&call, &req.query, depth).await;
                let (answer, meta) = close(call, result).await?;
                Ok(reply(
                    &meta.trace_id,
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
                        meta: Some(convert::meta(&meta)),
                    },
                ))
            }
            .instrument(span),
        )
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
