//! Workflow callbacks (SPEC §16): a workflow that accepted an invocation
//! (`completion = "callback"`) reports its end, signed with the tool's
//! callback secret. An unknown invocation and a bad signature get the same
//! answer, so nothing about an invocation is told before the signature
//! holds; the first valid callback ends it (on any replica: the row
//! decides), in the ledger's transaction with its audit event; a repeat of
//! that same body is answered again, any other is a conflict. Overdue
//! invocations end TIMED_OUT the same way.

use super::run::checked;
use crate::{
    audit::{AuditEvent, Category},
    call::{Pipeline, worker::result_event},
    store::Statement,
    tools::{
        Failure, Status, Tool,
        invocations::{Invocation, Outcome, callbacks},
    },
    usage::ledger::Op,
};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Why a callback is refused.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    /// `X-Signature` is missing or does not sign the body with the secret
    /// of the invocation's tool, or no invocation of a calling-back
    /// workflow has that ID (the same answer: an ID is not confirmed to
    /// whoever lacks the secret). Audited once a minute per invocation.
    #[error(
        "X-Signature must be sha256=<hex HMAC-SHA256 of the raw body> with the tool's callback secret"
    )]
    SignatureInvalid,
    /// The body is not `{status, output?, error?}`.
    #[error("{0}")]
    BodyInvalid(String),
    /// The invocation already ended otherwise: another callback, or its wait ran out.
    #[error("the invocation already ended ({0}) by another callback or without one")]
    Conflict(&'static str),
    #[error("storage: {0}")]
    Storage(String),
}

impl CallbackError {
    /// The stable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            CallbackError::SignatureInvalid => "SIGNATURE_INVALID",
            CallbackError::BodyInvalid(_) => "INVALID_INPUT",
            CallbackError::Conflict(_) => "CALLBACK_CONFLICT",
            CallbackError::Storage(_) => "STORAGE_UNAVAILABLE",
        }
    }
}

impl From<crate::store::StoreError> for CallbackError {
    fn from(e: crate::store::StoreError) -> Self {
        CallbackError::Storage(e.to_string())
    }
}

/// What a valid callback came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    pub invocation_id: String,
    /// SUCCEEDED, or FAILED (the workflow's failure, or an output that
    /// breaks the tool's output schema).
    pub status: Status,
    pub error: Option<Failure>,
    /// The same body was accepted before: nothing changed.
    pub repeated: bool,
}

/// The body a workflow POSTs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    status: ReportStatus,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<ReportError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReportStatus {
    Succeeded,
    Failed,
}

/// A failure as a message, or as `{code, message}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ReportError {
    Message(String),
    Coded {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: String,
    },
}

/// The code of a workflow's failure that names none.
const WORKFLOW_FAILED: &str = "WORKFLOW_FAILED";

/// Overdue invocations ended per sweep at most; the rest wait for the next.
const EXPIRED_PER_SWEEP: i64 = 100;

