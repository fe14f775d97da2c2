//! API key material and the `api_keys` table.

mod sql;

use crate::store::{Store, StoreError};
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
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The `api_keys` table over an open (migrated) store: derefs to its repository.
#[derive(Debug, Clone)]
pub struct KeyStore(Store);

impl KeyStore {
    /// Over an open (migrated) store.
    pub fn new(store: Store) -> Self {
        Self(store)
    }
}

impl std::ops::Deref for KeyStore {
    type Target = dyn KeyRepository;

    fn deref(&self) -> &Self::Target {
        sql::repository(&self.0)
    }
}

/// The `api_keys` table's operations (implemented per backend in `sql`).
#[async_trait::async_trait]
pub trait KeyRepository: Send + Sync + std::fmt::Debug {
    /// Inserts a key record; fails when the name or hash exists.
    async fn insert(&self, record: &KeyRecord) -> Result<(), StoreError>;

    /// Every key, revoked ones included, by name.
    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError>;

    /// Revokes `name` at `now_ms`; false when no valid key has that name.
    async fn revoke(&self, name: &str, now_ms: i64) -> Result<bool, StoreError>;
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
