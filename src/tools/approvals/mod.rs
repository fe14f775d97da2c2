//! The `approvals` table (SPEC §14.1): a tool call held until a person decides.
//! Requesting one for an `InvokeTool` claims its idempotency key in the same
//! transaction; deciding or expiring it moves the held invocation on. Every
//! change is guarded by `status = 'PENDING'`, so the first decision (or the
//! sweeper) wins on any replica. Who may decide is the caller's check, not this.

mod sql;

use super::invocations::{Claimed, Invocation};
use crate::store::{Store, StoreError};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where an approval stands (SPEC §14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalStatus {
    /// Waiting for a decision.
    Pending,
    Approved,
    Rejected,
    /// Nobody decided before `expires_at_ms`.
    Expired,
}

impl ApprovalStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "PENDING",
            ApprovalStatus::Approved => "APPROVED",
            ApprovalStatus::Rejected => "REJECTED",
            ApprovalStatus::Expired => "EXPIRED",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => ApprovalStatus::Pending,
            "APPROVED" => ApprovalStatus::Approved,
            "REJECTED" => ApprovalStatus::Rejected,
            "EXPIRED" => ApprovalStatus::Expired,
            _ => return None,
        })
    }
}

/// What a person decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

/// One approval.
#[derive(Debug, Clone, PartialEq)]
pub struct Approval {
    /// UUIDv7: ids sort by creation.
    pub id: String,
    pub team_id: String,
    pub tool: String,
    pub version: String,
    /// The principal whose call is held.
    pub requested_by: String,
    pub trace_id: String,
    /// The call's validated input (shown only to a decider of the team).
    pub input: Value,
    /// Hex SHA-256 of `input` as compact JSON.
    pub input_sha256: String,
    /// The `InvokeTool` invocation held (AWAITING_APPROVAL).
    pub invocation_id: Option<String>,
    /// The Converse conversation whose tool call is held.
    pub conversation_id: Option<String>,
    /// That tool call's ID.
    pub call_id: Option<String>,
    pub status: ApprovalStatus,
    /// Who decided (`system` for an expiry).
    pub decided_by: Option<String>,
    /// The decider's reason (`expired` once expired); may be empty.
    pub reason: String,
    pub created_at_ms: i64,
    pub decided_at_ms: Option<i64>,
    pub expires_at_ms: i64,
}

impl Approval {
    /// A new PENDING approval, created now and expiring after `timeout`;
    /// name what it holds with [`Approval::for_invocation`] or [`Approval::for_call`].
    pub fn new(
        team_id: &str,
        tool: &str,
        version: &str,
        requested_by: &str,
        trace_id: &str,
        input: Value,
        timeout: std::time::Duration,
    ) -> Self {
        let created_at_ms = chrono::Utc::now().timestamp_millis();
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            team_id: team_id.to_owned(),
            tool: tool.to_owned(),
            version: version.to_owned(),
            requested_by: requested_by.to_owned(),
            trace_id: trace_id.to_owned(),
            input_sha256: hex::encode(Sha256::digest(input.to_string().as_bytes())),
            input,
            invocation_id: None,
            conversation_id: None,
            call_id: None,
            status: ApprovalStatus::Pending,
            decided_by: None,
            reason: String::new(),
            created_at_ms,
            decided_at_ms: None,
            expires_at_ms: created_at_ms.saturating_add(timeout_ms),
        }
    }

    /// This approval, holding invocation `invocation_id`.
    pub fn for_invocation(mut self, invocation_id: &str) -> Self {
        self.invocation_id = Some(invocation_id.to_owned());
        self
    }

    /// This approval, holding tool call `call_id` of conversation `conversation_id`.
    pub fn for_call(mut self, conversation_id: &str, call_id: &str) -> Self {
        self.conversation_id = Some(conversation_id.to_owned());
        self.call_id = Some(call_id.to_owned());
        self
    }
}

/// What deciding found.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// This decision took: the approval as now stored.
    Now(Box<Approval>),
    /// It was no longer PENDING, or past its expiry (the sweeper's to mark
    /// EXPIRED, so its status may still say PENDING): its current state.
    Already(Box<Approval>),
}

impl Decided {
    /// The approval, either way.
    pub fn approval(&self) -> &Approval {
        match self {
            Decided::Now(a) | Decided::Already(a) => a,
        }
    }
}

/// The `approvals` table's operations (implemented per backend in `sql`).
#[async_trait::async_trait]
pub trait ApprovalRepository: Send + Sync + std::fmt::Debug {
    /// In one transaction: claims `inv`'s idempotency key as `invocations::claim` does
    /// (stored ASYNC and AWAITING_APPROVAL, unleased, whatever `inv` says) and, only if it
    /// took the key, inserts `approval` holding `inv.id`. `None` when it took the key;
    /// else the ID of the invocation holding it, and nothing is written.
    async fn request_invocation(
        &self,
        inv: &Invocation,
        approval: &Approval,
    ) -> Result<Option<String>, StoreError>;

    /// Inserts a Converse call's approval.
    async fn request_call(&self, approval: &Approval) -> Result<Approval, StoreError>;

    /// Approval `id` of `team`.
    async fn get(&self, team: &str, id: &str) -> Result<Option<Approval>, StoreError>;

