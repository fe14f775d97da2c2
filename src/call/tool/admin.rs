//! The runtime tool registry (SPEC §16), for `ToolAdmin` and any other
//! edge: http and task tools registered, disabled (with a reason), enabled
//! and deprecated without a deploy. Each change is one ledger transaction
//! with its audit event (team '' chain), seen at once by this replica and
//! by the others at their next refresh. Tools of the config file and the
//! built-ins are read-only.

use super::super::Pipeline;
use crate::{
    audit::{AuditEvent, Category, digest},
    auth::{Principal, TeamScope},
    store::Statement,
    tools::{
        Tool,
        policy::grants,
        registry::{
            Source,
            stored::{self, StoredTool},
        },
    },
};
use semver::Version;
use serde_json::Value;
use std::time::Duration;
use tokio::sync::watch;

/// The capability every change and listing needs.
pub const MANAGE: &str = "workflow:manage";

/// Why a registry change or listing was refused.
#[derive(Debug, thiserror::Error)]
pub enum ToolAdminError {
    /// The caller's role lacks `workflow:manage`.
    #[error("the key's role lacks the capability {MANAGE}")]
    CapabilityMissing,
    /// The caller acts for only some teams.
    #[error("a registered tool serves every team: the key must act for all teams (\"*\")")]
    AllTeamsRequired,
    /// A built-in's or the config file's tool.
    #[error("`{0}` is declared in the config file (or built in): it cannot be changed at run time")]
    ReadOnly(String),
    /// Fields that cannot be used: `(field, why)` each.
    #[error("invalid request")]
    Invalid(Vec<(String, String)>),
    /// No such registered tool or version.
    #[error("no registered tool `{0}`")]
    NotFound(String),
    /// The version is registered with another config: versions never change.
    #[error("`{0}` is already registered with another config; register a new version")]
    VersionExists(String),
    /// The store failed.
    #[error("storage: {0}")]
    Storage(String),
}

impl ToolAdminError {
    /// The stable reason (`ErrorInfo.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            ToolAdminError::CapabilityMissing => "CAPABILITY_MISSING",
            ToolAdminError::AllTeamsRequired => "ADMIN_REQUIRED",
            ToolAdminError::ReadOnly(_) => "TOOL_READ_ONLY",
            ToolAdminError::Invalid(_) => "INVALID_INPUT",
            ToolAdminError::NotFound(_) => "TOOL_NOT_FOUND",
            ToolAdminError::VersionExists(_) => "TOOL_VERSION_EXISTS",
            ToolAdminError::Storage(_) => "STORAGE_UNAVAILABLE",
        }
    }
}

fn invalid(field: &str, why: impl Into<String>) -> ToolAdminError {
    ToolAdminError::Invalid(vec![(field.to_owned(), why.into())])
}

fn storage(e: impl std::fmt::Display) -> ToolAdminError {
    ToolAdminError::Storage(e.to_string())
}

/// Most bytes of a disable reason.
const MAX_REASON: usize = 1024;

/// One version of a tool as an admin sees it.
#[derive(Debug, Clone)]
pub struct ToolVersion {
    pub name: String,
    pub version: String,
    /// `builtin`, `http`, `mcp` or `task`; a registered row that does not
    /// load here reads its stored kind.
    pub kind: String,
    pub source: Source,
    pub enabled: bool,
    pub disabled_reason: String,
    pub deprecated: bool,
    pub replacement: String,
    /// The registered row (registry tools only).
    pub stored: Option<StoredTool>,
    /// Whether this replica has it loaded (callable here now).
    pub loaded: bool,
}

impl ToolVersion {
    fn of_tool(tool: &Tool) -> Self {
        Self {
            name: tool.name.clone(),
            version: tool.version.to_string(),
            kind: tool.kind.as_str().to_owned(),
            source: tool.source,
            enabled: tool.enabled,
            disabled_reason: tool.disabled_reason.clone(),
            deprecated: tool.deprecated,
            replacement: tool.replacement.clone(),
            stored: None,
            loaded: true,
        }
    }

