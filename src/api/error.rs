//! The one place where internal errors become gRPC statuses.
//!
//! Every status carries `google.rpc.ErrorInfo` (domain [`DOMAIN`], a stable `reason`, the
//! trace ID) and the `x-trace-id` metadata. Internal detail (provider messages, SQL errors)
//! goes to the log with the trace ID, never to the client.

mod bounds;
mod quota;
mod workflows;

use quota::{call_budget_exceeded, quota_exceeded, tool_budget_exceeded};
use workflows::{approval_refusal, callback_refusal, tool_admin_refusal};

use crate::{
    agent::AgentError,
    call::CallError,
    router::{AttemptRecord, RouteError},
    telemetry::trace_id::TRACE_ID_HEADER,
    tools::Denial,
    usage::{
        policy::{CapKind, Refusal},
        pricing::{usd, usd_text},
    },
};
use bounds::{MAX_ECHO, MAX_MESSAGE, bound_violations, clip, known_names};
use std::{collections::HashMap, time::Duration};
use tonic::{Code, Status, metadata::MetadataMap};
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every error we return.
pub const DOMAIN: &str = "ai-orchestrator";

/// Stable `ErrorInfo.reason` values (part of the API contract).
pub mod reason {
    /// A field is missing, malformed or too large.
    pub const INVALID_INPUT: &str = "INVALID_INPUT";
    /// The task is not configured.
    pub const TASK_UNKNOWN: &str = crate::router::RouteError::TASK_UNKNOWN;
    /// Every target of the chain failed.
    pub const ALL_PROVIDERS_FAILED: &str = crate::router::RouteError::ALL_PROVIDERS_FAILED;
    /// The deadline or latency budget ran out.
    pub const DEADLINE_EXCEEDED: &str = crate::router::RouteError::DEADLINE_EXCEEDED;
    /// The cluster store of shared limits is down and `on_unavailable = "refuse"`.
    pub const CLUSTER_STORE_UNAVAILABLE: &str =
        crate::router::RouteError::CLUSTER_STORE_UNAVAILABLE;
    /// A monthly cap would be exceeded.
    pub const QUOTA_EXCEEDED: &str = "QUOTA_EXCEEDED";
    /// The call's estimated cost exceeds `budget.max_cost_usd`.
    pub const BUDGET_EXCEEDED: &str = "BUDGET_EXCEEDED";
    /// The named prompt version does not exist.
    pub const NOT_FOUND: &str = "NOT_FOUND";
    /// The prompt key a request named (`ExecuteRequest.prompt_key`) has no stored version.
    pub const PROMPT_NOT_FOUND: &str = "PROMPT_NOT_FOUND";
    /// A guardrail with `action = "block"` detected something (SPEC §15).
    pub const GUARDRAIL_BLOCKED: &str = "GUARDRAIL_BLOCKED";
    /// Too many requests in flight on this replica; retry shortly.
    pub const OVERLOADED: &str = "OVERLOADED";
    /// The MCP endpoint holds `mcp_endpoint.max_sessions` sessions.
    pub const MCP_SESSIONS_FULL: &str = "MCP_SESSIONS_FULL";
    /// No API key was presented (authentication is on).
    pub const API_KEY_MISSING: &str = "API_KEY_MISSING";
    /// The presented API key is unknown or revoked.
    pub const API_KEY_INVALID: &str = "API_KEY_INVALID";
    /// The key may not act for the team named in the request.
    pub const TEAM_NOT_ALLOWED: &str = "TEAM_NOT_ALLOWED";
    /// The RPC needs the `admin` role (with scope over the team).
    pub const ADMIN_REQUIRED: &str = "ADMIN_REQUIRED";
    /// The database cannot be reached.
    pub const STORAGE_UNAVAILABLE: &str = "STORAGE_UNAVAILABLE";
    /// A bug on our side.
    pub const INTERNAL: &str = "INTERNAL";
    /// The tool (or the version asked for) does not exist.
    pub const TOOL_NOT_FOUND: &str = "TOOL_NOT_FOUND";
    /// The tool is disabled.
    pub const TOOL_DISABLED: &str = "TOOL_DISABLED";
    /// The key's role lacks the tool's capability.
    pub const CAPABILITY_MISSING: &str = "CAPABILITY_MISSING";
    /// A viewer may not run a tool with side effects.
    pub const SIDE_EFFECTS_FORBIDDEN: &str = "SIDE_EFFECTS_FORBIDDEN";
    /// A tenant-scoped tool needs a team the key acts for.
    pub const TENANT_REQUIRED: &str = "TENANT_REQUIRED";
    /// The tool's input breaks its schema.
    pub const TOOL_INPUT_INVALID: &str = "TOOL_INPUT_INVALID";
}