    /// The approval of `team`'s tool call `call_id` in `conversation_id`.
    async fn for_call(
        &self,
        team: &str,
        conversation_id: &str,
        call_id: &str,
    ) -> Result<Option<Approval>, StoreError>;

    /// The approval of `team`'s invocation `invocation_id` (the newest, were there several).
    async fn for_invocation(
        &self,
        team: &str,
        invocation_id: &str,
    ) -> Result<Option<Approval>, StoreError>;

    /// `team`'s approvals, newest first, of `status` when given, with an ID below
    /// `before` when given, at most `limit` (not negative).
    async fn list(
        &self,
        team: &str,
        status: Option<ApprovalStatus>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, StoreError>;

    /// In one transaction: decides approval `id` of `team` at `now_ms` if it is PENDING
    /// and unexpired, and moves its invocation on (approved: PENDING, for the ASYNC
    /// worker; rejected: REJECTED with the reason). `None` if there is no such approval.
    async fn decide(
        &self,
        team: &str,
        id: &str,
        decision: Decision,
        by: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<Decided>, StoreError>;

    /// In one transaction: marks EXPIRED up to `limit` PENDING approvals expired at
    /// `now_ms` and REJECTED (`EXPIRED`) their invocations; returns those this call changed.
    async fn expire(&self, now_ms: i64, limit: i64) -> Result<Vec<Approval>, StoreError>;
}

/// Holds `inv` for `approval`: claims `inv`'s idempotency key (stored ASYNC and
/// AWAITING_APPROVAL) and inserts `approval` holding it, in one transaction. A
/// key already taken in its window writes nothing: its holder is the answer.
pub async fn request_invocation(
    store: &Store,
    inv: &Invocation,
    approval: &Approval,
) -> Result<Claimed, StoreError> {
    let repository = sql::repository(store);
    let Some(holder) = repository.request_invocation(inv, approval).await? else {
        return Ok(Claimed::New);
    };
    // Read after our transaction: the holder had committed for us to see its key.
    match super::invocations::get(store, &inv.team_id, &holder).await? {
        Some(existing) => Ok(Claimed::Existing(Box::new(existing))),
        None => Err(StoreError::Raced(
            "the invocation holding this idempotency key was erased meanwhile",
        )),
    }
}

/// Stores a Converse call's approval (its `conversation_id` and `call_id` set).
/// A call ID may come again in a later turn (providers only make it unique
/// within an answer): [`for_call`] reads the newest, so an old decision never
/// settles a new call.
pub async fn request_call(store: &Store, approval: &Approval) -> Result<Approval, StoreError> {
    sql::repository(store).request_call(approval).await
}

/// Approval `id` of `team` (another team's is not found).
pub async fn get(store: &Store, team: &str, id: &str) -> Result<Option<Approval>, StoreError> {
    sql::repository(store).get(team, id).await
}

/// The newest approval of `team`'s tool call `call_id` in conversation
/// `conversation_id`: the one its last hold asked for.
pub async fn for_call(
    store: &Store,
    team: &str,
    conversation_id: &str,
    call_id: &str,
) -> Result<Option<Approval>, StoreError> {
    sql::repository(store)
        .for_call(team, conversation_id, call_id)
        .await
}

/// The approval holding `team`'s invocation `invocation_id`.
pub async fn for_invocation(
    store: &Store,
    team: &str,
    invocation_id: &str,
) -> Result<Option<Approval>, StoreError> {
    sql::repository(store)
        .for_invocation(team, invocation_id)
        .await
}

/// `team`'s approvals, newest first (UUIDv7 IDs sort by time), of `status` when
/// given; `before` (the last ID of the previous page) pages on. At most `limit`.
pub async fn list(
    store: &Store,
    team: &str,
    status: Option<ApprovalStatus>,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<Approval>, StoreError> {
    // PostgreSQL refuses a negative LIMIT; SQLite reads it as none.
    let limit = limit.max(0);
    sql::repository(store)
        .list(team, status, before, limit)
        .await
}

/// Decides approval `id` of `team` at `now_ms`, by `by` for `reason`, if it is PENDING
/// and unexpired, moving its invocation on in the same transaction: approved, the ASYNC
/// worker runs it; rejected, it ends REJECTED with the reason (or `rejected`).
/// `None` if there is no such approval; [`Decided::Already`] if it was decided or
/// expired first.
pub async fn decide(
    store: &Store,
    team: &str,
    id: &str,
    decision: Decision,
    by: &str,
    reason: &str,
    now_ms: i64,
) -> Result<Option<Decided>, StoreError> {
    sql::repository(store)
        .decide(team, id, decision, by, reason, now_ms)
        .await
}

/// The sweeper: marks EXPIRED up to `limit` PENDING approvals whose time ran out by
/// `now_ms`, and their invocations REJECTED (`EXPIRED`), in one transaction. Safe
/// with several replicas sweeping: returns only the approvals this call expired.
pub async fn expire(store: &Store, now_ms: i64, limit: i64) -> Result<Vec<Approval>, StoreError> {
    sql::repository(store).expire(now_ms, limit.max(0)).await
}

#[cfg(test)]
mod tests;
