//! API key material and the `api_keys` table.

use crate::{on_store, store::Store, store::StoreError};
use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of a key: what the config and the database hold.
pub fn hash_hex(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

pub use crate::domain::parse_hash;

/// A new random key: `aio_` and 64 hex characters from the OS-seeded CSPRNG.
pub fn generate() -> String {
    format!("aio_{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// One row of `api_keys`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct KeyRecord {
    /// Unique name (who the key belongs to).
    pub name: String,
    /// Lowercase hex SHA-256 of the key.
    pub key_sha256: String,
    /// Comma-separated team IDs, or `*`.
    pub teams: String,
    /// `caller` or `admin`.
    pub role: String,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// Revocation time, unix ms; `None` while valid.
    pub revoked_at_ms: Option<i64>,
}

/// The `api_keys` table.
#[derive(Debug, Clone)]
pub struct KeyStore {
    store: Store,
}

impl KeyStore {
    /// Over an open (migrated) store.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Inserts a key record; fails when the name or hash exists.
    pub async fn insert(&self, record: &KeyRecord) -> Result<(), StoreError> {
        on_store!(&self.store, |pool| {
            sqlx::query(
                "INSERT INTO api_keys (name, key_sha256, teams, role, created_at_ms, revoked_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, NULL)",
            )
            .bind(&record.name)
            .bind(&record.key_sha256)
            .bind(&record.teams)
            .bind(&record.role)
            .bind(record.created_at_ms)
            .execute(pool)
            .await?;
        });
        Ok(())
    }

    /// Every key, revoked ones included, by name.
    pub async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        const SQL: &str = "SELECT name, key_sha256, teams, role, created_at_ms, revoked_at_ms \
                           FROM api_keys ORDER BY name";
        Ok(on_store!(&self.store, |pool| {
            sqlx::query_as::<_, KeyRecord>(SQL).fetch_all(pool).await?
        }))
    }

    /// Revokes `name` at `now_ms`; false when no valid key has that name.
    pub async fn revoke(&self, name: &str, now_ms: i64) -> Result<bool, StoreError> {
        let done = on_store!(&self.store, |pool| {
            sqlx::query(
                "UPDATE api_keys SET revoked_at_ms = $1 WHERE name = $2 AND revoked_at_ms IS NULL",
            )
            .bind(now_ms)
            .bind(name)
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(done == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_and_keys_are_random() {
        let h = hash_hex("abc");
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(parse_hash(&h).is_some());
        assert!(parse_hash("xyz").is_none());
        assert!(parse_hash(&h[..62]).is_none());
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert_eq!(a.len(), 68);
    }
}