impl Pipeline {
    /// Ends invocation `id` with the callback `body`, signed by `signature`
    /// (`X-Signature`).
    pub async fn complete_invocation(
        &self,
        id: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<Completed, CallbackError> {
        let found = callbacks::find(self.store(), id).await?;
        let Some((inv, digest)) = found else {
            return Err(CallbackError::SignatureInvalid);
        };
        let tool = self
            .toolbox()
            .registry
            .lookup(&format!("{}@{}", inv.tool, inv.version))
            .ok()
            .filter(|t| t.callback().is_some());
        let Some(tool) = tool.filter(|t| signed(t, signature, body)) else {
            self.audit_bad_signature(&inv).await;
            return Err(CallbackError::SignatureInvalid);
        };
        let sha = hex::encode(Sha256::digest(body));
        if !matches!(inv.status, Status::AwaitingCallback | Status::Running) {
            return repeated(&inv, digest.as_deref(), &sha);
        }
        let outcome = outcome(&tool, &inv, body, &self.config().server)?;
        let now = chrono::Utc::now().timestamp_millis();
        let mut ended = inv;
        ended.cost_micros = Some(ended.cost_micros.unwrap_or(ended.estimated_cost_micros));
        let reason = outcome.error.as_ref().map_or("", |e| e.code.as_str());
        let event = result_event(
            self,
            &ended,
            super::decision(outcome.status),
            reason,
            outcome.output.as_ref(),
            Some(outcome.duration_ms),
        );
        let statement = callbacks::complete(id, &outcome, &sha, now);
        if !self.end_row(&ended.team_id, statement, event).await? {
            // Another callback (on any replica) or the sweep ended it first.
            let (now, digest) = callbacks::find(self.store(), id)
                .await?
                .ok_or(CallbackError::SignatureInvalid)?;
            return repeated(&now, digest.as_deref(), &sha);
        }
        crate::telemetry::metrics::tool_invocation(
            &tool.name,
            outcome.status.as_str(),
            std::time::Duration::from_millis(u64::try_from(outcome.duration_ms).unwrap_or(0)),
        );
        Ok(Completed {
            invocation_id: ended.id,
            status: outcome.status,
            error: outcome.error,
            repeated: false,
        })
    }

    /// Ends TIMED_OUT the invocations whose workflow did not call back in
    /// time, each with its `workflow.result` event in one transaction.
    pub(crate) async fn expire_callbacks(&self) {
        let now = chrono::Utc::now().timestamp_millis();
        let overdue = match callbacks::overdue(self.store(), now, EXPIRED_PER_SWEEP).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "looking for overdue workflow callbacks failed");
                return;
            }
        };
        for mut inv in overdue {
            inv.cost_micros = Some(inv.cost_micros.unwrap_or(inv.estimated_cost_micros));
            let event = result_event(self, &inv, "error", "TIMED_OUT", None, None);
            match self
                .end_row(&inv.team_id, callbacks::expire(&inv.id, now), event)
                .await
            {
                Ok(true) => {
                    tracing::warn!(invocation = %inv.id, tool = %inv.tool, trace_id = %inv.trace_id, "a workflow did not call back within its callback_timeout; marked TIMED_OUT");
                    crate::telemetry::metrics::tool_invocation(
                        &inv.tool,
                        Status::TimedOut.as_str(),
                        std::time::Duration::ZERO,
                    );
                }
                // A callback, or another replica's sweep, ended it first.
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(invocation = %inv.id, error = %e, "ending an overdue workflow invocation failed");
                }
            }
        }
    }

    /// Runs `statement` (guarded) with `event` in one ledger transaction,
    /// the event appended only if the statement ended the row: true then.
    async fn end_row(
        &self,
        team: &str,
        statement: Statement,
        event: AuditEvent,
    ) -> Result<bool, CallbackError> {
        self.guarded_write(team, statement, event)
            .await
            .map_err(CallbackError::Storage)
    }

    /// `workflow.callback` denied: someone without the secret tried to end
    /// it (once a minute per invocation).
    async fn audit_bad_signature(&self, inv: &Invocation) {
        let denials = &self.toolbox().callback_denials;
        if !denials.audit(&inv.id, std::time::Instant::now()) {
            return;
        }
        let event = AuditEvent::new(
            &inv.team_id,
            "callback",
            &inv.trace_id,
            Category::Workflow,
            "workflow.callback",
            &format!("{}@{}", inv.tool, inv.version),
        )
        .decided("deny", "SIGNATURE_INVALID");
        if let Err(e) = self.ledger().submit(Op::Audit(vec![event])).await {
            tracing::error!(invocation = %inv.id, error = %e, "auditing a badly signed callback failed");
        }
    }
}