    fn of_row(row: StoredTool, loaded: bool) -> Self {
        let kind = row.config.get("kind").and_then(Value::as_str).unwrap_or("");
        Self {
            name: row.name.clone(),
            version: row.version.clone(),
            kind: kind.to_owned(),
            source: Source::Registry,
            enabled: row.enabled,
            disabled_reason: row.disabled_reason.clone(),
            deprecated: row.deprecated,
            replacement: row.replacement.clone(),
            stored: Some(row),
            loaded,
        }
    }
}

/// A registration as asked for.
#[derive(Debug, Clone)]
pub struct Registration {
    pub name: String,
    pub version: String,
    /// The config shape (`[tools."<name>"]`'s keys) as JSON.
    pub config: Value,
}

/// The environment registered tools read their secrets from.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn parse_version(field: &str, v: &str) -> Result<Version, ToolAdminError> {
    if v.is_empty() {
        return Err(invalid(field, "is required"));
    }
    Version::parse(v).map_err(|_| invalid(field, "must be a semantic version (1.2.0)"))
}

impl Pipeline {
    /// Refuses `principal` unless its role holds `workflow:manage` and it
    /// acts for every team: a registered tool serves them all.
    fn check_manage(&self, principal: &Principal) -> Result<(), ToolAdminError> {
        let capabilities = self.config().auth.capabilities(principal.role.as_str());
        if !capabilities.iter().any(|p| grants(p, MANAGE)) {
            return Err(ToolAdminError::CapabilityMissing);
        }
        if principal.teams != TeamScope::All {
            return Err(ToolAdminError::AllTeamsRequired);
        }
        Ok(())
    }

    /// Refuses a name of the config file or a built-in.
    fn check_writable(&self, name: &str) -> Result<(), ToolAdminError> {
        if name.is_empty() {
            return Err(invalid("name", "is required"));
        }
        if self.toolbox().registry.is_fixed(name) {
            return Err(ToolAdminError::ReadOnly(name.to_owned()));
        }
        Ok(())
    }

    /// Reloads after this replica's own change: the change is stored and
    /// audited already, so a failed reload is logged (the refresher retries),
    /// never answered as a failure that a retry would repeat.
    async fn reload_after_change(&self) {
        if let Err(e) = self.refresh_tools().await {
            tracing::error!(error = %e, "reloading the registered tools after a change failed");
        }
    }

    /// Reloads the registered tools from the store into this replica's registry.
    pub async fn refresh_tools(&self) -> Result<(), crate::store::StoreError> {
        let toolbox = self.toolbox();
        let _one_at_a_time = toolbox.reload.lock().await;
        let rows = stored::all(self.store()).await?;
        toolbox
            .loader
            .load(&toolbox.registry, rows, self.config(), &env);
        Ok(())
    }