/// What went wrong, in API terms.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input: `(field, description)` pairs.
    Invalid(Vec<(String, String)>),
    UnknownTask {
        task: String,
        known: Vec<String>,
    },
    Route(RouteError),
    Storage(String),
    NotFound(String),
    /// The prompt key a request named has no stored version, the team's or a global one.
    PromptNotFound(String),
    /// A blocking guardrail's refusal: the guardrail and where, never the content.
    GuardrailBlocked {
        guardrail: String,
        stage: &'static str,
    },
    /// Load shed: too many requests in flight.
    Overloaded,
    Unauthenticated(crate::auth::AuthError),
    TeamNotAllowed {
        /// The request field naming the team.
        field: &'static str,
        team: String,
    },
    /// The RPC needs the admin role over the team (`None`: global prompts).
    AdminRequired(Option<String>),
    Quota(Refusal),
    /// The estimated cost exceeds the request budget.
    Budget {
        /// Estimated cost, micro-USD.
        estimate_micros: i64,
        /// The request's budget, USD, as sent.
        budget_usd: f64,
    },
    /// The tools' entry point refused an invocation.
    ToolDenied(Denial),
    /// An agent turn could not start.
    Agent(AgentError),
    /// A prompt version may not become active: an agent using its key
    /// would have no room in its window.
    PromptExceedsWindow(String),
    /// A tool invocation's estimate exceeds the request budget.
    ToolBudget {
        /// Estimated cost, micro-USD.
        estimate_micros: i64,
        /// The request's budget, USD, as sent.
        budget_usd: f64,
    },
    /// An approval could not be decided.
    Approval(crate::call::approvals::ApprovalError),
    /// A workflow's callback was refused (HTTP edge).
    Callback(crate::call::tool::callback::CallbackError),
    /// The runtime tool registry refused a change or a listing (SPEC §16).
    ToolAdmin(crate::call::tool::admin::ToolAdminError),
}

impl Failure {
    /// A tool invocation's denial (SPEC §9.3): its code, reason and details.
    fn tool_denial(
        denial: Denial,
        details: &mut ErrorDetails,
        info: &mut HashMap<String, String>,
    ) -> (Code, &'static str, String) {
        let reason = denial.reason();
        match denial {
            Denial::NotFound(wanted) => {
                let wanted = clip(&wanted, MAX_ECHO);
                let message = format!("no tool `{wanted}` (as `name` or `name@version`)");
                (Code::NotFound, reason, message)
            }
            Denial::InputInvalid(violations) => {
                let message = violations
                    .iter()
                    .map(|(at, what)| format!("{at}: {what}"))
                    .collect::<Vec<_>>()
                    .join("; ");
                for (at, what) in violations {
                    details.add_bad_request_violation(at, what);
                }
                (Code::InvalidArgument, reason, message)
            }
            Denial::StoreUnavailable => {
                details.set_retry_info(Some(Duration::from_secs(1)));
                (
                    Code::Unavailable,
                    reason,
                    "the cluster store that keeps the tools' shared quotas is unreachable".into(),
                )
            }
            Denial::Quota { limit, max } => {
                details.add_quota_failure_violation(
                    limit,
                    format!("the tool's {limit} of {max} for this team is reached"),
                );
                info.insert("limit".into(), limit.into());
                (
                    Code::ResourceExhausted,
                    reason,
                    format!("the tool's {limit} ({max}) is reached"),
                )
            }
            Denial::CapabilityMissing(capability) => {
                info.insert("capability".into(), capability.clone());
                (
                    Code::PermissionDenied,
                    reason,
                    format!("the key's role lacks the capability {capability}"),
                )
            }
            Denial::Disabled(why) if why.is_empty() => (
                Code::PermissionDenied,
                reason,
                "the tool is disabled".into(),
            ),
            Denial::Disabled(why) => {
                info.insert("disabled_reason".into(), why.clone());
                (
                    Code::PermissionDenied,
                    reason,
                    format!("the tool is disabled: {why}"),
                )
            }
            Denial::SideEffectsForbidden => (
                Code::PermissionDenied,
                reason,
                "a viewer may not run a tool with side effects".into(),
            ),
            Denial::NotAgentTool => (
                Code::PermissionDenied,
                reason,
                "the agent's tools do not include this tool".into(),
            ),
            Denial::TenantRequired => (
                Code::PermissionDenied,
                reason,
                "the tool acts on a team's data: the key must act for the request's team".into(),
            ),
        }
    }

