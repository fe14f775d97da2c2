//! Who is calling: API keys (config hashes and the `api_keys` table, reloaded every
//! `refresh_interval` so every replica sees a change without a restart) mapped to teams and a
//! role. Only SHA-256 hashes are held, compared in constant time with every one.

pub mod keys;

use crate::{
    config::{ApiKeyConfig, AuthConfig},
    domain::Headers,
};
use keys::{KeyRecord, KeyStore};
use sha2::{Digest, Sha256};
use std::{
    collections::BTreeSet,
    sync::{Arc, RwLock},
};
use subtle::ConstantTimeEq;

pub use crate::domain::Role;

/// The teams a key may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeamScope {
    /// Any team (trusted internal services), written `*`.
    All,
    /// These teams only.
    Only(BTreeSet<String>),
}

impl TeamScope {
    /// From a list of team IDs where `*` means every team.
    pub fn from_list<I: IntoIterator<Item = S>, S: AsRef<str>>(teams: I) -> Self {
        let mut set = BTreeSet::new();
        for t in teams {
            let t = t.as_ref().trim();
            if t == "*" {
                return TeamScope::All;
            }
            if !t.is_empty() {
                set.insert(t.to_owned());
            }
        }
        TeamScope::Only(set)
    }

    /// True when `team` is in scope.
    pub fn contains(&self, team: &str) -> bool {
        match self {
            TeamScope::All => true,
            TeamScope::Only(set) => set.contains(team),
        }
    }

    /// The one team of a scope of exactly one.
    pub fn single(&self) -> Option<String> {
        match self {
            TeamScope::Only(set) if set.len() == 1 => set.iter().next().cloned(),
            _ => None,
        }
    }

    /// Comma-separated, `*` for all (database and CLI form).
    pub fn to_list_string(&self) -> String {
        match self {
            TeamScope::All => "*".into(),
            TeamScope::Only(set) => set.iter().cloned().collect::<Vec<_>>().join(","),
        }
    }
}

/// The authenticated caller, put in the request extensions by the interceptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's name (audit trail, logs); never the key.
    pub name: String,
    /// Teams it may act for.
    pub teams: TeamScope,
    /// What it may do.
    pub role: Role,
}

impl Principal {
    /// Stands for every caller while authentication is off: the service trusts its network.
    pub fn unauthenticated() -> Self {
        Self {
            name: "anonymous".into(),
            teams: TeamScope::All,
            role: Role::Admin,
        }
    }

    /// Whether this principal may act for `team`.
    pub fn may_act_for(&self, team: &str) -> bool {
        self.teams.contains(team)
    }

