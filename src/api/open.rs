//! What every AI and tool RPC shares: the caller parsed and authorised, then one feature
//! run through the pipeline and its answer mapped to the reply.

use super::{
    auth,
    error::{Failure, to_status},
    pb, reply, request, request_span,
};
use crate::{
    auth::{Authenticator, Principal},
    call::{CallContext, CallMeta, Feature, Pipeline},
    config::Config,
};
use std::pin::Pin;
use tonic::{Response, Status, metadata::MetadataMap};
use tracing::Instrument;

/// A unary handler's future, as `async_trait` declares it. The AI handlers return one from
/// a plain function, not an `async fn`: parsing runs before the future exists, so the
/// future does not hold the request's metadata and extensions while the provider works.
pub(super) type Unary<'f, T> =
    Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send + 'f>>;

/// Who asks, parsed and authorised, with the request's span.
pub(super) struct Caller {
    pub(super) ctx: CallContext,
    pub(super) principal: Principal,
    pub(super) span: tracing::Span,
}

impl Caller {
    /// A request failure, carrying the caller's trace ID.
    pub(super) fn fail(&self, failure: Failure) -> Status {
        to_status(failure, &self.ctx.trace_id)
    }
}

/// The envelope validated (trace ID, team, deadline) and the caller
/// authorised for the team; `rpc` is `(service, method)`, the span's name.
pub(super) fn caller(
    config: &Config,
    auth: &Authenticator,
    rpc: (&'static str, &'static str),
    (context, budget): (Option<&pb::RequestContext>, Option<&pb::Budget>),
    metadata: &MetadataMap,
    extensions: &tonic::Extensions,
) -> Result<Caller, Status> {
    let mut ctx = request::call_context(context, budget, metadata, &config.server)
        .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
    super::access::note(|f| {
        f.trace_id.clone_from(&ctx.trace_id);
        f.team.clone_from(&ctx.team_id);
    });
    let principal = auth::principal(extensions, auth)
        .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id).map(|()| p))
        .map_err(|f| to_status(f, &ctx.trace_id))?;
    ctx.principal.clone_from(&principal.name);
    let span = request_span(rpc, &ctx);
    Ok(Caller {
        ctx,
        principal,
        span,
    })
}

/// The one body of every unary AI and tool RPC: `parsed` (caller and feature, or the
/// refusing status) run through the pipeline, its answer mapped by `map`.
pub(super) fn unary<'f, F, T>(
    pipeline: &'f Pipeline,
    parsed: Result<(Caller, F), Status>,
    map: impl FnOnce(F::Output, &CallMeta) -> T + Send + 'f,
) -> Unary<'f, T>
where
    F: Feature + 'f,
    T: Send + 'f,
{
    let (caller, feature) = match parsed {
        Ok(parsed) => parsed,
        Err(status) => return Box::pin(std::future::ready(Err(status))),
    };
    let Caller { ctx, span, .. } = caller;
    let trace_id = ctx.trace_id.clone();
    Box::pin(
        async move {
            let (output, meta) = pipeline
                .run(ctx, feature)
                .await
                .map_err(|e| to_status(e.into(), &trace_id))?;
            Ok(reply(&meta.trace_id, map(output, &meta)))
        }
        .instrument(span),
    )
}
