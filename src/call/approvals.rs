//! Deciding held tool calls (SPEC §14.1), for `ApprovalService` and any
//! other edge: a team's approvals listed and read (the input shown only to
//! a principal that may decide), a decision checked (`approve:<tool>`,
//! `four_eyes`) and recorded with its invocation in one transaction, and
//! the sweeper that lets undecided requests expire on every replica.

use super::{CallContext, Pipeline};
use crate::{
    audit::{AuditEvent, Category},
    auth::Principal,
    tools::{
        approvals::{self, Approval, ApprovalStatus, Decided, Decision},
        policy,
    },
    usage::ledger::Op,
};
use std::time::Duration;
use tokio::sync::watch;

/// Why an approval could not be read or decided.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// No such approval of the team.
    #[error("approval `{0}` not found")]
    NotFound(String),
    /// Deciding needs `approve:<tool>`.
    #[error("deciding this approval needs the capability `{0}`")]
    CapabilityMissing(String),
    /// `four_eyes`: the principal that asked may not decide.
    #[error("with [approvals] four_eyes, the principal that asked may not decide its own request")]
    OwnRequest,
    /// It is no longer pending.
    #[error("approval `{id}` is already {status}")]
    AlreadyDecided {
        /// The approval.
        id: String,
        /// How it stands.
        status: &'static str,
    },
    /// The store failed.
    #[error("storage: {0}")]
    Storage(String),
}

impl ApprovalError {
    /// The stable reason (`ErrorInfo.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            ApprovalError::NotFound(_) => "APPROVAL_NOT_FOUND",
            ApprovalError::CapabilityMissing(_) => "CAPABILITY_MISSING",
            ApprovalError::OwnRequest => "FOUR_EYES",
            ApprovalError::AlreadyDecided { .. } => "APPROVAL_ALREADY_DECIDED",
            ApprovalError::Storage(_) => "STORAGE_UNAVAILABLE",
        }
    }
}

fn storage(e: crate::store::StoreError) -> ApprovalError {
    ApprovalError::Storage(e.to_string())
}

/// An approval as one principal sees it.
#[derive(Debug, Clone)]
pub struct Shown {
    /// As stored, but a pending one past its time reads `EXPIRED`.
    pub approval: Approval,
    /// The principal may decide it: it may see the input.
    pub input_visible: bool,
}

/// The approvals of a list, and where the next page starts.
#[derive(Debug, Clone)]
pub struct Page {
    pub approvals: Vec<Shown>,
    /// The last one's ID when the page is full.
    pub next: Option<String>,
}

impl Pipeline {
    fn shown(&self, principal: &Principal, mut approval: Approval, now_ms: i64) -> Shown {
        if approval.status == ApprovalStatus::Pending && approval.expires_at_ms <= now_ms {
            // The sweeper has not come by yet: it can no longer be decided.
            approval.status = ApprovalStatus::Expired;
        }
        let capabilities = self.config().auth.capabilities(principal.role.as_str());
        Shown {
            input_visible: policy::may_approve(&capabilities, &approval.tool),
            approval,
        }
    }

    /// `team`'s approvals, newest first, of one `status` if given, those
    /// older than `before`, at most `limit`.
    pub async fn list_approvals(
        &self,
        principal: &Principal,
        team: &str,
        status: Option<ApprovalStatus>,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Page, ApprovalError> {
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX);
        let found = approvals::list(self.store(), team, status, before, wanted)
            .await
            .map_err(storage)?;
        let next = (found.len() >= limit)
            .then(|| found.last().map(|a| a.id.clone()))
            .flatten();
        let now = now_ms();
        let approvals = found
            .into_iter()
            .map(|a| self.shown(principal, a, now))
            .collect();
        Ok(Page { approvals, next })
    }

    /// Approval `id` of `team`.
    pub async fn get_approval(
        &self,
        principal: &Principal,
        team: &str,
        id: &str,
    ) -> Result<Shown, ApprovalError> {
        match approvals::get(self.store(), team, id)
            .await
            .map_err(storage)?
        {
            Some(a) => Ok(self.shown(principal, a, now_ms())),
            None => Err(ApprovalError::NotFound(id.to_owned())),
        }
    }

