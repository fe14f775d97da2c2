//! A turn's hold on its conversation: given back when the turn is dropped
//! or fails, turned into the stored turn when it completes.

use super::super::{CallContext, CallError, Pipeline};
use super::prepare::now_ms;
use crate::{
    agent::conversations,
    audit::AuditEvent,
    domain::ChatMessage,
    usage::ledger::{Done, LedgerWriter, Op, Write},
};

/// A turn's hold on its conversation until the turn is stored: dropped
/// unstored (the caller went away, in `prepare` or mid-turn), it gives the
/// conversation back at once rather than leave the lease to run out. The
/// release goes through the ledger's queue like the lease, so it lands
/// after the lease's write (a team's operations keep their order); the
/// lease's token guards it, so releasing a lease never taken changes nothing.
pub(super) struct Held {
    ledger: LedgerWriter,
    team: String,
    id: String,
    token: String,
    /// Whether there is anything to give back.
    armed: bool,
    /// The conversation had no completed turn: releasing erases it.
    first_turn: bool,
}

impl Held {
    /// A hold on conversation `id`, armed before the lease's write is queued.
    pub fn new(pipeline: &Pipeline, team: &str, id: &str, token: &str, first_turn: bool) -> Self {
        Self {
            ledger: pipeline.ledger().clone(),
            team: team.to_owned(),
            id: id.to_owned(),
            token: token.to_owned(),
            armed: true,
            first_turn,
        }
    }

    /// The lease was taken on `c`, as it stands.
    pub fn holds(&mut self, c: &conversations::Conversation) {
        self.first_turn = c.turns == 0;
    }

    /// Nothing to give back: the lease was not taken, or the turn stored.
    pub fn let_go(&mut self) {
        self.armed = false;
    }

    fn op(&mut self) -> Option<Op> {
        std::mem::take(&mut self.armed).then(|| {
            Op::Write(Write {
                team_id: self.team.clone(),
                statements: vec![conversations::release(
                    &self.id,
                    &self.token,
                    self.first_turn,
                )],
                durable: false,
                audit: Vec::new(),
                audit_only_if_stored: false,
                outbox: Vec::new(),
            })
        })
    }

    /// Gives the conversation back after a failed turn, once committed.
    pub async fn release(&mut self, ctx: &CallContext) {
        let Some(op) = self.op() else { return };
        if let Err(e) = self.ledger.submit(op).await {
            tracing::warn!(trace_id = %ctx.trace_id, error = %e, "releasing a conversation failed");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(op) = self.op() else { return };
        let ledger = self.ledger.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = ledger.enqueue(op).await {
                    tracing::warn!(error = %e, "releasing an abandoned turn's conversation failed");
                }
            });
        }
    }
}

/// Runs a conversation's `statements` and `audit` events in one
/// transaction of `team`'s group commit: true when the first statement
/// changed a row. `durable`: answered once on disk, else once committed.
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
        audit_only_if_stored: false,
        outbox: Vec::new(),
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
    pub messages: &'a [ChatMessage],
    pub record: &'a conversations::TurnRecord,
    pub end: AuditEvent,
}

/// Appends the turn and its end event in one transaction, durably. A lost
/// lease fails the turn unless the conversation was erased meanwhile; the
/// event is written either way.
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