    /// One invalid field.
    pub(crate) fn invalid(field: &str, description: &str) -> Self {
        Failure::Invalid(vec![(field.to_owned(), description.to_owned())])
    }
}

impl From<CallError> for Failure {
    fn from(err: CallError) -> Self {
        match err {
            CallError::Invalid(v) => Failure::Invalid(v),
            CallError::UnknownTask { task, known } => Failure::UnknownTask { task, known },
            CallError::PromptNotFound(key) => Failure::PromptNotFound(key),
            CallError::GuardrailBlocked {
                guardrail, stage, ..
            } => Failure::GuardrailBlocked { guardrail, stage },
            CallError::Route(e) => Failure::Route(e),
            CallError::Quota(refusal) => Failure::Quota(refusal),
            CallError::Budget {
                estimate_micros,
                budget_usd,
            } => Failure::Budget {
                estimate_micros,
                budget_usd,
            },
            CallError::Storage(e) => Failure::Storage(e),
            CallError::Overloaded => Failure::Overloaded,
            CallError::ToolDenied(d) => Failure::ToolDenied(d),
            CallError::Agent(e) => Failure::Agent(e),
            CallError::ToolBudget {
                estimate_micros,
                budget_usd,
            } => Failure::ToolBudget {
                estimate_micros,
                budget_usd,
            },
        }
    }
}

