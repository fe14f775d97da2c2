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
mod tests {
    use super::*;
    use crate::config::DatabaseConfig;
    use crate::tools::invocations::{self, Mode};
    use crate::tools::{Failure, Status};
    use serde_json::json;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    /// A migrated store on its own SQLite file in `dir`.
    pub(super) async fn store(dir: &std::path::Path) -> Store {
        let config = DatabaseConfig {
            url: format!("sqlite://{}", dir.join("approvals.db").display()),
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    /// An InvokeTool of team `t` under idempotency key `key`, held for approval.
    fn held(key: &str) -> Invocation {
        let mut inv = Invocation::new(
            "t",
            "deploy",
            "1.0.0",
            Mode::Async,
            key,
            0,
            "trace",
            "alice",
            json!({"env": "prod"}),
            7,
            Duration::from_secs(30),
        );
        inv.status = Status::AwaitingApproval;
        inv
    }

    fn approval_of(inv: &Invocation, timeout: Duration) -> Approval {
        Approval::new(
            &inv.team_id,
            &inv.tool,
            &inv.version,
            &inv.principal,
            &inv.trace_id,
            inv.input.clone(),
            timeout,
        )
        .for_invocation(&inv.id)
    }

    pub(super) fn call(team: &str, conversation: &str, call_id: &str) -> Approval {
        Approval::new(
            team,
            "search",
            "1",
            "alice",
            "",
            json!({"q": call_id}),
            HOUR,
        )
        .for_call(conversation, call_id)
    }

    /// The wall clock, as the callers pass it.
    fn clock() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    async fn status_of(store: &Store, inv: &Invocation) -> Invocation {
        invocations::get(store, "t", &inv.id)
            .await
            .unwrap()
            .unwrap()
    }

    /// The key is claimed once; approving hands the invocation to the ASYNC worker.
    #[tokio::test]
    async fn a_held_invocation_claims_its_key_once_and_runs_once_approved() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let inv = held("k");
        let approval = approval_of(&inv, HOUR);
        let claimed = request_invocation(&store, &inv, &approval).await.unwrap();
        assert_eq!(claimed, Claimed::New);
        let stored = status_of(&store, &inv).await;
        assert_eq!(
            (stored.status, stored.mode),
            (Status::AwaitingApproval, Mode::Async)
        );
        let found = for_invocation(&store, "t", &inv.id).await.unwrap();
        assert_eq!(found.as_ref(), Some(&approval));
        assert_eq!(approval.input_sha256.len(), 64);

        // The same key again: the first is the answer, no second approval.
        let again = held("k");
        let second = approval_of(&again, HOUR);
        let Claimed::Existing(holder) = request_invocation(&store, &again, &second).await.unwrap()
        else {
            panic!("the key was taken")
        };
        assert_eq!(holder.id, inv.id);
        assert_eq!(get(&store, "t", &second.id).await.unwrap(), None);

        let decided = decide(
            &store,
            "t",
            &approval.id,
            Decision::Approve,
            "bob",
            "ok",
            clock(),
        );
        let Some(Decided::Now(now)) = decided.await.unwrap() else {
            panic!("a pending approval is decided")
        };
        assert_eq!(now.status, ApprovalStatus::Approved);
        assert_eq!(
            (now.decided_by.as_deref(), now.reason.as_str()),
            (Some("bob"), "ok")
        );
        assert!(now.decided_at_ms.is_some());
        assert_eq!(status_of(&store, &inv).await.status, Status::Pending);

        // A second decision finds the first; another team finds nothing.
        let late = decide(
            &store,
            "t",
            &approval.id,
            Decision::Reject,
            "carol",
            "no",
            clock(),
        );
        let Some(Decided::Already(first)) = late.await.unwrap() else {
            panic!("already decided")
        };
        assert_eq!(first, now);
        assert_eq!(status_of(&store, &inv).await.status, Status::Pending);
        let other = decide(
            &store,
            "u",
            &approval.id,
            Decision::Reject,
            "eve",
            "",
            clock(),
        );
        assert_eq!(other.await.unwrap(), None);
        store.close().await;
    }

    /// Rejected, the invocation ends without running, with the reason.
    #[tokio::test]
    async fn a_rejected_invocation_ends_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let inv = held("k");
        let approval = approval_of(&inv, HOUR);
        request_invocation(&store, &inv, &approval).await.unwrap();
        let decided = decide(
            &store,
            "t",
            &approval.id,
            Decision::Reject,
            "bob",
            "",
            clock(),
        );
        let Some(Decided::Now(now)) = decided.await.unwrap() else {
            panic!("a pending approval is decided")
        };
        assert_eq!(now.status, ApprovalStatus::Rejected);
        let ended = status_of(&store, &inv).await;
        assert_eq!(ended.status, Status::Rejected);
        let failure = Failure {
            code: "REJECTED".into(),
            message: "rejected".into(),
        };
        assert_eq!(ended.error, Some(failure));
        assert_eq!((ended.cost_micros, ended.duration_ms), (Some(7), Some(0)));
        store.close().await;
    }

