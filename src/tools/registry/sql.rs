//! The `tool_registry` table's SQL, valid on both backends. Reads go through
//! the repository; changes are [`Statement`]s the ledger runs with their
//! audit event in one transaction, each guarded so that it reports whether
//! it changed a row.

use super::stored::{StoredTool, ToolRegistryRepository};
use crate::store::{Statement, Store, StoreError};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn ToolRegistryRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

const COLUMNS: &str = "name, version, config, config_sha256, enabled, disabled_reason, \
     deprecated, replacement, registered_by, changed_by, created_at_ms, updated_at_ms";

fn decode<R: sqlx::Row>(row: &R) -> Result<StoredTool, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let config: String = row.try_get(2)?;
    let enabled: i64 = row.try_get(4)?;
    let deprecated: i64 = row.try_get(6)?;
    Ok(StoredTool {
        name: row.try_get(0)?,
        version: row.try_get(1)?,
        // A row that no longer parses is refused when its tool is built, never a panic.
        config: serde_json::from_str(&config).unwrap_or(serde_json::Value::Null),
        config_sha256: row.try_get(3)?,
        enabled: enabled != 0,
        disabled_reason: row.try_get(5)?,
        deprecated: deprecated != 0,
        replacement: row.try_get(7)?,
        registered_by: row.try_get(8)?,
        changed_by: row.try_get(9)?,
        created_at_ms: row.try_get(10)?,
        updated_at_ms: row.try_get(11)?,
    })
}

crate::impl_for_both_pools!(ToolRegistryRepository {
    async fn all(&self) -> Result<Vec<StoredTool>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_registry ORDER BY name, version");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(self).await?;
        Ok(rows.iter().map(decode).collect::<Result<_, _>>()?)
    }

    async fn get(&self, name: &str, version: &str) -> Result<Option<StoredTool>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_registry WHERE name = $1 AND version = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .bind(version)
            .fetch_optional(self)
            .await?;
        Ok(row.as_ref().map(decode).transpose()?)
    }

    async fn versions(&self, name: &str) -> Result<Vec<StoredTool>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_registry WHERE name = $1");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_all(self)
            .await?;
        Ok(rows.iter().map(decode).collect::<Result<_, _>>()?)
    }
});

/// Stores `tool` unless its (name, version) is taken: changes no row then.
pub fn register(tool: &StoredTool) -> Statement {
    Statement::new(
        "INSERT INTO tool_registry (name, version, config, config_sha256, enabled, \
         disabled_reason, deprecated, replacement, registered_by, changed_by, created_at_ms, \
         updated_at_ms) VALUES ($1, $2, $3, $4, 1, '', 0, '', $5, $5, $6, $6) \
         ON CONFLICT (name, version) DO NOTHING",
        vec![
            tool.name.as_str().into(),
            tool.version.as_str().into(),
            tool.config.to_string().into(),
            tool.config_sha256.as_str().into(),
            tool.registered_by.as_str().into(),
            tool.created_at_ms.into(),
        ],
    )
}

/// Disables (`reason` given) or enables (`None`) version `version` of `name`,
/// or every version when `version` is empty; changes no row already so.
pub fn set_enabled(
    name: &str,
    version: &str,
    reason: Option<&str>,
    by: &str,
    now_ms: i64,
) -> Statement {
    Statement::new(
        "UPDATE tool_registry SET enabled = $3, disabled_reason = $4, changed_by = $5, \
         updated_at_ms = $6 WHERE name = $1 AND ($2 = '' OR version = $2) \
         AND (enabled <> $3 OR disabled_reason <> $4)",
        vec![
            name.into(),
            version.into(),
            i64::from(reason.is_none()).into(),
            reason.unwrap_or_default().into(),
            by.into(),
            now_ms.into(),
        ],
    )
}

/// Marks version `version` of `name` deprecated, `replacement` its successor
/// ('' for none); changes no row already so.
pub fn deprecate(name: &str, version: &str, replacement: &str, by: &str, now_ms: i64) -> Statement {
    Statement::new(
        "UPDATE tool_registry SET deprecated = 1, replacement = $3, changed_by = $4, \
         updated_at_ms = $5 WHERE name = $1 AND version = $2 \
         AND (deprecated = 0 OR replacement <> $3)",
        vec![
            name.into(),
            version.into(),
            replacement.into(),
            by.into(),
            now_ms.into(),
        ],
    )
}
