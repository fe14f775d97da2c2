//! `tools`: a key's tools listed and called through `ToolService` (checked, metered, audited).

use super::call::{Client, show};
use crate::api::pb::{self, tool_service_client::ToolServiceClient};
use anyhow::Context;
use clap::Subcommand;

/// `tools` sub-commands.
#[derive(Debug, Subcommand)]
pub enum ToolsAction {
    /// The tools the key may use.
    List,
    /// Invokes a tool.
    Call {
        /// `name` or `name@version`.
        name: String,
        /// The input, a JSON object.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Queue it and return its invocation ID (poll with `tools get`).
        #[arg(long)]
        r#async: bool,
        /// Replaces the derived idempotency key of a workflow tool.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// An invocation of the team, by ID (an ASYNC one's progress).
    Get {
        /// The invocation ID.
        invocation_id: String,
    },
}

/// Runs a `tools` sub-command against the server `client` names.
pub async fn tools(client: Client, action: ToolsAction) -> anyhow::Result<String> {
    let mut tools = ToolServiceClient::new(client.connect().await?);
    let context = client.context();
    let output = client.output;
    match action {
        ToolsAction::List => show(
            tools.list_tools(pb::ListToolsRequest { context }).await,
            "ai.orchestrator.v1.ListToolsResponse",
            output,
        ),
        ToolsAction::Call {
            name,
            input,
            r#async,
            idempotency_key,
        } => {
            let input: serde_json::Value =
                serde_json::from_str(&input).context("--input is not JSON")?;
            let serde_json::Value::Object(input) = input else {
                anyhow::bail!("--input must be a JSON object");
            };
            let mode = if r#async {
                pb::InvocationMode::Async
            } else {
                pb::InvocationMode::Sync
            };
            let reply = tools
                .invoke_tool(pb::InvokeToolRequest {
                    context,
                    tool: name,
                    input: Some(crate::api::convert::json_to_struct(input)),
                    mode: mode as i32,
                    idempotency_key: idempotency_key.unwrap_or_default(),
                    budget: None,
                })
                .await;
            show(reply, "ai.orchestrator.v1.InvokeToolResponse", output)
        }
        ToolsAction::Get { invocation_id } => show(
            tools
                .get_tool_invocation(pb::GetToolInvocationRequest {
                    context,
                    invocation_id,
                })
                .await,
            "ai.orchestrator.v1.ToolInvocation",
            output,
        ),
    }
}