    /// Past its time an approval cannot be decided; the sweeper expires it once.
    #[tokio::test]
    async fn expired_approvals_reject_their_invocations_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let inv = held("k");
        let approval = approval_of(&inv, Duration::ZERO);
        request_invocation(&store, &inv, &approval).await.unwrap();
        let waiting = request_call(&store, &call("t", "c", "1")).await.unwrap();

        let late = decide(
            &store,
            "t",
            &approval.id,
            Decision::Approve,
            "bob",
            "",
            clock(),
        );
        let Some(Decided::Already(unswept)) = late.await.unwrap() else {
            panic!("past its expiry")
        };
        assert_eq!(unswept.status, ApprovalStatus::Pending);

        let now = approval.expires_at_ms;
        let expired = expire(&store, now, 10).await.unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, approval.id);
        assert_eq!(expired[0].status, ApprovalStatus::Expired);
        assert_eq!(
            (expired[0].reason.as_str(), expired[0].decided_at_ms),
            ("expired", Some(now))
        );
        let ended = status_of(&store, &inv).await;
        assert_eq!(ended.status, Status::Rejected);
        assert_eq!(ended.error.map(|e| e.code), Some("EXPIRED".to_owned()));

        // A second sweep (another replica) changes nothing; the unexpired call waits on.
        assert!(expire(&store, now, 10).await.unwrap().is_empty());
        let still = get(&store, "t", &waiting.id).await.unwrap().unwrap();
        assert_eq!(still.status, ApprovalStatus::Pending);
        store.close().await;
    }

    /// Lists page newest first and filter by status; a call ID asked again
    /// (a later turn's) gets its own approval, which settles it.
    #[tokio::test]
    async fn approvals_list_newest_first_and_a_call_id_asked_again_is_asked_anew() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let first = call("t", "c", "1");
        assert_eq!(request_call(&store, &first).await.unwrap(), first);
        let second = request_call(&store, &call("t", "c", "2")).await.unwrap();
        let third = request_call(&store, &call("t", "c", "3")).await.unwrap();
        let theirs = request_call(&store, &call("u", "c", "1")).await.unwrap();
        assert_ne!(theirs.id, first.id);

        let ids = |list: Vec<Approval>| list.into_iter().map(|a| a.id).collect::<Vec<_>>();
        let all = list(&store, "t", None, None, 10).await.unwrap();
        assert_eq!(
            ids(all),
            [third.id.as_str(), second.id.as_str(), first.id.as_str()]
        );
        let page = list(&store, "t", None, Some(third.id.as_str()), 1)
            .await
            .unwrap();
        assert_eq!(ids(page), [second.id.as_str()]);
        let none = list(&store, "t", None, None, -1).await.unwrap();
        assert!(none.is_empty(), "a negative limit is none");

        decide(
            &store,
            "t",
            &second.id,
            Decision::Reject,
            "bob",
            "no",
            clock(),
        )
        .await
        .unwrap();
        let pending = list(&store, "t", Some(ApprovalStatus::Pending), None, 10);
        assert_eq!(
            ids(pending.await.unwrap()),
            [third.id.as_str(), first.id.as_str()]
        );
        let rejected = list(&store, "t", Some(ApprovalStatus::Rejected), None, 10);
        assert_eq!(ids(rejected.await.unwrap()), [second.id.as_str()]);

        let found = for_call(&store, "t", "c", "1").await.unwrap();
        assert_eq!(found, Some(first.clone()));
        assert_eq!(get(&store, "u", &first.id).await.unwrap(), None);

        // Approved, then the same call ID in a later turn: that call waits anew.
        decide(
            &store,
            "t",
            &first.id,
            Decision::Approve,
            "bob",
            "",
            clock(),
        )
        .await
        .unwrap();
        let again = request_call(&store, &call("t", "c", "1")).await.unwrap();
        assert_ne!(again.id, first.id);
        let found = for_call(&store, "t", "c", "1").await.unwrap().unwrap();
        assert_eq!(
            (found.id, found.status),
            (again.id, ApprovalStatus::Pending)
        );
        store.close().await;
    }
}
