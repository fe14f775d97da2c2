//! The runtime registry (SPEC §16): http and task tools registered over
//! `ToolAdmin`, stored in the database and loaded by every replica at each
//! refresh. A row holds the tool's config shape (the keys of a
//! `[tools."<name>"]` section) as JSON, checked like the config file's at
//! registration and again by each replica that loads it.

use super::{Registry, Source, Tool, configured_tool, sql};
use crate::{
    config::{Config, Secret, ToolConfig, ToolKind},
    store::{Statement, Store, StoreError},
};
use std::{collections::BTreeMap, sync::Arc, sync::Mutex};

/// One registered tool version, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTool {
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// The config shape, as registered (secrets are environment variable names).
    pub config: serde_json::Value,
    /// SHA-256 of `config`'s canonical JSON: a repeated registration matches it.
    pub config_sha256: String,
    pub enabled: bool,
    /// Why it was disabled; empty while enabled.
    pub disabled_reason: String,
    pub deprecated: bool,
    /// `name@version` to use instead, when deprecated with one.
    pub replacement: String,
    /// The principal that registered it.
    pub registered_by: String,
    /// The principal of the last change.
    pub changed_by: String,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms of the last change.
    pub updated_at_ms: i64,
}

impl StoredTool {
    /// `name@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Whether `other` builds the same tool (only who and when differ).
    fn same_tool(&self, other: &StoredTool) -> bool {
        self.config_sha256 == other.config_sha256
            && self.enabled == other.enabled
            && self.disabled_reason == other.disabled_reason
            && self.deprecated == other.deprecated
            && self.replacement == other.replacement
    }
}

/// Reads of the `tool_registry` table.
#[async_trait::async_trait]
pub trait ToolRegistryRepository: Send + Sync {
    /// Every row, by name then version.
    async fn all(&self) -> Result<Vec<StoredTool>, StoreError>;
    /// One version.
    async fn get(&self, name: &str, version: &str) -> Result<Option<StoredTool>, StoreError>;
    /// Every version of `name`.
    async fn versions(&self, name: &str) -> Result<Vec<StoredTool>, StoreError>;
}

/// Every registered tool version.
pub async fn all(store: &Store) -> Result<Vec<StoredTool>, StoreError> {
    sql::repository(store).all().await
}

/// Version `version` of `name`, if registered.
pub async fn get(
    store: &Store,
    name: &str,
    version: &str,
) -> Result<Option<StoredTool>, StoreError> {
    sql::repository(store).get(name, version).await
}

/// Every registered version of `name`.
pub async fn versions(store: &Store, name: &str) -> Result<Vec<StoredTool>, StoreError> {
    sql::repository(store).versions(name).await
}

/// The statement storing `tool` (no row changed when its version is taken).
pub fn register(tool: &StoredTool) -> Statement {
    sql::register(tool)
}

/// The statement disabling (with `reason`) or enabling (`None`) `name`'s
/// `version`, or all its versions when `version` is empty.
pub fn set_enabled(
    name: &str,
    version: &str,
    reason: Option<&str>,
    by: &str,
    now: i64,
) -> Statement {
    sql::set_enabled(name, version, reason, by, now)
}

/// The statement deprecating `name@version` in favour of `replacement`.
pub fn deprecate(name: &str, version: &str, replacement: &str, by: &str, now: i64) -> Statement {
    sql::deprecate(name, version, replacement, by, now)
}

