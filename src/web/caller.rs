//! Who asks, from an HTTP request's headers: the same rules as gRPC (SPEC
//! §13). The key (`Authorization: Bearer`, or `x-api-key`), the team (the
//! key's only team, else `x-team-id`; always `x-team-id` while auth is off),
//! the user (OpenAI's `user` field, else `x-user-id`), the trace ID
//! (`x-trace-id`, else `traceparent`'s, else new) and the deadline
//! (`server.default_timeout`).

use super::{Edge, error::HttpError};
use crate::{
    api::{access, error::Failure, request::check_id},
    auth::Principal,
    call::CallContext,
    domain::{Channel, Headers, Priority, instant_after},
    telemetry::{otel, trace_id},
};
use axum::http::HeaderMap;
use tokio::time::Instant;

/// HTTP headers, read by authentication and the trace ID rules.
impl Headers for HeaderMap {
    fn text(&self, name: &str) -> Option<Result<&str, ()>> {
        self.get(name).map(|v| v.to_str().map_err(|_| ()))
    }
}

/// A caller parsed and authorised, with the request's span.
pub(super) struct Caller {
    pub ctx: CallContext,
    pub principal: Principal,
    pub span: tracing::Span,
}

/// The caller of `route` (its span's name), or the error to answer.
pub(super) fn caller(
    edge: &Edge,
    route: &'static str,
    headers: &HeaderMap,
) -> Result<Caller, HttpError> {
    let started = Instant::now();
    let trace_id = match trace_id::resolve("", headers) {
        Ok((id, _)) => id,
        Err(bad) => {
            let fresh = trace_id::generate();
            return Err(HttpError::invalid(bad.field, &bad.to_string(), &fresh));
        }
    };
    access::note(|f| f.trace_id.clone_from(&trace_id));
    let fail = |failure: Failure| HttpError::new(failure, &trace_id);
    let principal = edge
        .auth
        .authenticate(headers)
        .map_err(|e| fail(Failure::Unauthenticated(e)))?;
    let team = team_of(&principal, headers).map_err(fail)?;
    access::note(|f| f.team.clone_from(&team));
    let user = user_of(None, headers).map_err(fail)?;
    let server = &edge.pipeline.config().server;
    let ctx = CallContext {
        team_id: team,
        user_id: user,
        trace_id,
        channel: Channel::System,
        priority: Priority::Interactive,
        started,
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        deadline: instant_after(started, server.default_timeout),
        budget_usd: None,
        traceparent: headers
            .text("traceparent")
            .and_then(Result::ok)
            .filter(|tp| trace_id::traceparent_trace_id(tp).is_some())
            .map(str::to_owned),
        principal: principal.name.clone(),
    };
    let span = request_span(route, &ctx);
    Ok(Caller {
        ctx,
        principal,
        span,
    })
}

/// The team: `x-team-id` when sent (a valid ID the key may act for), else
/// the key's only team; a key of several teams (or none, auth off) must name one.
fn team_of(principal: &Principal, headers: &HeaderMap) -> Result<String, Failure> {
    const FIELD: &str = "x-team-id";
    let team = match headers.text(FIELD) {
        Some(Ok(team)) => team.to_owned(),
        Some(Err(())) => return Err(Failure::invalid(FIELD, "must be visible ASCII")),
        None => match principal.teams.single() {
            Some(team) => return Ok(team),
            None => {
                return Err(Failure::invalid(
                    FIELD,
                    "is required: this key acts for several teams (or auth is off)",
                ));
            }
        },
    };
    check_id(&team, true).map_err(|why| Failure::invalid(FIELD, why))?;
    if principal.may_act_for(&team) {
        Ok(team)
    } else {
        Err(Failure::TeamNotAllowed { field: FIELD, team })
    }
}

impl Caller {
    /// Takes the body's `user` (OpenAI's field) as the end user, over `x-user-id`.
    pub(super) fn body_user(&mut self, user: Option<&str>) -> Result<(), HttpError> {
        if let Some(user) = user {
            self.ctx.user_id = user_of(Some(user), &HeaderMap::new())
                .map_err(|f| HttpError::new(f, &self.ctx.trace_id))?;
        }
        Ok(())
    }
}

/// The end user: the body's `user`, else `x-user-id`; may be empty.
fn user_of(user: Option<&str>, headers: &HeaderMap) -> Result<String, Failure> {
    let (field, user) = match (user, headers.text("x-user-id")) {
        (Some(user), _) => ("user", user),
        (None, Some(Ok(user))) => ("x-user-id", user),
        (None, Some(Err(()))) => {
            return Err(Failure::invalid("x-user-id", "must be visible ASCII"));
        }
        (None, None) => return Ok(String::new()),
    };
    check_id(user, false).map_err(|why| Failure::invalid(field, why))?;
    Ok(user.to_owned())
}

/// The request's server span, named by its route: identifiers only.
fn request_span(route: &'static str, ctx: &CallContext) -> tracing::Span {
    let (method, path) = route.split_once(' ').unwrap_or(("", route));
    let span = tracing::info_span!(
        "request",
        otel.name = route,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = path,
        rpc = route,
        trace_id = %ctx.trace_id,
        span_id = tracing::field::Empty,
        team_id = %ctx.team_id,
        priority = ctx.priority.as_str(),
    );
    otel::attach(&span, ctx.traceparent.as_deref(), &ctx.trace_id);
    span
}
