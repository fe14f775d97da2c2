//! Tools (SPEC §9): the registry, the pure checks of the one entry point
//! (policy gate, input schema, cost estimate, quota) and the executors:
//! built-ins, webhooks (`http`), MCP servers (`mcp`). The entry point itself
//! is the pipeline's (`call::tool`): tools are metered and audited like models.

pub mod approvals;
pub mod builtin;
pub mod cost;
pub mod executor;
pub mod http;
pub mod idempotency;
pub mod invocations;
pub mod mcp;
mod mcp_limits;
pub mod policy;
pub mod quota;
pub mod registry;
pub mod schema;

pub use registry::{Callback, HttpTool, Registry, Tool};

use std::sync::Arc;

/// What the entry point runs tools with, shared by every call.
#[derive(Debug, Clone)]
pub struct Toolbox {
    pub registry: Arc<Registry>,
    pub servers: mcp::Servers,
    pub quotas: quota::Quotas,
    pub webhooks: http::Webhooks,
    /// Bad workflow callbacks audited lately.
    pub callback_denials: Arc<invocations::callbacks::Denials>,
    /// Loads the runtime registry's rows into `registry`.
    pub loader: Arc<registry::stored::Loader>,
    /// Held across a reload's read and load, so an older read never lands last.
    pub reload: Arc<tokio::sync::Mutex<()>>,
}

impl Toolbox {
    /// The tools of `config` (MCP tools join as listed), quotas shared via `cluster`.
    pub fn new(
        config: &crate::config::Config,
        cluster: Option<&crate::cluster::Cluster>,
    ) -> Result<Self, String> {
        // A redirect is the webhook's answer, not an instruction: followed, it would
        // take the auth header to another host (reqwest strips only `Authorization`)
        // and turn the POST into a bodiless GET.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(10))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("building the webhooks' HTTP client: {e}"))?;
        Ok(Self {
            registry: Arc::new(Registry::from_config(config)?),
            servers: mcp::Servers::default(),
            quotas: cluster
                .map_or_else(quota::Quotas::default, |c| quota::Quotas::shared(c.clone())),
            webhooks: http::Webhooks {
                client: http,
                public_url: config.http.as_ref().and_then(|h| h.public_url.clone()),
            },
            callback_denials: Arc::default(),
            loader: Arc::default(),
            reload: Arc::default(),
        })
    }

    /// The executor of `kind`; `None` for a task tool, which the call pipeline runs.
    pub fn executor(&self, kind: &Kind) -> Option<&dyn executor::Executor> {
        match kind {
            Kind::Builtin => Some(&builtin::Builtins),
            Kind::Http(_) => Some(&self.webhooks),
            Kind::Mcp { .. } => Some(&self.servers),
            Kind::Task(_) => None,
        }
    }

    /// Runs `run.tool` with its kind's executor.
    pub async fn run(&self, run: executor::Run<'_>) -> executor::Ran {
        match self.executor(&run.tool.kind) {
            Some(executor) => executor.run(run).await,
            None => executor::wrong_kind(run.tool, "builtin, http or mcp"),
        }
    }
}

/// How a tool runs.
#[derive(Debug, Clone)]
pub enum Kind {
    Builtin,
    Http(HttpTool),
    /// A tool of an MCP server.
    Mcp {
        /// `[mcp_servers.<server>]`.
        server: String,
        tool: String,
    },
    /// A model call: the input becomes this task's variables (SPEC §16).
    Task(String),
}

impl Kind {
    /// `builtin`, `http` or `mcp`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Builtin => "builtin",
            Kind::Http(_) => "http",
            Kind::Mcp { .. } => "mcp",
            Kind::Task(_) => "task",
        }
    }
}

/// Why the entry point refuses an invocation before running it (SPEC §9.3).
#[derive(Debug, Clone, PartialEq)]
pub enum Denial {
    /// No such tool or version.
    NotFound(String),
    /// Disabled, with the reason given at run time (empty for the config file's `enabled = false`).
    Disabled(String),
    /// The caller's role lacks the tool's capability.
    CapabilityMissing(String),
    /// A `viewer` may not run a tool with side effects.
    SideEffectsForbidden,
    /// A tenant-scoped tool without a team the caller may act for.
    TenantRequired,
    /// The input breaks the tool's schema: `(JSON pointer, what)` each.
    InputInvalid(Vec<(String, String)>),
    /// The agent that asked is not allowed the tool (its `tools` list).
    NotAgentTool,
    /// A per-team quota is full: which one, and its limit.
    Quota {
        /// `max_per_hour` or `max_concurrent`.
        limit: &'static str,
        max: u32,
    },
    /// The shared quotas' cluster store is down and `on_unavailable = "refuse"`.
    StoreUnavailable,
}

impl Denial {
    /// The stable reason (`ErrorInfo.reason`, the audit event's reason).
    pub fn reason(&self) -> &'static str {
        match self {
            Denial::NotFound(_) => "TOOL_NOT_FOUND",
            Denial::Disabled(_) => "TOOL_DISABLED",
            Denial::CapabilityMissing(_) => "CAPABILITY_MISSING",
            Denial::SideEffectsForbidden => "SIDE_EFFECTS_FORBIDDEN",
            Denial::TenantRequired => "TENANT_REQUIRED",
            Denial::InputInvalid(_) => "TOOL_INPUT_INVALID",
            Denial::Quota { .. } => "QUOTA_EXCEEDED",
            Denial::NotAgentTool => "TOOL_NOT_ALLOWED",
            Denial::StoreUnavailable => "CLUSTER_STORE_UNAVAILABLE",
        }
    }
}

/// How an invocation ended, as `ToolInvocation.status` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Accepted, not started (ASYNC).
    Pending,
    Running,
    Succeeded,
    /// Failed (including an output that breaks `output_schema`).
    Failed,
    TimedOut,
    /// Held until a person decides (SPEC §14.1); runs as ASYNC once approved.
    AwaitingApproval,
    /// Its approval was rejected or expired: it never ran.
    Rejected,
    /// A workflow accepted it and will call back with the result (SPEC §16);
    /// shown as RUNNING.
    AwaitingCallback,
}

impl Status {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Running => "RUNNING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed => "FAILED",
            Status::TimedOut => "TIMED_OUT",
            Status::AwaitingApproval => "AWAITING_APPROVAL",
            Status::Rejected => "REJECTED",
            Status::AwaitingCallback => "AWAITING_CALLBACK",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Status::Pending,
            "RUNNING" => Status::Running,
            "SUCCEEDED" => Status::Succeeded,
            "FAILED" => Status::Failed,
            "TIMED_OUT" => Status::TimedOut,
            "AWAITING_APPROVAL" => Status::AwaitingApproval,
            "REJECTED" => Status::Rejected,
            "AWAITING_CALLBACK" => Status::AwaitingCallback,
            _ => return None,
        })
    }

    /// Whether the invocation is over.
    pub fn finished(self) -> bool {
        matches!(
            self,
            Status::Succeeded | Status::Failed | Status::TimedOut | Status::Rejected
        )
    }
}

/// Why a started invocation failed: a stable code and a message safe to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `TIMED_OUT`, `HTTP_502`, `CONNECTION_ERROR`, `OUTPUT_INVALID`,
    /// `TOOL_ERROR` (an MCP `isError` result), `INTERRUPTED`, ...
    pub code: String,
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}
