//! The versioned prompt store (`ai_prompts`). (team, key) resolves to the team's active version,
//! else the global (`team_id = ''`) one, else the built-in (version 0); the database allows one
//! active version per (team, key). Resolutions are cached: this process's changes invalidate the
//! cache at once, other replicas' within [`CACHE_TTL`].

mod sql;

pub use super::cache::CACHE_TTL;
use super::{Prompt, builtin, cache::PromptCache, check::check, template};
use crate::store::{Store, StoreError};
use std::sync::{Arc, Mutex};

/// A prompt store failure.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The template does not parse.
    #[error("user_prompt_template: {0}")]
    Template(#[from] template::TemplateError),
    /// The version to activate does not exist.
    #[error("no version {version} of prompt `{key}` for {}", owner_label(team))]
    NoSuchVersion {
        /// Team ('' = global).
        team: String,
        /// Key.
        key: String,
        /// Version.
        version: u32,
    },
    /// A field is unusable.
    #[error("{field}: {why}")]
    Invalid {
        /// Field.
        field: &'static str,
        /// Why.
        why: String,
    },
    /// Activation would leave an agent using it as layer 2 no room in its window (SPEC §11.5).
    #[error("{0}")]
    ExceedsWindow(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks a system prompt about to become active (`key`, `system`); `Err` says why not. Set by
/// the composition root, which knows the agents using each key.
pub type ActivationCheck = Arc<dyn Fn(&str, &str) -> Result<(), String> + Send + Sync>;

/// Checks a new version's model override (`key`, `model`); `Err` says why it cannot be used.
pub type ModelCheck = Arc<dyn Fn(&str, &str) -> Result<(), String> + Send + Sync>;

fn owner_label(team: &str) -> String {
    if team.is_empty() {
        "the global default".to_owned()
    } else {
        format!("team `{team}`")
    }
}

/// A stored prompt version with its stats.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPrompt {
    /// Team ('' = global default).
    pub team_id: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Active version of its (team, key).
    pub is_active: bool,
    /// Calls served with it.
    pub usage_count: i64,
    /// Mean latency of those calls, ms.
    pub avg_latency_ms: f64,
    /// Share of those calls that succeeded.
    pub success_rate: f64,
    /// Creation time, unix ms.
    pub created_at_ms: i64,
    /// Who created it.
    pub created_by: String,
}

/// A new version to add.
#[derive(Debug, Clone, Default)]
pub struct NewPrompt {
    /// Team ('' = global default).
    pub team_id: String,
    /// Key (a task name).
    pub key: String,
    /// System prompt (may use `{{variables}}`).
    pub system: String,
    /// User message template.
    pub user_template: String,
    /// Model override for the primary target.
    pub model: Option<String>,
    /// Temperature override.
    pub temperature: Option<f32>,
    /// Output cap override.
    pub max_tokens: Option<u32>,
    /// Activate it right away.
    pub activate: bool,
}

/// The prompt tables' operations (implemented per backend in `sql`).
#[async_trait::async_trait]
pub trait PromptRepository: Send + Sync + std::fmt::Debug {
    /// The active version of `key` for `team`, else the global one; `None` when neither exists.
    async fn resolve(&self, team: &str, key: &str) -> Result<Option<StoredPrompt>, StoreError>;

    /// The system prompt and model override of one version, when it exists.
    async fn version(
        &self,
        team: &str,
        key: &str,
        version: u32,
    ) -> Result<Option<(String, Option<String>)>, StoreError>;

    /// Adds the next version of (team, key) in one write transaction, with its trail entries
    /// and, when `new.activate`, its audit log event; returns its number.
    async fn add(&self, new: &NewPrompt, actor: &str, now_ms: i64) -> Result<i64, StoreError>;

    /// Makes `version` the active one of (team, key) in one write transaction, with its trail
    /// entry and audit log event; false (nothing written) when the version does not exist.
    async fn activate(
        &self,
        team: &str,
        key: &str,
        version: u32,
        actor: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Every version, optionally filtered by team and key.
    async fn list(
        &self,
        team: Option<&str>,
        key: Option<&str>,
    ) -> Result<Vec<StoredPrompt>, StoreError>;

    /// The audit trail of (team, key): `(at_ms, actor, action, version)`.
    async fn audit_trail(
        &self,
        team: &str,
        key: &str,
    ) -> Result<Vec<(i64, String, String, i64)>, StoreError>;
}

/// The store, with a small resolution cache.
#[derive(Clone)]
pub struct PromptStore {
    store: Store,
    cache: Arc<Mutex<PromptCache>>,
    check: Option<ActivationCheck>,
    model_check: Option<ModelCheck>,
    max_text_bytes: usize,
}

impl PromptStore {
    /// A store over `store`.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            cache: Arc::default(),
            check: None,
            model_check: None,
            max_text_bytes: usize::MAX,
        }
    }

    /// Refuses versions whose system prompt and template hold more than `bytes` besides their
    /// variables (`server.max_prompt_bytes`): they could serve no call.
    pub fn with_max_text_bytes(mut self, bytes: usize) -> Self {
        self.max_text_bytes = bytes;
        self
    }

    /// Refuses a new version whose model override `check` refuses.
    pub fn with_model_check(mut self, check: ModelCheck) -> Self {
        self.model_check = Some(check);
        self
    }

    /// Refuses to activate a version `check` refuses.
    pub fn with_activation_check(mut self, check: ActivationCheck) -> Self {
        self.check = Some(check);
        self
    }

    fn model_may_serve(&self, key: &str, model: Option<&str>) -> Result<(), PromptError> {
        match (&self.model_check, model.filter(|m| !m.is_empty())) {
            (Some(check), Some(model)) => check(key, model).map_err(|why| PromptError::Invalid {
                field: "model",
                why,
            }),
            _ => Ok(()),
        }
    }

    /// The activation check, on a blocking thread (it may count tokens), never in a transaction.
    async fn may_activate(&self, key: &str, system: &str) -> Result<(), PromptError> {
        let Some(check) = self.check.clone() else {
            return Ok(());
        };
        let (key, system) = (key.to_owned(), system.to_owned());
        match tokio::task::spawn_blocking(move || check(&key, &system)).await {
            Ok(checked) => checked.map_err(PromptError::ExceedsWindow),
            // A panic in the check is a bug: it unwinds as it would inline.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, PromptCache> {
        // Plain data: a poisoned lock is still consistent.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prompt to use for `key` on behalf of `team`.
    pub async fn resolve(&self, team: &str, key: &str) -> Result<Prompt, PromptError> {
        let cache_key = (team.to_owned(), key.to_owned());
        if let Some(prompt) = self.cache().fresh(&cache_key) {
            return Ok(prompt);
        }
        let stored = sql::repository(&self.store).resolve(team, key).await?;
        let prompt = stored.map_or_else(|| builtin(key), |s| s.prompt);
        self.cache().insert(cache_key, prompt.clone());
        Ok(prompt)
    }

    /// Adds the next version of (team, key); returns its number.
    pub async fn add(&self, new: NewPrompt, actor: &str, now_ms: i64) -> Result<u32, PromptError> {
        let text_bytes = template::literal_len(&new.system)
            .saturating_add(template::literal_len(&new.user_template));
        if text_bytes > self.max_text_bytes {
            return Err(PromptError::Invalid {
                field: "user_prompt_template",
                why: format!(
                    "the system prompt and template hold {text_bytes} bytes besides their \
                     variables; a rendered prompt may be at most {} (server.max_prompt_bytes)",
                    self.max_text_bytes
                ),
            });
        }
        check(&new)?;
        self.model_may_serve(&new.key, new.model.as_deref())?;
        if new.activate {
            self.may_activate(&new.key, &new.system).await?;
        }
        let version = sql::repository(&self.store)
            .add(&new, actor, now_ms)
            .await?;
        self.cache().remove(&(new.team_id.clone(), new.key.clone()));
        if new.team_id.is_empty() {
            self.cache().clear();
        }
        Ok(u32::try_from(version).unwrap_or(u32::MAX))
    }

    /// Makes `version` the active one of (team, key).
    pub async fn activate(
        &self,
        team: &str,
        key: &str,
        version: u32,
        actor: &str,
        now_ms: i64,
    ) -> Result<(), PromptError> {
        let missing = || PromptError::NoSuchVersion {
            team: team.to_owned(),
            key: key.to_owned(),
            version,
        };
        // A version never changes: checked before the write lock, its model too, as it may
        // predate the model check.
        let repository = sql::repository(&self.store);
        let stored = repository.version(team, key, version).await?;
        let (system, model) = stored.ok_or_else(missing)?;
        self.model_may_serve(key, model.as_deref())?;
        self.may_activate(key, &system).await?;
        if !repository
            .activate(team, key, version, actor, now_ms)
            .await?
        {
            return Err(missing());
        }
        if team.is_empty() {
            self.cache().clear();
        } else {
            self.cache().remove(&(team.to_owned(), key.to_owned()));
        }
        Ok(())
    }

    /// Every version, optionally filtered by team and key.
    pub async fn list(
        &self,
        team: Option<&str>,
        key: Option<&str>,
    ) -> Result<Vec<StoredPrompt>, PromptError> {
        Ok(sql::repository(&self.store).list(team, key).await?)
    }

    /// The audit trail of (team, key): `(at_ms, actor, action, version)`.
    pub async fn audit_trail(
        &self,
        team: &str,
        key: &str,
    ) -> Result<Vec<(i64, String, String, i64)>, PromptError> {
        Ok(sql::repository(&self.store).audit_trail(team, key).await?)
    }
}

/// The audit log's `prompt.activated` event (global prompts are team `''`'s chain).
fn activated(
    team: &str,
    key: &str,
    version: i64,
    actor: &str,
    now_ms: i64,
) -> crate::audit::AuditEvent {
    let mut e = crate::audit::AuditEvent::new(
        team,
        actor,
        "",
        crate::audit::Category::Prompt,
        "prompt.activated",
        &format!("{key}/{version}"),
    )
    .decided("ok", "");
    e.at_ms = now_ms;
    e
}
