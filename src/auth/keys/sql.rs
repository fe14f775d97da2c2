//! The `api_keys` table's SQL, valid on both backends.

use super::{KeyRecord, KeyRepository};
use crate::store::{Store, StoreError};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn KeyRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

crate::impl_for_both_pools!(KeyRepository {
    async fn insert(&self, record: &KeyRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (name, key_sha256, teams, role, created_at_ms, revoked_at_ms) \
             VALUES ($1, $2, $3, $4, $5, NULL)",
        )
        .bind(&record.name)
        .bind(&record.key_sha256)
        .bind(&record.teams)
        .bind(&record.role)
        .bind(record.created_at_ms)
        .execute(self)
        .await?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        const SQL: &str = "SELECT name, key_sha256, teams, role, created_at_ms, revoked_at_ms \
                           FROM api_keys ORDER BY name";
        let rows: Vec<KeyRow> = sqlx::query_as(SQL).fetch_all(self).await?;
        Ok(rows.into_iter().map(key_record).collect())
    }

    async fn revoke(&self, name: &str, now_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at_ms = $1 WHERE name = $2 AND revoked_at_ms IS NULL",
        )
        .bind(now_ms)
        .bind(name)
        .execute(self)
        .await?
        .rows_affected();
        Ok(done == 1)
    }
});

type KeyRow = (String, String, String, String, i64, Option<i64>);

fn key_record(row: KeyRow) -> KeyRecord {
    let (name, key_sha256, teams, role, created_at_ms, revoked_at_ms) = row;
    KeyRecord {
        name,
        key_sha256,
        teams,
        role,
        created_at_ms,
        revoked_at_ms,
    }
}
