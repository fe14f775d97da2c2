//! The MCP client (SPEC §9.5), on `rmcp`: one connection per configured
//! server (Streamable HTTP or a command's stdio), kept up by its own task;
//! tools listed at connection, on `list_changed` and every
//! `refresh_interval`, as `<server>.<tool>@<server version>`. A server is not
//! ours: every wait is bounded (`mcp_limits`), every reconnect backed off.

use super::{
    Failure, Registry,
    mcp_limits::{self, Backoff, CONNECT_TIMEOUT},
    registry,
};
use crate::config::McpServerConfig;
use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    model::{
        CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
        PaginatedRequestParams,
    },
    service::{NotificationContext, RunningService},
    transport::{
        ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use semver::Version;
use serde_json::Value;
use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
    time::Duration,
};
use tokio::sync::{mpsc, watch};

/// Reads an environment variable (injected in tests).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A tool as an MCP server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Option<Value>,
}

/// Tells the server's task that its tool list changed.
#[derive(Clone)]
struct Handler {
    /// Capacity 1: one pending relist stands for any number of notifications.
    changed: mpsc::Sender<()>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _ctx: NotificationContext<RoleClient>) {
        // Full: a listing is already due and will see it. Closed: the session ends.
        let _ = self.changed.try_send(());
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("ai-orchestrator", env!("CARGO_PKG_VERSION")),
        )
    }
}

type Client = RunningService<RoleClient, Handler>;

/// The live connections, by server name, for calls.
#[derive(Clone, Default)]
pub struct Servers {
    connected: Arc<RwLock<BTreeMap<String, Arc<Client>>>>,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .connected
            .read()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_struct("Servers")
            .field("connected", &names)
            .finish()
    }
}

impl Servers {
    fn client(&self, server: &str) -> Option<Arc<Client>> {
        self.connected
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(server)
            .cloned()
    }

    fn set(&self, server: &str, client: Option<Arc<Client>>) {
        let mut map = self.connected.write().unwrap_or_else(|e| e.into_inner());
        match client {
            Some(c) => map.insert(server.to_owned(), c),
            None => map.remove(server),
        };
    }

    /// Calls `tool` of `server` within `timeout`: its structured content, else
    /// its content blocks as `{"content": [...]}`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        input: &Value,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let client = self.client(server).ok_or_else(|| {
            Failure::new(
                "CONNECTION_ERROR",
                format!("MCP server `{server}` is not connected"),
            )
        })?;
        let args = input.as_object().cloned().unwrap_or_default();
        let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        // Dropping the call at the timeout sends `notifications/cancelled`.
        let result = tokio::time::timeout(timeout, client.call_tool(request))
            .await
            .map_err(|_| Failure::new("TIMED_OUT", "the MCP tool did not answer in time"))?
            .map_err(|e| {
                // Cut like an isError text: it is stored and shown to models.
                let why: String = e.to_string().chars().take(500).collect();
                Failure::new("TOOL_ERROR", format!("the MCP call failed: {why}"))
            })?;
        if result.is_error == Some(true) {
            let text: String = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join(" ");
            let text: String = text.chars().take(500).collect();
            return Err(Failure::new(
                "TOOL_ERROR",
                format!("the MCP tool reported an error: {text}"),
            ));
        }
        if let Some(structured) = result.structured_content {
            return Ok(structured);
        }
        let content = serde_json::to_value(&result.content).unwrap_or(Value::Null);
        Ok(serde_json::json!({ "content": content }))
    }
}

async fn connect(
    name: &str,
    config: &McpServerConfig,
    env: &(dyn Fn(&str) -> Option<String> + Send + Sync),
    changed: mpsc::Sender<()>,
) -> Result<Client, String> {
    let handler = Handler { changed };
    if let Some(url) = &config.url {
        let mut transport = StreamableHttpClientTransportConfig::with_uri(url.clone());
        if let Some(token) = config.auth_env.as_deref().and_then(env) {
            transport = transport.auth_header(token);
        }
        let transport = StreamableHttpClientTransport::from_config(transport);
        return handler
            .serve(transport)
            .await
            .map_err(|e| format!("MCP server `{name}` at {url}: {e}"));
    }
    let command = config.command.clone().unwrap_or_default();
    let Some((program, args)) = command.split_first() else {
        return Err(format!("MCP server `{name}`: no command"));
    };
    let transport = TokioChildProcess::new(tokio::process::Command::new(program).configure(|c| {
        c.args(args);
    }))
    .map_err(|e| format!("MCP server `{name}`: starting `{program}`: {e}"))?;
    handler
        .serve(transport)
        .await
        .map_err(|e| format!("MCP server `{name}` (`{program}`): {e}"))
}

