//! A turn's hold on its conversation: given back when the turn is dropped
//! unfinished, released when it fails, and turned into the stored turn
//! when it completes.

use super::super::{CallContext, CallError, Pipeline};
use super::prepare::now_ms;
use crate::{
    agent::conversations,
    audit::AuditEvent,
    providers::ChatMessage,
    usage::ledger::{Done, Op, Write},
};

/// A turn's hold on its conversation while it runs: dropped with the turn
/// unfinished (the caller cancelled or disconnected), it gives the
/// conversation back at once instead of leaving the lease to run out.
pub(super) struct Held {
    pub pipeline: Pipeline,
    pub conversation: Option<conversations::Conversation>,
    pub token: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(conversation) = self.conversation.take() else {
            return;
        };
        let (store, token) = (
            self.pipeline.store().clone(),
            std::mem::take(&mut self.token),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = conversations::release(&store, &conversation, &token).await {
                    tracing::warn!(error = %e, "releasing an abandoned turn's conversation failed");
                }
            });
        }
    }
}

/// Runs a conversation's `statements` in the ledger's group commit for
/// `team` (see [`conversations`]), with `audit` events in the same
/// transaction: true when the first statement changed a row and the rest
/// ran. `durable`: answered once on disk, else once committed.
pub(super) async fn write(
    pipeline: &Pipeline,
    team: &str,
    statements: Vec<crate::store::Statement>,
    durable: bool,
    audit: Vec<AuditEvent>,
) -> Result<bool, CallError> {
    let op = Op::Write(Write {
        team_id: team.to_owned(),
        statements,
        durable,
        audit,
    });
    match pipeline.ledger().submit(op).await {
        Ok(Done::Written { stored, .. }) => Ok(stored),
        Ok(other) => Err(CallError::Storage(format!(
            "the ledger answered a conversation write with {other:?}"
        ))),
        Err(e) => Err(CallError::Storage(e.to_string())),
    }
}

/// What a completed turn stores.
pub(super) struct Completed<'a> {
    /// The messages it adds to its conversation.
    pub messages: &'a [ChatMessage],
    /// Its row.
    pub record: &'a conversations::TurnRecord,
    /// Its `agent.turn.complete` audit event.
    pub end: AuditEvent,
}

/// Appends the turn to its conversation and its end event to the audit
/// log, in one transaction, durably. A lost lease fails the turn unless
/// the conversation was erased meanwhile (then there is nothing to keep it
/// in); the event is written either way.
pub(super) async fn store_turn(
    pipeline: &Pipeline,
    ctx: &CallContext,
    agent: &crate::config::agents::AgentConfig,
    conversation: &conversations::Conversation,
    token: &str,
    turn: Completed<'_>,
) -> Result<(), CallError> {
    let storage = |e: crate::store::StoreError| CallError::Storage(e.to_string());
    let now = now_ms();
    let expires = now.saturating_add(i64::from(agent.retention_days).saturating_mul(86_400_000));
    let statements = conversations::complete_turn(
        conversation,
        token,
        turn.messages,
        turn.record,
        now,
        expires,
    );
    if write(pipeline, &ctx.team_id, statements, true, vec![turn.end]).await? {
        return Ok(());
    }
    let store = pipeline.store();
    match conversations::find(store, &ctx.team_id, &conversation.id, now)
        .await
        .map_err(storage)?
    {
        None => {
            tracing::warn!(trace_id = %ctx.trace_id, "the conversation was erased during the turn; the turn is not stored");
            Ok(())
        }
        Some(_) => Err(CallError::Storage(
            "the turn's hold on its conversation ran out before it completed".into(),
        )),
    }
}

/// Gives the conversation back after a failed turn; nothing of the turn
/// is stored.
pub(super) async fn release(
    pipeline: &Pipeline,
    ctx: &CallContext,
    conversation: &conversations::Conversation,
    token: &str,
) {
    if let Err(e) = conversations::release(pipeline.store(), conversation, token).await {
        tracing::warn!(trace_id = %ctx.trace_id, error = %e, "releasing a conversation failed");
    }
}
