//! `call`: a client for a quick try from a shell.

use crate::api::pb::{self, orchestrator_client::OrchestratorClient};
use anyhow::Context;
use clap::Subcommand;

/// How the client mode reaches a TLS port.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTls {
    /// PEM CA bundle the server's certificate must chain to.
    #[arg(long, global = true)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate (mTLS), with `--tls-key`.
    #[arg(long, global = true, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM client key (mTLS).
    #[arg(long, global = true, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl ClientTls {
    pub(super) fn config(&self) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |p: &std::path::Path| {
            std::fs::read(p).with_context(|| format!("reading {}", p.display()))
        };
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &self.tls_ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(tls)
    }
}

/// RPCs the client mode can make.
#[derive(Debug, Subcommand)]
pub enum Call {
    /// ClassifySms with one message.
    ClassifySms {
        /// The inbound SMS.
        message: String,
    },
    /// GenerateSms for one inbound message.
    GenerateSms {
        /// The inbound SMS to answer.
        message: String,
        /// What the reply should achieve.
        #[arg(long, default_value = "")]
        goal: String,
        /// Segment budget.
        #[arg(long, default_value_t = 0)]
        max_segments: u32,
    },
    /// Research a query.
    Research {
        /// The question or claim.
        query: String,
        /// DEEP instead of VERIFY.
        #[arg(long)]
        deep: bool,
    },
    /// Execute any configured task with JSON input.
    Execute {
        /// Task name.
        task: String,
        /// Input JSON object.
        #[arg(default_value = "{}")]
        input: String,
    },
    /// GetUsage for the team (current month).
    Usage {
        /// Group by: task, provider, model, day (comma-separated).
        #[arg(long, value_delimiter = ',')]
        group_by: Vec<String>,
    },
    /// GetProviderHealth.
    Providers,
}

/// How `call` prints a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// The proto3 JSON mapping, indented (what grpcurl prints).
    #[default]
    Json,
    /// One `path: value` line per field set, for reading.
    Text,
}

/// Makes one client call and renders the response.
pub async fn call(
    addr: String,
    api_key: Option<String>,
    tls: ClientTls,
    team: String,
    trace_id: Option<String>,
    output: Output,
    rpc: Call,
) -> anyhow::Result<String> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(addr.clone())
        .with_context(|| format!("bad --addr {addr}"))?;
    if addr.starts_with("https://") {
        endpoint = endpoint
            .tls_config(tls.config()?)
            .context("configuring TLS")?;
    }
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let authorization: Option<tonic::metadata::MetadataValue<_>> = match api_key {
        Some(key) => Some(
            format!("Bearer {key}")
                .parse()
                .context("the API key is not valid header text")?,
        ),
        None => None,
    };
    let mut client =
        OrchestratorClient::with_interceptor(channel, move |mut req: tonic::Request<()>| {
            if let Some(value) = &authorization {
                req.metadata_mut().insert("authorization", value.clone());
            }
            Ok(req)
        });
    let context = Some(pb::RequestContext {
        team_id: team.clone(),
        trace_id: trace_id.unwrap_or_default(),
        channel: pb::Channel::System as i32,
        priority: pb::Priority::Interactive as i32,
        ..Default::default()
    });

    match rpc {
        Call::ClassifySms { message } => {
            let r = client
                .classify_sms(pb::ClassifySmsRequest {
                    context,
                    message,
                    ..Default::default()
                })
                .await;
            show(r, "ai.orchestrator.v1.ClassifySmsResponse", output)
        }
        Call::GenerateSms {
            message,
            goal,
            max_segments,
        } => {
            let r = client
                .generate_sms(pb::GenerateSmsRequest {
                    context,
                    inbound_message: message,
                    goal,
                    max_segments,
                    ..Default::default()
                })
                .await;
            show(r, "ai.orchestrator.v1.GenerateSmsResponse", output)
        }
        Call::Research { query, deep } => {
            let depth = if deep {
                pb::ResearchDepth::Deep
            } else {
                pb::ResearchDepth::Verify
            };
            let r = client
                .research(pb::ResearchRequest {
                    context,
                    query,
                    depth: depth as i32,
                    ..Default::default()
                })
                .await;
            show(r, "ai.orchestrator.v1.ResearchResponse", output)
        }
        Call::Execute { task, input } => {
            let r = client
                .execute(pb::ExecuteRequest {
                    context,
                    task,
                    input: Some(pb::execute_request::Input::InputJson(input)),
                    ..Default::default()
                })
                .await;
            show(r, "ai.orchestrator.v1.ExecuteResponse", output)
        }
        Call::Usage { group_by } => {
            let mut dims = Vec::new();
            for g in group_by {
                let d = match g.to_ascii_lowercase().as_str() {
                    "task" => pb::UsageDimension::Task,
                    "provider" => pb::UsageDimension::Provider,
                    "model" => pb::UsageDimension::Model,
                    "day" => pb::UsageDimension::Day,
                    other => {
                        anyhow::bail!("unknown --group-by `{other}` (task, provider, model, day)")
                    }
                };
                dims.push(d as i32);
            }
            let r = client
                .get_usage(pb::GetUsageRequest {
                    team_id: team,
                    group_by: dims,
                    ..Default::default()
                })
                .await;
            show(r, "ai.orchestrator.v1.GetUsageResponse", output)
        }
        Call::Providers => show(
            client
                .get_provider_health(pb::GetProviderHealthRequest {})
                .await,
            "ai.orchestrator.v1.GetProviderHealthResponse",
            output,
        ),
    }
}

fn show<T: prost::Message>(
    result: Result<tonic::Response<T>, tonic::Status>,
    name: &str,
    output: Output,
) -> anyhow::Result<String> {
    use tonic_types::StatusExt;
    match result {
        Ok(response) => render(&response.into_inner(), name, output),
        Err(status) => {
            let info = status.get_details_error_info();
            let reason = info.as_ref().map_or("", |i| i.reason.as_str());
            let trace = info
                .as_ref()
                .and_then(|i| i.metadata.get("trace_id").cloned())
                .unwrap_or_default();
            anyhow::bail!(
                "{:?}: {} (reason {reason}, trace_id {trace})",
                status.code(),
                status.message()
            )
        }
    }
}

/// `message` in the proto3 JSON mapping (field names in lowerCamelCase,
/// enums by name, 64-bit integers as strings, well-known types in their
/// JSON forms), read through the served descriptors, or as `path: value`
/// lines.
fn render<T: prost::Message>(message: &T, name: &str, output: Output) -> anyhow::Result<String> {
    let pool = prost_reflect::DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET)
        .context("reading the API's descriptors")?;
    let descriptor = pool
        .get_message_by_name(name)
        .with_context(|| format!("no descriptor for {name}"))?;
    let dynamic =
        prost_reflect::DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
            .context("re-reading the reply")?;
    let json = serde_json::to_value(&dynamic).context("rendering the reply as JSON")?;
    Ok(match output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&json)?),
        Output::Text => {
            let mut lines = String::new();
            flatten("", &json, &mut lines);
            lines
        }
    })
}

/// `path: value` lines for every leaf of `value` (`meta.attempts[0].provider`).
fn flatten(path: &str, value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(fields) => {
            for (key, v) in fields {
                let path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                flatten(&path, v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), v, out);
            }
        }
        Value::String(s) => out.push_str(&format!("{path}: {s}\n")),
        other => out.push_str(&format!("{path}: {other}\n")),
    }
}
