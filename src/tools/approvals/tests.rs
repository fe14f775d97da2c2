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
