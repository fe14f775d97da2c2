//! The conversation tables' SQL, valid on both backends: the repository, and the statements
//! a turn runs in the ledger's group commit.

use super::{Conversation, ConversationRepository, StoredMessage, TurnRecord};
use crate::{
    domain::{ChatMessage, ToolCall, ToolOutcome, completion::Role},
    store::{Statement, Store, StoreError},
};
use serde::{Deserialize, Serialize};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn ConversationRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

#[derive(Serialize, Deserialize)]
struct CallJson {
    id: String,
    name: String,
    arguments: String,
}

#[derive(Serialize, Deserialize)]
struct ResultJson {
    call_id: String,
    name: String,
    content: String,
    is_error: bool,
}

fn role_str(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn role_parse(s: &str) -> Role {
    match s {
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => Role::User,
    }
}

const CONVERSATION: &str = "SELECT id, team_id, agent, turns, created_at_ms, updated_at_ms, \
     expires_at_ms, summary, summary_through FROM conversations";

type ConversationRow = (String, String, String, i64, i64, i64, i64, String, i64);

fn conversation(row: ConversationRow) -> Conversation {
    let (id, team_id, agent, turns, created_at_ms, updated_at_ms, expires_at_ms) =
        (row.0, row.1, row.2, row.3, row.4, row.5, row.6);
    Conversation {
        id,
        team_id,
        agent,
        turns: u32::try_from(turns).unwrap_or(u32::MAX),
        created_at_ms,
        updated_at_ms,
        expires_at_ms,
        summary: row.7,
        summary_through: row.8,
    }
}

const MESSAGE: &str = "SELECT turn, role, content, tool_calls, tool_result, created_at_ms, seq \
     FROM conversation_messages";

type MessageRow = (
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    i64,
);

fn message(row: MessageRow) -> StoredMessage {
    let (turn, role, content, calls, result) = (row.0, row.1, row.2, row.3, row.4);
    let tool_calls = calls
        .and_then(|c| serde_json::from_str::<Vec<CallJson>>(&c).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|c| ToolCall {
            id: c.id,
            name: c.name,
            arguments: c.arguments,
        })
        .collect();
    let tool_result = result
        .and_then(|r| serde_json::from_str::<ResultJson>(&r).ok())
        .map(|r| ToolOutcome {
            call_id: r.call_id,
            name: r.name,
            content: r.content,
            is_error: r.is_error,
        });
    StoredMessage {
        turn: u32::try_from(turn).unwrap_or(u32::MAX),
        message: ChatMessage {
            role: role_parse(&role),
            content,
            tool_calls,
            tool_result,
        },
        created_at_ms: row.5,
        seq: row.6,
    }
}

/// Starts a conversation of `team` held by the turn `token` until
/// `lease_until_ms`: it, and the statement writing its row (group commit).
pub fn create(
    team: &str,
    agent: &str,
    principal: &str,
    now_ms: i64,
    lease_until_ms: i64,
    token: &str,
) -> (Conversation, Statement) {
    let id = uuid::Uuid::now_v7().to_string();
    let insert = Statement::new(
        "INSERT INTO conversations (id, team_id, agent, principal, turns, created_at_ms, \
         updated_at_ms, expires_at_ms, busy_until_ms, busy_token) \
         VALUES ($1, $2, $3, $4, 0, $5, $5, $6, $6, $7)",
        vec![
            id.as_str().into(),
            team.into(),
            agent.into(),
            principal.into(),
            now_ms.into(),
            lease_until_ms.into(),
            token.into(),
        ],
    );
    let conversation = Conversation {
        id,
        team_id: team.to_owned(),
        agent: agent.to_owned(),
        turns: 0,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        // Until its first turn completes, the lease is its whole life.
        expires_at_ms: lease_until_ms,
        summary: String::new(),
        summary_through: 0,
    };
    (conversation, insert)
}

/// Takes conversation `id` for the turn `token` unless another turn's lease
/// still runs: changes one row when taken. See [`acquired`](super::acquired).
pub fn acquire(team: &str, id: &str, now_ms: i64, lease_until_ms: i64, token: &str) -> Statement {
    Statement::new(
        "UPDATE conversations SET busy_until_ms = $1, busy_token = $2 \
         WHERE id = $3 AND team_id = $4 AND expires_at_ms > $5 \
         AND (busy_until_ms IS NULL OR busy_until_ms <= $5)",
        vec![
            lease_until_ms.into(),
            token.into(),
            id.into(),
            team.into(),
            now_ms.into(),
        ],
    )
}

/// A completed turn's statements, for one transaction: the lease's release
/// first, as their guard (it changes no row once the lease was lost to an
/// erase, and then nothing is stored), then the messages and the record.
pub fn complete_turn(
    c: &Conversation,
    token: &str,
    messages: &[ChatMessage],
    record: &TurnRecord,
    now_ms: i64,
    expires_at_ms: i64,
) -> Vec<Statement> {
    let mut statements = Vec::with_capacity(messages.len() + 2);
    statements.push(Statement::new(
        "UPDATE conversations SET turns = turns + 1, updated_at_ms = $1, expires_at_ms = $2, \
         busy_until_ms = NULL, busy_token = NULL WHERE id = $3 AND busy_token = $4",
        vec![
            now_ms.into(),
            expires_at_ms.into(),
            c.id.as_str().into(),
            token.into(),
        ],
    ));
    for m in messages {
        let calls = (!m.tool_calls.is_empty()).then(|| {
            let list: Vec<CallJson> = m
                .tool_calls
                .iter()
                .map(|c| CallJson {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect();
            serde_json::to_string(&list).unwrap_or_default()
        });
        let result = m.tool_result.as_ref().map(|r| {
            serde_json::to_string(&ResultJson {
                call_id: r.call_id.clone(),
                name: r.name.clone(),
                content: r.content.clone(),
                is_error: r.is_error,
            })
            .unwrap_or_default()
        });
        // The next seq of its conversation: the turn's lease keeps others out.
        statements.push(Statement::new(
            "INSERT INTO conversation_messages (conversation_id, seq, turn, role, content, \
             tool_calls, tool_result, created_at_ms) VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 \
             FROM conversation_messages WHERE conversation_id = $1), $2, $3, $4, $5, $6, $7)",
            vec![
                c.id.as_str().into(),
                i64::from(record.turn).into(),
                role_str(m.role).into(),
                m.content.as_str().into(),
                calls.into(),
                result.into(),
                now_ms.into(),
            ],
        ));
    }
    let suggestions = serde_json::to_string(&record.memory_suggestions).unwrap_or_default();
    statements.push(Statement::new(
        "INSERT INTO conversation_turns (conversation_id, turn, trace_id, stop_reason, \
         iterations, tool_calls, memory_suggestions, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        vec![
            c.id.as_str().into(),
            i64::from(record.turn).into(),
            record.trace_id.as_str().into(),
            record.stop_reason.as_str().into(),
            i64::from(record.iterations).into(),
            i64::from(record.tool_calls).into(),
            suggestions.into(),
            now_ms.into(),
        ],
    ));
    statements
}

/// Stores `summary` on conversation `id` as covering its messages up to
/// `through` (a seq), while the turn `token` holds it.
pub fn summarized(id: &str, token: &str, summary: &str, through: i64) -> Statement {
    Statement::new(
        "UPDATE conversations SET summary = $1, summary_through = $2 \
         WHERE id = $3 AND busy_token = $4",
        vec![summary.into(), through.into(), id.into(), token.into()],
    )
}

/// Gives conversation `id` back after a turn holding it by `token` ended
/// unstored: erased if it was to be its first turn, else its lease cleared.
/// A no-op once the lease was lost or given back, so always safe to run.
pub fn release(id: &str, token: &str, first_turn: bool) -> Statement {
    let sql = if first_turn {
        "DELETE FROM conversations WHERE id = $1 AND busy_token = $2 AND turns = 0"
    } else {
        "UPDATE conversations SET busy_until_ms = NULL, busy_token = NULL \
         WHERE id = $1 AND busy_token = $2"
    };
    Statement::new(sql, vec![id.into(), token.into()])
}

crate::impl_for_both_pools!(ConversationRepository {
    async fn find(
        &self,
        team: &str,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<Conversation>, StoreError> {
        // Past its retention it is gone, whether or not the sweeper has run.
        let sql = format!("{CONVERSATION} WHERE id = $1 AND team_id = $2 AND expires_at_ms > $3");
        let row: Option<ConversationRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(team)
            .bind(now_ms)
            .fetch_optional(self)
            .await?;
        Ok(row.map(conversation))
    }

    async fn history(
        &self,
        id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let sql = format!(
            "{MESSAGE} WHERE conversation_id = $1 AND seq > $2 ORDER BY seq DESC LIMIT $3"
        );
        let rows: Vec<MessageRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(self)
            .await?;
        Ok(rows.into_iter().rev().map(message).collect())
    }

    async fn turns(&self, id: &str) -> Result<Vec<TurnRecord>, StoreError> {
        let rows: Vec<TurnRow> = sqlx::query_as(
            "SELECT turn, trace_id, stop_reason, iterations, tool_calls, memory_suggestions \
             FROM conversation_turns WHERE conversation_id = $1 ORDER BY turn",
        )
        .bind(id)
        .fetch_all(self)
        .await?;
        Ok(rows.into_iter().map(turn_record).collect())
    }

    async fn delete(&self, team: &str, id: &str) -> Result<Option<u64>, StoreError> {
        let mut tx = self.begin().await?;
        let gone = sqlx::query("DELETE FROM conversations WHERE id = $1 AND team_id = $2")
            .bind(id)
            .bind(team)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 0 {
            return Ok(None);
        }
        let messages = sqlx::query("DELETE FROM conversation_messages WHERE conversation_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM conversation_turns WHERE conversation_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(messages))
    }

    async fn expired(&self, now_ms: i64, limit: u32) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT id FROM conversations WHERE expires_at_ms <= $1 \
             AND (busy_until_ms IS NULL OR busy_until_ms <= $1) LIMIT $2",
        )
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(self)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn erase_expired(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let gone = sqlx::query("DELETE FROM conversations WHERE id = $1 AND expires_at_ms <= $2")
            .bind(id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 1 {
            for table in ["conversation_messages", "conversation_turns"] {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM {table} WHERE conversation_id = $1"
                )))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(gone == 1)
    }
});

type TurnRow = (i64, String, String, i64, i64, String);

fn turn_record(row: TurnRow) -> TurnRecord {
    let (turn, trace_id, stop_reason, iterations, tools, suggestions) = row;
    let n = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    TurnRecord {
        turn: n(turn),
        trace_id,
        stop_reason,
        iterations: n(iterations),
        tool_calls: n(tools),
        memory_suggestions: serde_json::from_str(&suggestions).unwrap_or_default(),
    }
}