    /// Whether this principal may administer `team`'s prompts (`None`: the global ones, which
    /// need every team).
    pub fn may_administer(&self, team: Option<&str>) -> bool {
        self.role == Role::Admin
            && match team {
                Some(team) => self.may_act_for(team),
                None => self.teams == TeamScope::All,
            }
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer …` or `x-api-key` metadata.
    #[error("an API key is required (authorization: Bearer <key>, or x-api-key)")]
    Missing,
    /// A key that matches no active key.
    #[error("the API key is not valid")]
    Invalid,
}

struct KnownKey {
    hash: [u8; 32],
    principal: Principal,
}

/// Checks presented keys against the configured and stored hashes.
#[derive(Clone)]
pub struct Authenticator {
    enabled: bool,
    from_config: Arc<Vec<KnownKey>>,
    from_store: Arc<RwLock<Vec<KnownKey>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("enabled", &self.enabled)
            .field("config_keys", &self.from_config.len())
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// From the `[auth]` config (hashes were validated at load).
    pub fn new(config: &AuthConfig) -> Self {
        let from_config = config.keys.iter().filter_map(known_from_config).collect();
        Self {
            enabled: config.enabled,
            from_config: Arc::new(from_config),
            from_store: Arc::default(),
        }
    }

    /// Whether keys are required.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Replaces the database keys with `records` (active ones only).
    pub fn set_stored(&self, records: Vec<KeyRecord>) {
        let keys = records
            .into_iter()
            .filter(|r| r.revoked_at_ms.is_none())
            .filter_map(|r| {
                Some(KnownKey {
                    hash: keys::parse_hash(&r.key_sha256)?,
                    principal: Principal {
                        name: r.name,
                        teams: TeamScope::from_list(r.teams.split(',')),
                        role: Role::parse(&r.role)?,
                    },
                })
            })
            .collect();
        // A poisoned lock still holds a whole Vec: a writer can only panic around the swap.
        *self.from_store.write().unwrap_or_else(|p| p.into_inner()) = keys;
    }

    /// Reloads the database keys.
    pub async fn refresh(&self, store: &KeyStore) -> Result<(), crate::store::StoreError> {
        let records = store.list().await?;
        self.set_stored(records);
        Ok(())
    }

    /// The principal behind the request's key, or [`Principal::unauthenticated`] with auth off.
    pub fn authenticate(&self, metadata: &impl Headers) -> Result<Principal, AuthError> {
        if !self.enabled {
            return Ok(Principal::unauthenticated());
        }
        let key = presented_key(metadata).ok_or(AuthError::Missing)?;
        self.by_hash(&Self::hash(key)).ok_or(AuthError::Invalid)
    }

    /// The SHA-256 of a presented key, as keys are stored.
    pub fn hash(key: &str) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }

    /// The active key with SHA-256 `hash`, read afresh (a revoked key is gone
    /// at the next refresh): the console's session names its key this way.
    pub fn by_hash(&self, hash: &[u8; 32]) -> Option<Principal> {
        let stored = self.from_store.read().unwrap_or_else(|p| p.into_inner());
        // No early exit: the time taken must not say which key matched.
        let mut found = None;
        for known in self.from_config.iter().chain(stored.iter()) {
            if bool::from(known.hash.ct_eq(hash)) && found.is_none() {
                found = Some(&known.principal);
            }
        }
        found.cloned()
    }
}

fn known_from_config(key: &ApiKeyConfig) -> Option<KnownKey> {
    Some(KnownKey {
        hash: keys::parse_hash(&key.sha256)?,
        principal: Principal {
            name: key.name.clone(),
            teams: TeamScope::from_list(&key.teams),
            role: key.role,
        },
    })
}

fn presented_key(metadata: &impl Headers) -> Option<&str> {
    if let Some(Ok(value)) = metadata.text("authorization") {
        let (scheme, rest) = value.trim().split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| rest.trim())
            .filter(|k| !k.is_empty());
    }
    metadata
        .text("x-api-key")
        .and_then(Result::ok)
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn config(keys: Vec<ApiKeyConfig>) -> AuthConfig {
        AuthConfig {
            enabled: true,
            keys,
            ..AuthConfig::default()
        }
    }

    fn md(name: &'static str, value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(name, value.parse().unwrap());
        m
    }

    #[test]
    fn keys_are_matched_by_hash_from_either_header() {
        let auth = Authenticator::new(&config(vec![ApiKeyConfig {
            name: "svc".into(),
            sha256: keys::hash_hex("s3cret-key"),
            teams: vec!["t1".into(), "t2".into()],
            role: Role::Caller,
        }]));
        let p = auth
            .authenticate(&md("authorization", "Bearer s3cret-key"))
            .unwrap();
        assert_eq!(p.name, "svc");
        assert!(p.may_act_for("t2") && !p.may_act_for("t3"));
        assert!(!p.may_administer(Some("t1")));
        assert_eq!(auth.authenticate(&md("x-api-key", "s3cret-key")), Ok(p));
        assert_eq!(
            auth.authenticate(&md("authorization", "Bearer wrong")),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            auth.authenticate(&md("authorization", "Basic s3cret-key")),
            Err(AuthError::Missing)
        );
        assert_eq!(
            auth.authenticate(&MetadataMap::new()),
            Err(AuthError::Missing)
        );
    }

    #[test]
    fn stored_keys_are_replaced_and_revoked_ones_ignored() {
        let auth = Authenticator::new(&config(vec![]));
        let record = |name: &str, key: &str, revoked: Option<i64>| KeyRecord {
            name: name.into(),
            key_sha256: keys::hash_hex(key),
            teams: "*".into(),
            role: "admin".into(),
            created_at_ms: 0,
            revoked_at_ms: revoked,
        };
        auth.set_stored(vec![record("a", "ka", None), record("b", "kb", Some(1))]);
        let a = auth.authenticate(&md("x-api-key", "ka")).unwrap();
        assert!(a.may_administer(None));
        assert_eq!(
            auth.authenticate(&md("x-api-key", "kb")),
            Err(AuthError::Invalid)
        );
        auth.set_stored(vec![]);
        assert_eq!(
            auth.authenticate(&md("x-api-key", "ka")),
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn disabled_auth_trusts_every_caller() {
        let auth = Authenticator::new(&AuthConfig::default());
        let p = auth.authenticate(&MetadataMap::new()).unwrap();
        assert!(p.may_act_for("anyone") && p.may_administer(None));
    }

    #[test]
    fn team_scopes_parse_star_and_lists() {
        assert_eq!(TeamScope::from_list(["t1", "*"]), TeamScope::All);
        let s = TeamScope::from_list(" a , b ".split(','));
        assert_eq!(s.to_list_string(), "a,b");
    }
}
