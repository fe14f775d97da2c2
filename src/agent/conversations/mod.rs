//! The `conversations`, `conversation_messages` and `conversation_turns`
//! tables (SPEC §11.6): a conversation is its team's alone; a turn holds it
//! by a lease taken with one conditional UPDATE (a second turn is refused,
//! on any replica); `delete` and the sweeper erase all it stored. A turn's
//! writes are statements run in the ledger's group commit, so on SQLite
//! they never wait for its lock, nor it for them (ADR 0022).

mod sql;

pub use sql::{acquire, complete_turn, create, release, summarized};

use crate::{
    domain::ChatMessage,
    store::{Store, StoreError},
};

/// A conversation's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// UUIDv7.
    pub id: String,
    pub team_id: String,
    pub agent: String,
    /// Turns completed.
    pub turns: u32,
    pub created_at_ms: i64,
    /// Last turn, unix ms.
    pub updated_at_ms: i64,
    /// Erased after this, unix ms.
    pub expires_at_ms: i64,
    /// The summary of its oldest messages (`history_overflow = "summarize"`).
    pub summary: String,
    /// The last message (seq) the summary covers; 0 for none.
    pub summary_through: i64,
}

/// One stored message.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Its turn, from 1.
    pub turn: u32,
    pub message: ChatMessage,
    pub created_at_ms: i64,
    /// Its place in the conversation, from 1.
    pub seq: i64,
}

/// How a completed turn ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnRecord {
    /// The turn, from 1.
    pub turn: u32,
    pub trace_id: String,
    /// Its stop reason (`FINAL_ANSWER`, ...).
    pub stop_reason: String,
    /// Model calls made.
    pub iterations: u32,
    /// Tool executions made.
    pub tool_calls: u32,
    pub memory_suggestions: Vec<String>,
}

/// What taking a conversation for a turn found.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    /// The turn holds it until its lease ends.
    Held(Conversation),
    /// Another turn holds it.
    Busy,
    /// No such conversation for this team (or it was erased).
    NotFound,
}

/// The conversation tables' reads and erasures (implemented per backend in `sql`); a turn's
/// writes are [`Statement`](crate::store::Statement)s run in the ledger's group commit.
#[async_trait::async_trait]
pub trait ConversationRepository: Send + Sync + std::fmt::Debug {
    /// Conversation `id` of `team`, if it has not expired at `now_ms`.
    async fn find(
        &self,
        team: &str,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<Conversation>, StoreError>;

    /// The newest `limit` messages of conversation `id` after seq `after`,
    /// oldest first.
    async fn history(
        &self,
        id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredMessage>, StoreError>;

    /// Conversation `id`'s turn records, by turn.
    async fn turns(&self, id: &str) -> Result<Vec<TurnRecord>, StoreError>;

    /// Erases conversation `id` of `team` with its messages and turns; the messages erased,
    /// or `None` when there was no such conversation.
    async fn delete(&self, team: &str, id: &str) -> Result<Option<u64>, StoreError>;

    /// The conversations expired at `now_ms` and not held by a turn, at most `limit`.
    async fn expired(&self, now_ms: i64, limit: u32) -> Result<Vec<String>, StoreError>;

    /// Erases expired conversation `id` with its messages and turns; false when another
    /// replica's sweep (or a new turn) got there first.
    async fn erase_expired(&self, id: &str, now_ms: i64) -> Result<bool, StoreError>;
}

/// What [`acquire`] came to: `taken` when its statement changed the row.
pub async fn acquired(
    store: &Store,
    team: &str,
    id: &str,
    now_ms: i64,
    taken: bool,
) -> Result<Acquired, StoreError> {
    Ok(match find(store, team, id, now_ms).await? {
        Some(c) if taken => Acquired::Held(c),
        Some(_) => Acquired::Busy,
        None => Acquired::NotFound,
    })
}

/// Conversation `id` of `team`, if it has not expired at `now_ms`.
pub async fn find(
    store: &Store,
    team: &str,
    id: &str,
    now_ms: i64,
) -> Result<Option<Conversation>, StoreError> {
    sql::repository(store).find(team, id, now_ms).await
}

/// The newest `limit` messages of conversation `id`, oldest first.
pub async fn history(
    store: &Store,
    id: &str,
    limit: u32,
) -> Result<Vec<StoredMessage>, StoreError> {
    sql::repository(store).history(id, 0, limit).await
}

/// The newest `limit` messages of conversation `id` after seq `after`
/// (what a summary does not cover), oldest first.
pub async fn history_after(
    store: &Store,
    id: &str,
    after: i64,
    limit: u32,
) -> Result<Vec<StoredMessage>, StoreError> {
    sql::repository(store).history(id, after, limit).await
}

/// Every memory suggestion stored on conversation `id`'s turns, by turn.
pub async fn turns(store: &Store, id: &str) -> Result<Vec<TurnRecord>, StoreError> {
    sql::repository(store).turns(id).await
}

/// Erases conversation `id` of `team` with its messages and turns; returns
/// the messages erased, or `None` when there was no such conversation.
pub async fn delete(store: &Store, team: &str, id: &str) -> Result<Option<u32>, StoreError> {
    let erased = sql::repository(store).delete(team, id).await?;
    Ok(erased.map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
}

/// Erases up to 500 conversations expired before `now_ms`; returns how many.
/// Safe on several replicas: each row's DELETE is won once.
pub async fn sweep(store: &Store, now_ms: i64) -> Result<u64, StoreError> {
    let repository = sql::repository(store);
    let mut swept = 0;
    for id in repository.expired(now_ms, 500).await? {
        if repository.erase_expired(&id, now_ms).await? {
            swept += 1;
        }
    }
    Ok(swept)
}