/// Whether `signature` is `sha256=<hex>` of the HMAC-SHA256 of `body` under
/// the tool's callback secret, compared in constant time.
fn signed(tool: &Tool, signature: Option<&str>, body: &[u8]) -> bool {
    let Some(secret) = tool.callback().and_then(|c| c.secret.as_ref()) else {
        return false;
    };
    let Some(hex_mac) = signature.and_then(|s| s.trim().strip_prefix("sha256=")) else {
        return false;
    };
    let Ok(claimed) = hex::decode(hex_mac) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&claimed).is_ok()
}

/// An ended invocation's answer to a callback: the same body as the one
/// that ended it again, else a conflict.
fn repeated(inv: &Invocation, digest: Option<&str>, sha: &str) -> Result<Completed, CallbackError> {
    if digest != Some(sha) {
        return Err(CallbackError::Conflict(inv.status.as_str()));
    }
    Ok(Completed {
        invocation_id: inv.id.clone(),
        status: inv.status,
        error: inv.error.clone(),
        repeated: true,
    })
}

/// How `body` ends the invocation: a success's output checked against the
/// tool's output schema; cost as charged when the work was accepted. The
/// body is held to the edge's input limits once its signature holds.
fn outcome(
    tool: &Arc<Tool>,
    inv: &Invocation,
    body: &[u8],
    server: &crate::config::ServerConfig,
) -> Result<Outcome, CallbackError> {
    if body.len() > server.max_input_bytes {
        return Err(CallbackError::BodyInvalid(format!(
            "the body is {} bytes, over the {} byte input limit (server.max_input_bytes)",
            body.len(),
            server.max_input_bytes
        )));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| CallbackError::BodyInvalid(format!("the body is not JSON: {e}")))?;
    if crate::domain::json::depth(&value) > server.max_input_depth {
        return Err(CallbackError::BodyInvalid(format!(
            "the body nests deeper than {} levels (server.max_input_depth)",
            server.max_input_depth
        )));
    }
    let report: Report = serde_json::from_value(value).map_err(|e| {
        CallbackError::BodyInvalid(format!(
            "the body must be {{\"status\": \"succeeded\" | \"failed\", \"output\"?, \"error\"?}}: {e}"
        ))
    })?;
    let (status, output, error) = match report.status {
        ReportStatus::Succeeded => {
            let output = report.output.ok_or_else(|| {
                CallbackError::BodyInvalid("a succeeded callback carries its `output`".into())
            })?;
            checked(tool, output)
        }
        ReportStatus::Failed => {
            let failure = match report.error {
                Some(ReportError::Message(m)) => Failure::new(WORKFLOW_FAILED, m),
                Some(ReportError::Coded { code, message }) => {
                    Failure::new(code.as_deref().unwrap_or(WORKFLOW_FAILED), message)
                }
                None => Failure::new(WORKFLOW_FAILED, "the workflow reported a failure"),
            };
            (Status::Failed, None, Some(failure))
        }
    };
    let now = chrono::Utc::now().timestamp_millis();
    Ok(Outcome {
        status,
        output,
        error,
        cost_micros: inv.cost_micros.unwrap_or(inv.estimated_cost_micros),
        duration_ms: now.saturating_sub(inv.created_at_ms).max(0),
        execution_id: inv.execution_id.clone(),
        attempts: inv.attempts,
        callback_until_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_a_message_or_a_code_and_a_message() {
        let r: Report =
            serde_json::from_str(r#"{"status": "failed", "error": "CRM down"}"#).unwrap();
        assert!(matches!(r.error, Some(ReportError::Message(ref m)) if m == "CRM down"));
        let r: Report = serde_json::from_str(
            r#"{"status": "failed", "error": {"code": "CRM_DOWN", "message": "503"}}"#,
        )
        .unwrap();
        assert!(
            matches!(r.error, Some(ReportError::Coded { code: Some(ref c), .. }) if c == "CRM_DOWN")
        );
        assert!(serde_json::from_str::<Report>(r#"{"status": "done"}"#).is_err());
        assert!(serde_json::from_str::<Report>(r#"{"status": "failed", "extra": 1}"#).is_err());
    }
}
