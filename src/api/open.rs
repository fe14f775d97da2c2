//! Opening and closing the call behind an AI or tool RPC: the steps every
//! such RPC shares, whichever service it belongs to.

use super::{
    auth,
    error::{Failure, to_status},
    pb, request, request_span,
};
use crate::{
    auth::Authenticator,
    call::{Call, CallError, CallMeta, Pipeline},
    config::Config,
};
use tonic::{Status, metadata::MetadataMap};

/// A call opened for an RPC, with the request's span.
pub(super) struct Opened {
    pub(super) call: Call,
    pub(super) span: tracing::Span,
}

/// The opening every AI and tool RPC shares: the envelope validated (trace
/// ID, team, deadline), the caller authorised for the team, and the call of
/// `task` opened (its slot under `server.max_concurrent_requests` taken, or
/// shed at once); `rpc` is `(service, method)`, the span's name. Returns
/// the caller's principal too.
#[allow(clippy::too_many_arguments)]
pub(super) fn open_call(
    config: &Config,
    pipeline: &Pipeline,
    auth: &Authenticator,
    rpc: (&'static str, &'static str),
    task: &str,
    context: Option<&pb::RequestContext>,
    budget: Option<&pb::Budget>,
    metadata: &MetadataMap,
    extensions: &tonic::Extensions,
) -> Result<(Opened, crate::auth::Principal), Status> {
    let mut ctx = request::call_context(context, budget, metadata, &config.server)
        .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
    super::access::note(|f| {
        f.trace_id.clone_from(&ctx.trace_id);
        f.team.clone_from(&ctx.team_id);
    });
    let trace_id = ctx.trace_id.clone();
    let fail = |f: Failure| to_status(f, &trace_id);
    let principal = auth::principal(extensions, auth)
        .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id).map(|()| p))
        .map_err(fail)?;
    ctx.principal.clone_from(&principal.name);
    let span = request_span(rpc, &ctx);
    let call = pipeline.open(ctx, task).map_err(|e| fail(e.into()))?;
    Ok((Opened { call, span }, principal))
}

/// Finishes `call` with its task's `result` (see [`Call::finish`]).
pub(super) async fn close<T>(
    call: Call,
    result: Result<T, impl Into<CallError>>,
) -> Result<(T, CallMeta), Status> {
    let trace_id = call.context().trace_id.clone();
    call.finish(result.map_err(Into::into))
        .await
        .map_err(|e| to_status(e.into(), &trace_id))
}
