//! `ApprovalService` (SPEC §14.1): thin translations around the pipeline's
//! approvals (`call::approvals`).

use super::{
    auth,
    error::{Failure, to_status},
    pb::{self, approval_service_server::ApprovalService},
    reply, request,
};
use crate::{
    auth::{Authenticator, Principal},
    call::{
        CallContext, Pipeline,
        approvals::{Page, Shown},
    },
    config::Config,
    tools::approvals::{ApprovalStatus, Decision},
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Approvals a page holds unless asked for fewer.
const DEFAULT_PAGE: u32 = 50;
/// Most approvals a page holds.
const MAX_PAGE: u32 = 500;
/// Most bytes of a decision's reason.
const MAX_REASON: usize = 4096;

/// The `ApprovalService`.
#[derive(Clone)]
pub struct ApprovalApi {
    config: Arc<Config>,
    pipeline: Pipeline,
    auth: Authenticator,
}

impl ApprovalApi {
    /// A service over the call pipeline.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            auth,
        }
    }

    /// The request's context and principal, acting for its team.
    fn open(
        &self,
        context: Option<&pb::RequestContext>,
        metadata: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<(CallContext, Principal), Status> {
        let ctx = request::call_context(context, None, metadata, &self.config.server)
            .map_err(|(trace_id, failure)| to_status(failure, &trace_id))?;
        super::access::note(|f| f.team.clone_from(&ctx.team_id));
        let principal = auth::principal(extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "context.team_id", &ctx.team_id).map(|()| p))
            .map_err(|f| to_status(f, &ctx.trace_id))?;
        Ok((ctx, principal))
    }
}

fn status(s: ApprovalStatus) -> pb::ApprovalStatus {
    match s {
        ApprovalStatus::Pending => pb::ApprovalStatus::Pending,
        ApprovalStatus::Approved => pb::ApprovalStatus::Approved,
        ApprovalStatus::Rejected => pb::ApprovalStatus::Rejected,
        ApprovalStatus::Expired => pb::ApprovalStatus::Expired,
    }
}

/// An approval in proto terms: the input only for a principal that may decide it.
fn approval(shown: Shown) -> pb::Approval {
    let a = shown.approval;
    pb::Approval {
        approval_id: a.id,
        tool: a.tool,
        version: a.version,
        team_id: a.team_id,
        requested_by: a.requested_by,
        input_sha256: a.input_sha256,
        status: status(a.status) as i32,
        decided_by: a.decided_by.unwrap_or_default(),
        reason: a.reason,
        created_at_ms: a.created_at_ms,
        decided_at_ms: a.decided_at_ms.unwrap_or(0),
        expires_at_ms: a.expires_at_ms,
        input_json: if shown.input_visible {
            a.input.to_string()
        } else {
            String::new()
        },
        invocation_id: a.invocation_id.unwrap_or_default(),
        conversation_id: a.conversation_id.unwrap_or_default(),
        call_id: a.call_id.unwrap_or_default(),
        trace_id: a.trace_id,
    }
}

fn page(p: Page) -> pb::ListApprovalsResponse {
    pb::ListApprovalsResponse {
        approvals: p.approvals.into_iter().map(approval).collect(),
        next_page_token: p.next.unwrap_or_default(),
    }
}

fn check_id(field: &str, id: &str) -> Result<(), Failure> {
    if id.is_empty() {
        return Err(Failure::invalid(field, "is required"));
    }
    if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Failure::invalid(field, "is not an approval ID"));
    }
    Ok(())
}

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let (ctx, principal) = self.open(req.context.as_ref(), &metadata, &extensions)?;
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        let wanted = match pb::ApprovalStatus::try_from(req.status) {
            Ok(pb::ApprovalStatus::Unspecified) => None,
            Ok(pb::ApprovalStatus::Pending) => Some(ApprovalStatus::Pending),
            Ok(pb::ApprovalStatus::Approved) => Some(ApprovalStatus::Approved),
            Ok(pb::ApprovalStatus::Rejected) => Some(ApprovalStatus::Rejected),
            Ok(pb::ApprovalStatus::Expired) => Some(ApprovalStatus::Expired),
            Err(_) => return Err(fail(Failure::invalid("status", "is not an ApprovalStatus"))),
        };
        let before = (!req.page_token.is_empty()).then_some(req.page_token.as_str());
        if let Some(token) = before {
            check_id("page_token", token).map_err(fail)?;
        }
        let size = match req.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let found = self
            .pipeline
            .list_approvals(&principal, &ctx.team_id, wanted, before, size as usize)
            .await
            .map_err(|e| fail(Failure::Approval(e)))?;
        Ok(reply(&ctx.trace_id, page(found)))
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let (ctx, principal) = self.open(req.context.as_ref(), &metadata, &extensions)?;
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        check_id("approval_id", &req.approval_id).map_err(fail)?;
        let shown = self
            .pipeline
            .get_approval(&principal, &ctx.team_id, &req.approval_id)
            .await
            .map_err(|e| fail(Failure::Approval(e)))?;
        Ok(reply(&ctx.trace_id, approval(shown)))
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let (ctx, principal) = self.open(req.context.as_ref(), &metadata, &extensions)?;
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        check_id("approval_id", &req.approval_id).map_err(fail)?;
        let decision = match pb::Decision::try_from(req.decision) {
            Ok(pb::Decision::Approve) => Decision::Approve,
            Ok(pb::Decision::Reject) => Decision::Reject,
            _ => {
                return Err(fail(Failure::invalid(
                    "decision",
                    "must be APPROVE or REJECT",
                )));
            }
        };
        if req.reason.len() > MAX_REASON {
            return Err(fail(Failure::invalid(
                "reason",
                "must be at most 4096 bytes",
            )));
        }
        let shown = self
            .pipeline
            .decide_approval(&principal, &ctx, &req.approval_id, decision, &req.reason)
            .await
            .map_err(|e| fail(Failure::Approval(e)))?;
        Ok(reply(&ctx.trace_id, approval(shown)))
    }
}