    /// `principal` decides approval `id` of the context's team: checked,
    /// recorded with its invocation, audited (`approval.decided`) durably
    /// before the answer. An approved invocation runs on the ASYNC worker of
    /// whichever replica takes it.
    pub async fn decide_approval(
        &self,
        principal: &Principal,
        ctx: &CallContext,
        id: &str,
        decision: Decision,
        reason: &str,
    ) -> Result<Shown, ApprovalError> {
        let team = &ctx.team_id;
        let Some(approval) = approvals::get(self.store(), team, id)
            .await
            .map_err(storage)?
        else {
            return Err(ApprovalError::NotFound(id.to_owned()));
        };
        let capabilities = self.config().auth.capabilities(principal.role.as_str());
        if !policy::may_approve(&capabilities, &approval.tool) {
            let wanted = policy::approve_capability(&approval.tool);
            return Err(ApprovalError::CapabilityMissing(wanted));
        }
        if self.config().approvals.four_eyes && approval.requested_by == principal.name {
            return Err(ApprovalError::OwnRequest);
        }
        let now = now_ms();
        let decided = approvals::decide(
            self.store(),
            team,
            id,
            decision,
            &principal.name,
            reason,
            now,
        )
        .await
        .map_err(storage)?;
        match decided {
            None => Err(ApprovalError::NotFound(id.to_owned())),
            Some(Decided::Now(approval)) => {
                let event = decided_event(&approval, &principal.name, &ctx.trace_id);
                self.ledger()
                    .submit(Op::Audit(vec![event]))
                    .await
                    .map_err(|e| ApprovalError::Storage(e.to_string()))?;
                Ok(self.shown(principal, *approval, now))
            }
            Some(Decided::Already(approval)) => {
                let shown = self.shown(principal, *approval, now);
                Err(ApprovalError::AlreadyDecided {
                    id: id.to_owned(),
                    status: shown.approval.status.as_str(),
                })
            }
        }
    }
}

/// The `approval.decided` event: who decided what (`approved`, `rejected`
/// or `expired`), for the input digested as its request was.
fn decided_event(approval: &Approval, by: &str, trace_id: &str) -> AuditEvent {
    let decision = match approval.status {
        ApprovalStatus::Approved => "approved",
        ApprovalStatus::Rejected => "rejected",
        ApprovalStatus::Expired => "expired",
        ApprovalStatus::Pending => "pending",
    };
    AuditEvent::new(
        &approval.team_id,
        by,
        trace_id,
        Category::Approval,
        "approval.decided",
        &format!("{}@{}", approval.tool, approval.version),
    )
    .decided(decision, &approval.id)
    .with_input(&approval.input)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Requests expired in one round, at most: a backlog takes several rounds.
const SWEEP_BATCH: i64 = 500;

/// Lets undecided approvals expire every `[approvals] sweep_interval`
/// until `stop`: each becomes `EXPIRED`, its invocation `REJECTED`, and an
/// `approval.decided` event (by `system`) records it. Replicas may sweep
/// at once: each request expires once.
pub async fn run_sweeper(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let every = pipeline.config().approvals.sweep_interval;
    loop {
        sweep(&pipeline).await;
        tokio::select! {
            () = tokio::time::sleep(every.max(Duration::from_millis(10))) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

async fn sweep(pipeline: &Pipeline) {
    loop {
        let expired = match approvals::expire(pipeline.store(), now_ms(), SWEEP_BATCH).await {
            Ok(expired) => expired,
            Err(e) => {
                tracing::error!(error = %e, "expiring approvals failed");
                return;
            }
        };
        if expired.is_empty() {
            return;
        }
        let full = i64::try_from(expired.len()).unwrap_or(i64::MAX) >= SWEEP_BATCH;
        let events = expired
            .iter()
            .map(|a| decided_event(a, "system", &a.trace_id))
            .collect();
        if let Err(e) = pipeline.ledger().submit(Op::Audit(events)).await {
            tracing::error!(error = %e, "auditing expired approvals failed");
        }
        if !full {
            return;
        }
    }
}
