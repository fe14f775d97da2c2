//! `call converse`: one agent turn, each event (answer text, tool calls) printed as it arrives.

use super::call::{Client, Output, render};
use crate::api::pb::{self, agent_service_client::AgentServiceClient};
use futures::StreamExt;
use std::io::Write;

/// Runs one turn of `agent` and prints each event; returns the closing line.
pub async fn converse(
    args: Client,
    agent: String,
    message: String,
    conversation: Option<String>,
) -> anyhow::Result<String> {
    let mut client = AgentServiceClient::new(args.connect().await?);
    let mut context = args.context();
    if let (Some(c), Some(id)) = (context.as_mut(), conversation) {
        c.conversation_id = id;
    }
    let request = pb::ConverseRequest {
        context,
        agent,
        message,
        ..Default::default()
    };
    let mut events = match client.converse(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return super::call::show::<pb::ConverseEvent>(Err(status), "", args.output),
    };
    let mut out = std::io::stdout().lock();
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(event) => event,
            Err(status) => {
                return super::call::show::<pb::ConverseEvent>(Err(status), "", args.output);
            }
        };
        let mut line = render(&event, "ai.orchestrator.v1.ConverseEvent", args.output)?;
        if args.output == Output::Json {
            // One event per line.
            line = serde_json::from_str::<serde_json::Value>(&line)
                .map(|v| v.to_string())
                .unwrap_or(line);
        }
        let written = writeln!(out, "{}", line.trim_end()).and_then(|()| out.flush());
        match written {
            Ok(()) => {}
            // The reader went away (`| head`): as any Unix filter, stop quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(String::new())
}
