//! `AuditService` (SPEC §10): a team's events, a page at a time, and its
//! chain verified. Admin keys over the team only.

use super::{
    auth::{check_admin, principal},
    error::{Failure, to_status},
    pb::{self, audit_service_server::AuditService},
    reply,
    request::check_id,
};
use crate::{
    audit::{chain::Linked, store},
    auth::Authenticator,
    store::Store,
    usage::{pricing::usd, summary::timestamp_ms},
};
use tonic::{Request, Response, Status};

/// Events per page unless asked.
const DEFAULT_PAGE: u32 = 100;
/// Most events per page.
const MAX_PAGE: u32 = 1000;

/// The `AuditService`.
#[derive(Clone)]
pub struct AuditApi {
    store: Store,
    auth: Authenticator,
}

impl AuditApi {
    /// A service over the database.
    pub fn new(store: Store, auth: Authenticator) -> Self {
        Self { store, auth }
    }

    /// The caller administers `team`'s chain ('': API keys, for an admin of every team).
    fn admin(&self, extensions: &tonic::Extensions, team: &str) -> Result<(), Failure> {
        check_id(team, false).map_err(|why| Failure::invalid("team_id", why))?;
        let p = principal(extensions, &self.auth)?;
        check_admin(&p, (!team.is_empty()).then_some(team))
    }
}

fn event(l: &Linked) -> pb::AuditEvent {
    let e = &l.event;
    let n = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    pb::AuditEvent {
        id: e.id.clone(),
        seq: u64::try_from(l.seq).unwrap_or(0),
        time: Some(prost_types::Timestamp {
            seconds: e.at_ms.div_euclid(1000),
            nanos: i32::try_from(e.at_ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
        }),
        trace_id: e.trace_id.clone(),
        team_id: e.team_id.clone(),
        principal: e.principal.clone(),
        category: e.category.as_str().to_owned(),
        action: e.action.clone(),
        subject: e.subject.clone(),
        decision: e.decision.clone(),
        reason: e.reason.clone(),
        input_sha256: e.input_sha256.clone().unwrap_or_default(),
        output_sha256: e.output_sha256.clone().unwrap_or_default(),
        input_bytes: n(e.input_bytes),
        output_bytes: n(e.output_bytes),
        duration_ms: n(e.duration_ms),
        estimated_cost_usd: e.estimated_cost_micros.map(usd),
        actual_cost_usd: e.actual_cost_micros.map(usd),
        idempotency_key: e.idempotency_key.clone().unwrap_or_default(),
        prev_hash: l.prev_hash.clone(),
        hash: l.hash.clone(),
    }
}

#[tonic::async_trait]
impl AuditService for AuditApi {
    async fn list_audit_events(
        &self,
        request: Request<pb::ListAuditEventsRequest>,
    ) -> Result<Response<pb::ListAuditEventsResponse>, Status> {
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let (_, extensions, req) = request.into_parts();
        let fail = |f: Failure| to_status(f, &trace_id);
        self.admin(&extensions, &req.team_id).map_err(fail)?;
        super::access::note(|f| f.team.clone_from(&req.team_id));
        let instant = |field: &str, t: Option<prost_types::Timestamp>| match t {
            None => Ok(None),
            Some(t) => timestamp_ms(t.seconds, t.nanos)
                .map(Some)
                .ok_or_else(|| fail(Failure::invalid(field, "must be a valid Timestamp"))),
        };
        let since_ms = instant("since", req.since)?;
        let until_ms = instant("until", req.until)?;
        let after_seq = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse::<i64>()
                .ok()
                .filter(|s| *s >= 0)
                .ok_or_else(|| fail(Failure::invalid("page_token", "not a token this RPC gave")))?
        };
        let size = match req.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let trace = (!req.trace_id.is_empty()).then_some(req.trace_id.clone());
        let mut events = store::list(
            &self.store,
            &store::Filter {
                team_id: req.team_id.clone(),
                since_ms,
                until_ms,
                trace_id: trace,
                after_seq,
                // One more than the page: whether another page follows,
                // so the last page carries no token.
                limit: i64::from(size) + 1,
            },
        )
        .await
        .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        let page = usize::try_from(size).unwrap_or(usize::MAX);
        let next_page_token = if events.len() > page {
            events.truncate(page);
            events.last().map(|l| l.seq.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(reply(
            &trace_id,
            pb::ListAuditEventsResponse {
                events: events.iter().map(event).collect(),
                next_page_token,
            },
        ))
    }

    async fn verify_audit_chain(
        &self,
        request: Request<pb::VerifyAuditChainRequest>,
    ) -> Result<Response<pb::VerifyAuditChainResponse>, Status> {
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let (_, extensions, req) = request.into_parts();
        let fail = |f: Failure| to_status(f, &trace_id);
        self.admin(&extensions, &req.team_id).map_err(fail)?;
        super::access::note(|f| f.team.clone_from(&req.team_id));
        let v = store::verify(&self.store, &req.team_id)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        Ok(reply(
            &trace_id,
            pb::VerifyAuditChainResponse {
                ok: v.ok,
                events_checked: v.events_checked,
                first_broken_event_id: v.first_broken_event_id,
                first_broken_seq: u64::try_from(v.first_broken_seq).unwrap_or(0),
                reason: v.reason,
            },
        ))
    }
}