/// The tool config a registration or a row holds, with its secrets read from
/// `env`: refused (with the field and why) when it does not parse, is not
/// an http or task tool, or names a variable `env` lacks.
pub fn tool_config(
    value: &serde_json::Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ToolConfig, (String, String)> {
    let mut t: ToolConfig =
        serde_json::from_value(value.clone()).map_err(|e| ("config".to_owned(), e.to_string()))?;
    if t.kind == ToolKind::Builtin {
        let why = "only http and task tools are registered at run time";
        return Err(("config.kind".into(), why.into()));
    }
    let secret = |field: &str, var: &Option<String>| -> Result<Option<Secret>, (String, String)> {
        let Some(var) = var else { return Ok(None) };
        match env(var) {
            Some(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
            _ => Err((
                format!("config.{field}"),
                format!("environment variable {var} is not set on this replica"),
            )),
        }
    };
    t.auth_value = secret("auth_env", &t.auth_env)?;
    t.callback_secret = secret("callback_secret_env", &t.callback_secret_env)?;
    Ok(t)
}

/// Builds the tool of `row` under `config`: checked as a config file's tool
/// would be, its timeout capped at `[tool_limits] max_timeout`.
pub fn build(
    row: &StoredTool,
    config: &Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Tool, String> {
    let key = row.id();
    let mut t = tool_config(&row.config, env).map_err(|(field, why)| format!("{field}: {why}"))?;
    t.version = Some(row.version.clone());
    t.timeout = t.timeout.min(config.tool_limits.max_timeout);
    let problems = crate::config::runtime_tool(&key, &t, config);
    if let Some((field, why)) = problems.into_iter().next() {
        return Err(format!("{field}: {why}"));
    }
    let mut tool = configured_tool(&key, &t)?;
    tool.enabled = row.enabled;
    tool.disabled_reason.clone_from(&row.disabled_reason);
    tool.deprecated = row.deprecated;
    tool.replacement.clone_from(&row.replacement);
    tool.source = Source::Registry;
    Ok(tool)
}

/// A row as last loaded, and its tool unless it failed to build.
type Loaded = (StoredTool, Option<Arc<Tool>>);

/// Loads the runtime registry's rows into a [`Registry`], building only the
/// rows that changed since the last load (schemas compile once).
#[derive(Debug, Default)]
pub struct Loader {
    /// By `name@version`.
    built: Mutex<BTreeMap<String, Loaded>>,
}

impl Loader {
    /// Replaces `registry`'s stored tier with `rows`. A row that does not
    /// build here (a task gone from the config, a variable this replica
    /// lacks) is left out, logged once until it changes.
    pub fn load(
        &self,
        registry: &Registry,
        rows: Vec<StoredTool>,
        config: &Config,
        env: &dyn Fn(&str) -> Option<String>,
    ) {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = BTreeMap::new();
        for row in rows {
            let id = row.id();
            let tool = match built.remove(&id).filter(|(prev, _)| prev.same_tool(&row)) {
                Some((_, tool)) => tool,
                None if registry.is_fixed(&row.name) => {
                    tracing::warn!(tool = %id, "a registered tool is shadowed by the config file's tool of the same name");
                    None
                }
                None => build(&row, config, env)
                    .inspect_err(|e| {
                        tracing::error!(tool = %id, error = %e, "a registered tool cannot be loaded on this replica; it is left out");
                    })
                    .ok()
                    .map(Arc::new),
            };
            next.insert(id, (row, tool));
        }
        registry.set_stored(next.values().filter_map(|(_, t)| t.clone()).collect());
        *built = next;
    }

    /// Whether `id` (`name@version`) is registered but did not load here.
    pub fn is_unloadable(&self, id: &str) -> bool {
        let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        built.get(id).is_some_and(|(_, tool)| tool.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(name: &str, config: serde_json::Value) -> StoredTool {
        StoredTool {
            name: name.into(),
            version: "1.0.0".into(),
            config_sha256: crate::audit::digest::sha256_hex(config.to_string().as_bytes()),
            config,
            enabled: true,
            disabled_reason: String::new(),
            deprecated: false,
            replacement: String::new(),
            registered_by: "ops".into(),
            changed_by: "ops".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
        }
    }

    fn webhook() -> serde_json::Value {
        json!({"kind": "http", "url": "https://n8n.example.com/webhook/x", "timeout": "10m"})
    }

    #[test]
    fn a_load_rebuilds_only_changed_rows_and_leaves_out_what_does_not_build() {
        let config = Config::from_toml_str("", |_| None).unwrap();
        let registry = Registry::from_config(&config).unwrap();
        let loader = Loader::default();
        let broken = row("crm.brief", json!({"kind": "task", "task": "no_such_task"}));
        let no_env = row(
            "crm.secret",
            json!({"kind": "http", "url": "https://h/x", "auth_header": "X-Key", "auth_env": "K"}),
        );
        loader.load(
            &registry,
            vec![row("crm.sync", webhook()), broken, no_env],
            &config,
            &|_| None,
        );
        let first = registry.lookup("crm.sync").unwrap();
        assert_eq!(first.source, Source::Registry);
        // Capped at [tool_limits] max_timeout, as a config file's tool would be.
        assert_eq!(first.timeout, config.tool_limits.max_timeout);
        assert!(registry.lookup("crm.brief").is_err());
        assert!(registry.lookup("crm.secret").is_err());

        let mut stamped = row("crm.sync", webhook());
        stamped.updated_at_ms = 2;
        stamped.changed_by = "someone".into();
        loader.load(&registry, vec![stamped.clone()], &config, &|_| None);
        assert!(Arc::ptr_eq(&first, &registry.lookup("crm.sync").unwrap()));

        stamped.enabled = false;
        stamped.disabled_reason = "paused".into();
        loader.load(&registry, vec![stamped], &config, &|_| None);
        let disabled = registry.lookup("crm.sync").unwrap();
        assert_eq!(
            (disabled.enabled, disabled.disabled_reason.as_str()),
            (false, "paused")
        );

        loader.load(&registry, Vec::new(), &config, &|_| None);
        assert!(registry.lookup("crm.sync").is_err());
    }

    #[test]
    fn a_config_file_tool_of_the_same_name_shadows_a_registered_one() {
        let toml = "[tools.\"crm.sync\"]\nkind = \"http\"\nurl = \"https://cfg/x\"\n";
        let config = Config::from_toml_str(toml, |_| None).unwrap();
        let registry = Registry::from_config(&config).unwrap();
        Loader::default().load(
            &registry,
            vec![row("crm.sync", webhook())],
            &config,
            &|_| None,
        );
        let tool = registry.lookup("crm.sync").unwrap();
        assert_eq!(tool.source, Source::Config);
        assert_eq!(
            registry
                .all()
                .iter()
                .filter(|t| t.name == "crm.sync")
                .count(),
            1
        );
    }
}