/// The server's version as semver (`0.0.0` when it gives none that parses).
fn version_of(client: &Client) -> Version {
    client
        .peer_info()
        .and_then(|info| info.server_info.as_ref().map(|s| s.version.clone()))
        .and_then(|v| Version::parse(&v).ok())
        .unwrap_or_else(|| Version::new(0, 0, 0))
}

/// Every tool `client` lists, within [`mcp_limits::list_pages`]' bounds
/// (rmcp's `list_all_tools` follows `nextCursor` without end).
async fn list(name: &str, client: &Client, timeout: Duration) -> Result<Vec<McpTool>, String> {
    mcp_limits::list_pages(name, timeout, move |cursor| async move {
        let params = PaginatedRequestParams::default().with_cursor(cursor);
        client
            .list_tools(Some(params))
            .await
            .map_err(|e| e.to_string())
            .map(|page| {
                let tools: Vec<McpTool> = page.tools.into_iter().map(tool_of).collect();
                (tools, page.next_cursor)
            })
    })
    .await
}

fn tool_of(t: rmcp::model::Tool) -> McpTool {
    McpTool {
        name: t.name.to_string(),
        description: t.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*t.input_schema).clone()),
        output_schema: t.output_schema.map(|s| Value::Object((*s).clone())),
    }
}

/// Keeps `name` connected and its tools in `registry` until `stop`; any end
/// of a session waits out the backoff.
pub async fn maintain(
    name: String,
    config: McpServerConfig,
    env: Env,
    registry: Arc<Registry>,
    servers: Servers,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    while !*stop.borrow() {
        // Stopping drops the session wherever it is; shutdown waits for this task.
        let ended = tokio::select! {
            healthy = session(&name, &config, env.as_ref(), &registry, &servers) => Some(healthy),
            _ = stop.wait_for(|s| *s) => None,
        };
        // However it ended, its tools leave the registry and calls find it gone.
        servers.set(&name, None);
        registry.set_mcp_tools(&name, Vec::new());
        let Some(healthy) = ended else { break };
        let wait = backoff.after(healthy);
        tracing::debug!(server = %name, ?wait, "MCP server: reconnecting after the backoff");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// One session with `name`, listing its tools until connecting or listing
/// fails or it closes; returns whether it was healthy, for the backoff.
async fn session(
    name: &str,
    config: &McpServerConfig,
    env: &(dyn Fn(&str) -> Option<String> + Send + Sync),
    registry: &Registry,
    servers: &Servers,
) -> bool {
    // Capacity 1: see `Handler::changed`.
    let (changed_tx, mut changed) = mpsc::channel(1);
    let client = match tokio::time::timeout(CONNECT_TIMEOUT, connect(name, config, env, changed_tx))
        .await
    {
        Ok(Ok(c)) => Arc::new(c),
        Ok(Err(e)) => {
            tracing::warn!(server = %name, error = %e, "MCP server not connected; retrying");
            return false;
        }
        Err(_) => {
            tracing::warn!(server = %name, timeout = ?CONNECT_TIMEOUT, "MCP server did not connect in time; retrying");
            return false;
        }
    };
    let started = tokio::time::Instant::now();
    let version = version_of(&client);
    servers.set(name, Some(client.clone()));
    let mut listed = false;
    loop {
        // Under the server's own timeout (its calls', 30 s by default).
        match list(name, &client, config.timeout).await {
            Ok(tools) => {
                listed = true;
                let n = tools.len();
                let tools = tools
                    .into_iter()
                    .filter_map(|t| registry::mcp_tool(name, &version, config, t))
                    .collect();
                registry.set_mcp_tools(name, tools);
                tracing::info!(server = %name, tools = n, %version, "MCP tools listed");
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %e, "listing MCP tools failed; reconnecting");
                break;
            }
        }
        tokio::select! {
            got = changed.recv() => if got.is_none() { break },
            () = tokio::time::sleep(config.refresh_interval) => {}
        }
        // rmcp's `is_closed` stays false when the server hangs up; the transport tells.
        if client.is_closed() || client.is_transport_closed() {
            break;
        }
    }
    mcp_limits::healthy(listed, started.elapsed())
}

#[async_trait::async_trait]
impl super::executor::Executor for Servers {
    async fn run(&self, run: super::executor::Run<'_>) -> super::executor::Ran {
        use super::executor::{Ran, wrong_kind};
        let super::Kind::Mcp { server, tool } = &run.tool.kind else {
            return wrong_kind(run.tool, "mcp");
        };
        let timeout = run
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        Ran::once(self.call(server, tool, run.input, timeout).await)
    }
}