/// Compact `provider/model:CODE` list of failed attempts, for error metadata.
fn summarise(attempts: &[AttemptRecord]) -> String {
    attempts
        .iter()
        .map(|a| {
            format!(
                "{}/{}:{}",
                a.provider,
                a.model,
                a.error_code.as_deref().unwrap_or("OK")
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A failure's gRPC code, stable reason and client-safe message.
type Parts = (Code, &'static str, String);

/// A store that failed: retry in a second; its detail stays in the log.
fn storage_unavailable(details: &mut ErrorDetails) -> Parts {
    details.set_retry_info(Some(Duration::from_secs(1)));
    (
        Code::Unavailable,
        reason::STORAGE_UNAVAILABLE,
        "storage is unavailable".to_owned(),
    )
}

/// Builds the status for `failure`, tagged with `trace_id`.
pub(crate) fn to_status(failure: Failure, trace_id: &str) -> Status {
    let mut info = HashMap::from([("trace_id".to_owned(), trace_id.to_owned())]);
    let mut details = ErrorDetails::new();
    let (code, reason, message) = match failure {
        Failure::Invalid(violations) => invalid_input(violations, &mut details),
        Failure::UnknownTask { task, known } => {
            unknown_task(&task, &known, &mut details, &mut info)
        }
        Failure::Route(err) => route_failure(err, &mut details, &mut info),
        Failure::Storage(detail) => {
            tracing::error!(%trace_id, error = %detail, "storage failure");
            storage_unavailable(&mut details)
        }
        Failure::NotFound(what) => (Code::NotFound, reason::NOT_FOUND, what),
        Failure::PromptNotFound(key) => prompt_not_found(&key, &mut info),
        Failure::GuardrailBlocked { guardrail, stage } => {
            info.insert("guardrail".into(), guardrail.clone());
            info.insert("stage".into(), stage.to_owned());
            (
                Code::InvalidArgument,
                reason::GUARDRAIL_BLOCKED,
                format!("guardrail `{guardrail}` blocked the {stage}"),
            )
        }
        // The turn's own refusal of the same state has the same reason.
        Failure::PromptExceedsWindow(why) => (
            Code::FailedPrecondition,
            AgentError::PROMPT_EXCEEDS_WINDOW,
            why,
        ),
        Failure::Overloaded => {
            details.set_retry_info(Some(Duration::from_millis(200)));
            (
                Code::ResourceExhausted,
                reason::OVERLOADED,
                "too many requests in flight; retry shortly".to_owned(),
            )
        }
        Failure::Unauthenticated(err) => {
            let reason = match err {
                crate::auth::AuthError::Missing => reason::API_KEY_MISSING,
                crate::auth::AuthError::Invalid => reason::API_KEY_INVALID,
            };
            (Code::Unauthenticated, reason, err.to_string())
        }
        Failure::TeamNotAllowed { field, team } => team_not_allowed(field, team, &mut info),
        Failure::AdminRequired(team) => admin_required(team, &mut info),
        Failure::Quota(refusal) => quota_exceeded(&refusal, &mut details, &mut info),
        Failure::Budget {
            estimate_micros,
            budget_usd,
        } => call_budget_exceeded(estimate_micros, budget_usd, &mut details, &mut info),
        Failure::ToolDenied(denial) => Failure::tool_denial(denial, &mut details, &mut info),
        Failure::Agent(err) => agent_refusal(err, &mut details),
        Failure::ToolBudget {
            estimate_micros,
            budget_usd,
        } => tool_budget_exceeded(estimate_micros, budget_usd, &mut details, &mut info),
        Failure::Approval(err) => approval_refusal(err, &mut details, &mut info),
        Failure::Callback(err) => callback_refusal(err, &mut details),
        Failure::ToolAdmin(err) => tool_admin_refusal(err, &mut details, &mut info),
    };
    assemble(code, reason, &message, details, info, trace_id)
}

/// Records the failure's reason and code, then builds the bounded status
/// with its `ErrorInfo` and `x-trace-id` metadata.
fn assemble(
    code: Code,
    reason: &'static str,
    message: &str,
    mut details: ErrorDetails,
    info: HashMap<String, String>,
    trace_id: &str,
) -> Status {
    crate::telemetry::metrics::error_reason(reason);
    super::record_status(code);
    super::access::note(|f| {
        f.reason = reason;
        if f.trace_id.is_empty() {
            trace_id.clone_into(&mut f.trace_id);
        }
    });
    let info: HashMap<String, String> = info.into_iter().map(|(k, v)| (k, clip(&v, 512))).collect();
    details.set_error_info(reason, DOMAIN, info);
    bound_violations(&mut details);
    let mut metadata = MetadataMap::new();
    if let Ok(value) = trace_id.parse() {
        metadata.insert(TRACE_ID_HEADER, value);
    }
    Status::with_error_details_and_metadata(code, clip(message, MAX_MESSAGE), details, metadata)
}

/// Bad fields: one `BadRequest` violation each, all of them in the message.
fn invalid_input(violations: Vec<(String, String)>, details: &mut ErrorDetails) -> Parts {
    let message = violations
        .iter()
        .map(|(f, d)| format!("{f}: {d}"))
        .collect::<Vec<_>>()
        .join("; ");
    for (field, description) in violations {
        details.add_bad_request_violation(field, description);
    }
    (Code::InvalidArgument, reason::INVALID_INPUT, message)
}

/// An unknown task, echoed clipped, with the configured ones (`known`, in `ErrorInfo` too).
fn unknown_task(
    task: &str,
    known: &[String],
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    let task = clip(task, MAX_ECHO);
    details.add_bad_request_violation("task", format!("unknown task `{task}`"));
    info.insert("task".into(), task.clone());
    let known = known_names(known);
    info.insert("known".into(), known.clone());
    (
        Code::InvalidArgument,
        reason::TASK_UNKNOWN,
        format!("unknown task `{task}`; known tasks: {known}"),
    )
}

/// A prompt key the request named with no stored version: echoed clipped, in `ErrorInfo` too.
fn prompt_not_found(key: &str, info: &mut HashMap<String, String>) -> Parts {
    let key = clip(key, MAX_ECHO);
    info.insert("prompt_key".into(), key.clone());
    (
        Code::NotFound,
        reason::PROMPT_NOT_FOUND,
        format!("no active prompt `{key}` for the team, nor a global one"),
    )
}

fn route_failure(
    err: RouteError,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    match err {
        RouteError::UnknownTask(task) => unknown_task(&task, &[], details, info),
        err @ RouteError::AllProvidersFailed { .. } => {
            let reason = err.reason();
            let attempts = err.attempts();
            super::access::note(|f| f.attempts = attempts.len());
            info.insert("attempts".into(), summarise(attempts));
            // Outages are usually short; a second later the breaker may let
            // a probe through, or the cluster store answer again.
            details.set_retry_info(Some(Duration::from_secs(1)));
            let message = if reason == RouteError::CLUSTER_STORE_UNAVAILABLE {
                "the cluster store that keeps the providers' shared limits is unreachable"
                    .to_owned()
            } else {
                format!("all {} provider attempt(s) failed", attempts.len())
            };
            (Code::Unavailable, reason, message)
        }
        RouteError::DeadlineExceeded { attempts } => {
            super::access::note(|f| f.attempts = attempts.len());
            info.insert("attempts".into(), summarise(&attempts));
            (
                Code::DeadlineExceeded,
                reason::DEADLINE_EXCEEDED,
                format!("deadline exceeded after {} attempt(s)", attempts.len()),
            )
        }
    }
}

fn team_not_allowed(
    field: &'static str,
    team: String,
    info: &mut HashMap<String, String>,
) -> Parts {
    info.insert("team_id".into(), team.clone());
    info.insert("field".into(), field.into());
    (
        Code::PermissionDenied,
        reason::TEAM_NOT_ALLOWED,
        format!("this API key may not act for team `{team}` ({field})"),
    )
}

/// The RPC needs an admin key over `team` (`None`: global prompts).
fn admin_required(team: Option<String>, info: &mut HashMap<String, String>) -> Parts {
    let message = match &team {
        Some(team) => {
            info.insert("team_id".into(), team.clone());
            format!("needs an admin API key for team `{team}`")
        }
        None => "global prompts need an admin API key for all teams".to_owned(),
    };
    (Code::PermissionDenied, reason::ADMIN_REQUIRED, message)
}

fn agent_refusal(err: AgentError, details: &mut ErrorDetails) -> Parts {
    let reason = err.reason();
    let code = match &err {
        AgentError::UnknownAgent { name, known } => {
            let name = clip(name, MAX_ECHO);
            details.add_bad_request_violation("agent", format!("unknown agent `{name}`"));
            let known = known_names(known);
            let message = format!("unknown agent `{name}`; known agents: {known}");
            return (Code::InvalidArgument, reason, message);
        }
        AgentError::ConversationNotFound(_) => Code::NotFound,
        // Retry once the running turn has ended.
        AgentError::ConversationBusy(_) => {
            details.set_retry_info(Some(Duration::from_secs(1)));
            Code::Aborted
        }
        AgentError::AgentMismatch { .. }
        | AgentError::WindowExceeded { .. }
        | AgentError::ApprovalPending { .. }
        | AgentError::NothingToResume(_) => Code::FailedPrecondition,
        AgentError::Prompt(_) => Code::InvalidArgument,
    };
    (code, reason, err.to_string())
}
