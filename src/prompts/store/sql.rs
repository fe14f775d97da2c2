//! The prompt tables' SQL (`ai_prompts`, `ai_prompt_audit`), valid on both backends.

use super::{NewPrompt, PromptRepository, StoredPrompt, activated};
use crate::{
    prompts::Prompt,
    store::{Backend as _, Store, StoreError},
};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn PromptRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

const COLUMNS: &str = "team_id, prompt_key, version, system_prompt, user_prompt_template, model, temperature, \
max_tokens, is_active, usage_count, avg_latency_ms, success_rate, created_at_ms, created_by";

type Row = (
    String,
    String,
    i64,
    String,
    String,
    Option<String>,
    Option<f64>,
    Option<i64>,
    i64,
    i64,
    f64,
    f64,
    i64,
    String,
);

fn from_row(r: Row) -> StoredPrompt {
    let (
        team_id,
        key,
        version,
        system,
        user_template,
        model,
        temperature,
        max_tokens,
        active,
        count,
        latency,
        success,
        at,
        by,
    ) = r;
    StoredPrompt {
        prompt: Prompt {
            key,
            owner: team_id.clone(),
            version: u32::try_from(version).unwrap_or(0),
            system,
            user_template,
            model,
            temperature: temperature.map(|t| t as f32),
            max_tokens: max_tokens.and_then(|m| u32::try_from(m).ok()),
        },
        team_id,
        is_active: active != 0,
        usage_count: count,
        avg_latency_ms: latency,
        success_rate: success,
        created_at_ms: at,
        created_by: by,
    }
}

/// Appends to the prompt audit trail within `$exec`, a transaction of either backend.
macro_rules! audit {
    ($exec:expr, $at:expr, $actor:expr, $action:expr, $team:expr, $key:expr, $version:expr) => {
        sqlx::query(
            "INSERT INTO ai_prompt_audit (at_ms, actor, action, team_id, prompt_key, version) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind($at)
        .bind($actor)
        .bind($action)
        .bind($team)
        .bind($key)
        .bind($version)
        .execute($exec)
        .await
        .map(drop)
    };
}

crate::impl_for_both_pools!(PromptRepository {
    async fn resolve(&self, team: &str, key: &str) -> Result<Option<StoredPrompt>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM ai_prompts WHERE prompt_key = $1 AND is_active = 1 AND team_id IN ($2, '') \
             ORDER BY CASE WHEN team_id = '' THEN 1 ELSE 0 END LIMIT 1"
        );
        let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(key)
            .bind(team)
            .fetch_optional(self)
            .await?;
        Ok(row.map(from_row))
    }

    async fn version(
        &self,
        team: &str,
        key: &str,
        version: u32,
    ) -> Result<Option<(String, Option<String>)>, StoreError> {
        let stored: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT system_prompt, model FROM ai_prompts WHERE team_id = $1 AND prompt_key = $2 AND version = $3")
                .bind(team)
                .bind(key)
                .bind(i64::from(version))
                .fetch_optional(self)
                .await?;
        Ok(stored)
    }

    async fn add(&self, new: &NewPrompt, actor: &str, now_ms: i64) -> Result<i64, StoreError> {
        let mut tx = crate::store::begin_write(self, Self::POSTGRES).await?;
        let current: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(version) FROM ai_prompts WHERE team_id = $1 AND prompt_key = $2",
        )
        .bind(&new.team_id)
        .bind(&new.key)
        .fetch_one(&mut *tx)
        .await?;
        let version = current.unwrap_or(0) + 1;
        if new.activate {
            sqlx::query(
                "UPDATE ai_prompts SET is_active = 0 WHERE team_id = $1 AND prompt_key = $2",
            )
            .bind(&new.team_id)
            .bind(&new.key)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO ai_prompts (team_id, prompt_key, version, system_prompt, user_prompt_template, model, \
             temperature, max_tokens, is_active, created_at_ms, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&new.team_id)
        .bind(&new.key)
        .bind(version)
        .bind(&new.system)
        .bind(&new.user_template)
        .bind(&new.model)
        .bind(new.temperature.map(f64::from))
        .bind(new.max_tokens.map(i64::from))
        .bind(i64::from(new.activate))
        .bind(now_ms)
        .bind(actor)
        .execute(&mut *tx)
        .await?;
        audit!(
            &mut *tx,
            now_ms,
            actor,
            "create",
            &new.team_id,
            &new.key,
            version
        )?;
        if new.activate {
            audit!(
                &mut *tx,
                now_ms,
                actor,
                "activate",
                &new.team_id,
                &new.key,
                version
            )?;
            let event = activated(&new.team_id, &new.key, version, actor, now_ms);
            crate::append_audit_events!(tx, Self::POSTGRES, vec![event])?;
        }
        tx.commit().await?;
        Ok(version)
    }

    async fn activate(
        &self,
        team: &str,
        key: &str,
        version: u32,
        actor: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = crate::store::begin_write(self, Self::POSTGRES).await?;
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT version FROM ai_prompts WHERE team_id = $1 AND prompt_key = $2 AND version = $3")
                .bind(team)
                .bind(key)
                .bind(i64::from(version))
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            return Ok(false);
        }
        // Deactivate first: the unique index allows one active row at a time.
        sqlx::query("UPDATE ai_prompts SET is_active = 0 WHERE team_id = $1 AND prompt_key = $2")
            .bind(team)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE ai_prompts SET is_active = 1 WHERE team_id = $1 AND prompt_key = $2 AND version = $3")
            .bind(team)
            .bind(key)
            .bind(i64::from(version))
            .execute(&mut *tx)
            .await?;
        audit!(
            &mut *tx,
            now_ms,
            actor,
            "activate",
            team,
            key,
            i64::from(version)
        )?;
        let event = activated(team, key, i64::from(version), actor, now_ms);
        crate::append_audit_events!(tx, Self::POSTGRES, vec![event])?;
        tx.commit().await?;
        Ok(true)
    }

    async fn list(
        &self,
        team: Option<&str>,
        key: Option<&str>,
    ) -> Result<Vec<StoredPrompt>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM ai_prompts WHERE ($1 = '*' OR team_id = $1) AND ($2 = '*' OR prompt_key = $2) \
             ORDER BY team_id, prompt_key, version"
        );
        let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.unwrap_or("*"))
            .bind(key.unwrap_or("*"))
            .fetch_all(self)
            .await?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    async fn audit_trail(
        &self,
        team: &str,
        key: &str,
    ) -> Result<Vec<(i64, String, String, i64)>, StoreError> {
        let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
            "SELECT at_ms, actor, action, version FROM ai_prompt_audit WHERE team_id = $1 AND prompt_key = $2 ORDER BY id",
        )
        .bind(team)
        .bind(key)
        .fetch_all(self)
        .await?;
        Ok(rows)
    }
});