    /// Registers a new http or task tool version, checked as the config
    /// file's tools are. The same registration again is answered with the
    /// stored version; another config for a taken version is refused.
    pub async fn register_tool(
        &self,
        principal: &Principal,
        trace_id: &str,
        reg: Registration,
    ) -> Result<ToolVersion, ToolAdminError> {
        self.check_manage(principal)?;
        if reg.name.contains('@') {
            return Err(invalid("name", "has no `@`: the version goes in `version`"));
        }
        self.check_writable(&reg.name)?;
        let version = parse_version("version", &reg.version)?.to_string();
        let mut t = stored::tool_config(&reg.config, &env)
            .map_err(|(field, why)| ToolAdminError::Invalid(vec![(field, why)]))?;
        if t.version.as_ref().is_some_and(|v| *v != version) {
            return Err(invalid(
                "config.version",
                "differs from the request's version",
            ));
        }
        t.version = Some(version.clone());
        t.timeout = t.timeout.min(self.config().tool_limits.max_timeout);
        let key = format!("{}@{version}", reg.name);
        let problems = crate::config::runtime_tool(&key, &t, self.config());
        if !problems.is_empty() {
            return Err(ToolAdminError::Invalid(problems));
        }
        let now = now_ms();
        let row = StoredTool {
            name: reg.name.clone(),
            version: version.clone(),
            config_sha256: digest::sha256_hex(&digest::canonical(&reg.config)),
            config: reg.config,
            enabled: true,
            disabled_reason: String::new(),
            deprecated: false,
            replacement: String::new(),
            registered_by: principal.name.clone(),
            changed_by: principal.name.clone(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        // Compiles its schemas as every replica will: refused here, not left out there.
        stored::build(&row, self.config(), &env).map_err(|e| invalid("config", e))?;
        let event = self
            .registry_event(principal, trace_id, "tool.registered", &key, "")
            .with_input(&row.config);
        let stored_now = self.write_registry(stored::register(&row), event).await?;
        let Some(found) = stored::get(self.store(), &reg.name, &version)
            .await
            .map_err(storage)?
        else {
            return Err(ToolAdminError::Storage(format!(
                "{key} vanished after its registration"
            )));
        };
        if !stored_now && found.config_sha256 != row.config_sha256 {
            return Err(ToolAdminError::VersionExists(key));
        }
        self.reload_after_change().await;
        let loaded = self.toolbox().registry.lookup(&key).is_ok();
        Ok(ToolVersion::of_row(found, loaded))
    }

    /// Disables `name`'s `version` (every version when empty) with `reason`,
    /// which later TOOL_DISABLED denials carry.
    pub async fn disable_tool(
        &self,
        principal: &Principal,
        trace_id: &str,
        name: &str,
        version: &str,
        reason: &str,
    ) -> Result<Vec<ToolVersion>, ToolAdminError> {
        self.check_manage(principal)?;
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(invalid("reason", "is required"));
        }
        if reason.len() > MAX_REASON {
            return Err(invalid("reason", format!("is over {MAX_REASON} bytes")));
        }
        self.set_enabled(principal, trace_id, name, version, Some(reason))
            .await
    }

    /// Enables `name`'s `version` again (every version when empty).
    pub async fn enable_tool(
        &self,
        principal: &Principal,
        trace_id: &str,
        name: &str,
        version: &str,
    ) -> Result<Vec<ToolVersion>, ToolAdminError> {
        self.set_enabled(principal, trace_id, name, version, None)
            .await
    }

    async fn set_enabled(
        &self,
        principal: &Principal,
        trace_id: &str,
        name: &str,
        version: &str,
        reason: Option<&str>,
    ) -> Result<Vec<ToolVersion>, ToolAdminError> {
        self.check_manage(principal)?;
        self.check_writable(name)?;
        let version = match version {
            "" => String::new(),
            v => parse_version("version", v)?.to_string(),
        };
        let subject = match version.as_str() {
            "" => name.to_owned(),
            v => format!("{name}@{v}"),
        };
        let (action, why) = match reason {
            Some(why) => ("tool.disabled", why),
            None => ("tool.enabled", ""),
        };
        let event = self.registry_event(principal, trace_id, action, &subject, why);
        let statement = stored::set_enabled(name, &version, reason, &principal.name, now_ms());
        // No row changed: none is so named, or each is already so (no event then).
        if self.write_registry(statement, event).await? {
            self.reload_after_change().await;
        }
        let found = self.tool_versions(principal, name).await?;
        let registered = |v: &ToolVersion| v.source == Source::Registry;
        if !found
            .iter()
            .any(|v| registered(v) && (version.is_empty() || v.version == version))
        {
            return Err(ToolAdminError::NotFound(subject));
        }
        Ok(found)
    }

    /// Marks `name@version` deprecated: still callable, listed with
    /// `replacement` (a tool version that exists, or empty).
    pub async fn deprecate_tool(
        &self,
        principal: &Principal,
        trace_id: &str,
        name: &str,
        version: &str,
        replacement: &str,
    ) -> Result<ToolVersion, ToolAdminError> {
        self.check_manage(principal)?;
        self.check_writable(name)?;
        let version = parse_version("version", version)?.to_string();
        let subject = format!("{name}@{version}");
        let replacement = self.replacement(replacement, &subject).await?;
        let replacement = replacement.as_str();
        let event = self.registry_event(
            principal,
            trace_id,
            "tool.deprecated",
            &subject,
            replacement,
        );
        let statement = stored::deprecate(name, &version, replacement, &principal.name, now_ms());
        // No row changed: not registered (NOT_FOUND below), or already so (no event).
        if self.write_registry(statement, event).await? {
            self.reload_after_change().await;
        }
        let row = stored::get(self.store(), name, &version)
            .await
            .map_err(storage)?
            .ok_or_else(|| ToolAdminError::NotFound(subject.clone()))?;
        let loaded = self.toolbox().registry.lookup(&subject).is_ok();
        Ok(ToolVersion::of_row(row, loaded))
    }

    /// `replacement` as `name@version` (version normalised): another tool
    /// version, served here or registered (perhaps on another replica just now).
    async fn replacement(
        &self,
        replacement: &str,
        subject: &str,
    ) -> Result<String, ToolAdminError> {
        if replacement.is_empty() {
            return Ok(String::new());
        }
        let wrong = || {
            invalid(
                "replacement",
                "must name another existing tool version as name@version",
            )
        };
        let (name, version) = replacement.split_once('@').ok_or_else(wrong)?;
        let version = Version::parse(version).map_err(|_| wrong())?.to_string();
        let normal = format!("{name}@{version}");
        if normal == subject {
            return Err(wrong());
        }
        let served = self.toolbox().registry.lookup(&normal).is_ok();
        if served
            || stored::get(self.store(), name, &version)
                .await
                .map_err(storage)?
                .is_some()
        {
            Ok(normal)
        } else {
            Err(wrong())
        }
    }

    /// Every version of `name` (of every tool when empty), by name then
    /// newest version: the registered ones as stored, the rest as loaded.
    pub async fn tool_versions(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<Vec<ToolVersion>, ToolAdminError> {
        self.check_manage(principal)?;
        let registry = &self.toolbox().registry;
        let mut out: Vec<ToolVersion> = registry
            .all()
            .iter()
            .filter(|t| t.source != Source::Registry && (name.is_empty() || t.name == name))
            .map(|t| ToolVersion::of_tool(t))
            .collect();
        let rows = if name.is_empty() {
            stored::all(self.store()).await
        } else {
            stored::versions(self.store(), name).await
        }
        .map_err(storage)?;
        for row in rows {
            if registry.is_fixed(&row.name) {
                continue;
            }
            let loaded = registry.lookup(&row.id()).is_ok();
            out.push(ToolVersion::of_row(row, loaded));
        }
        let semver = |v: &str| Version::parse(v).ok();
        out.sort_by(|a, b| {
            a.name
                .cmp(&b.name)
                .then_with(|| semver(&b.version).cmp(&semver(&a.version)))
        });
        Ok(out)
    }

    fn registry_event(
        &self,
        principal: &Principal,
        trace_id: &str,
        action: &str,
        subject: &str,
        reason: &str,
    ) -> AuditEvent {
        AuditEvent::new(
            "",
            &principal.name,
            trace_id,
            Category::Tool,
            action,
            subject,
        )
        .decided("ok", reason)
    }

    /// Runs `statement` with `event` in one ledger transaction, the event
    /// appended only if the statement changed a row: true then.
    async fn write_registry(
        &self,
        statement: Statement,
        event: AuditEvent,
    ) -> Result<bool, ToolAdminError> {
        self.guarded_write("", statement, event)
            .await
            .map_err(ToolAdminError::Storage)
    }
}

/// Reloads the registered tools every `[tool_registry] refresh_interval`
/// until `stop`; a failed reload keeps the last loaded tools.
pub async fn run_refresher(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let every = pipeline
        .config()
        .tool_registry
        .refresh_interval
        .max(Duration::from_millis(10));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        if let Err(e) = pipeline.refresh_tools().await {
            tracing::error!(error = %e, "reloading the registered tools failed");
        }
    }
}
