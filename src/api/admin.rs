//! `PromptAdmin`: versioned prompts over gRPC, for `admin` keys over the team. Changes are
//! audited with the actor: the key's name, or with auth off the `x-actor` metadata.

use super::{
    auth::{check_admin, principal},
    error::{Failure, to_status},
    pb::{self, prompt_admin_server::PromptAdmin},
    request::check_id,
};
use crate::{
    auth::Authenticator,
    prompts::store::{NewPrompt, PromptError, PromptStore, StoredPrompt},
};
use tonic::{Request, Response, Status, metadata::MetadataMap};

/// The `PromptAdmin` service.
#[derive(Clone)]
pub struct PromptAdminApi {
    prompts: PromptStore,
    auth: Authenticator,
}

impl PromptAdminApi {
    /// A service over the prompt store.
    pub fn new(prompts: PromptStore, auth: Authenticator) -> Self {
        Self { prompts, auth }
    }

    /// The caller's principal, if it may administer `team` ('' = global).
    fn admin(
        &self,
        extensions: &tonic::Extensions,
        team: &str,
    ) -> Result<crate::auth::Principal, Failure> {
        let p = principal(extensions, &self.auth)?;
        check_admin(&p, (!team.is_empty() && team != "*").then_some(team))?;
        Ok(p)
    }

    /// Who is making a change, for the audit trail.
    fn actor(&self, metadata: &MetadataMap, principal: &crate::auth::Principal) -> String {
        if self.auth.enabled() {
            principal.name.clone()
        } else {
            actor(metadata)
        }
    }
}

/// The `x-actor` metadata, for the audit trail while authentication is off.
pub(crate) fn actor(metadata: &MetadataMap) -> String {
    metadata
        .get("x-actor")
        .and_then(|v| v.to_str().ok())
        .filter(|a| check_id(a, true).is_ok())
        .unwrap_or("anonymous")
        .to_owned()
}

fn failure(e: PromptError) -> Failure {
    match e {
        PromptError::Template(t) => Failure::invalid("user_prompt_template", &t.to_string()),
        PromptError::Invalid { field, why } => Failure::invalid(field, &why),
        e @ PromptError::NoSuchVersion { .. } => Failure::NotFound(e.to_string()),
        PromptError::ExceedsWindow(why) => Failure::PromptExceedsWindow(why),
        PromptError::Store(s) => Failure::Storage(s.to_string()),
    }
}

fn check_team(team: &str) -> Result<(), Failure> {
    check_id(team, false).map_err(|why| Failure::invalid("team_id", why))
}

fn to_pb(p: StoredPrompt) -> pb::PromptVersion {
    pb::PromptVersion {
        team_id: p.team_id,
        prompt_key: p.prompt.key,
        version: p.prompt.version,
        system_prompt: p.prompt.system,
        user_prompt_template: p.prompt.user_template,
        model: p.prompt.model.unwrap_or_default(),
        temperature: p.prompt.temperature,
        max_tokens: p.prompt.max_tokens,
        is_active: p.is_active,
        usage_count: u64::try_from(p.usage_count).unwrap_or(0),
        avg_latency_ms: p.avg_latency_ms,
        success_rate: p.success_rate,
        created_at: Some(prost_types::Timestamp {
            seconds: p.created_at_ms.div_euclid(1000),
            nanos: (p.created_at_ms.rem_euclid(1000) * 1_000_000) as i32,
        }),
        created_by: p.created_by,
    }
}

impl PromptAdminApi {
    async fn find(
        &self,
        team: &str,
        key: &str,
        version: u32,
    ) -> Result<pb::PromptVersion, Failure> {
        self.prompts
            .list(Some(team), Some(key))
            .await
            .map_err(failure)?
            .into_iter()
            .find(|p| p.prompt.version == version)
            .map(to_pb)
            .ok_or_else(|| {
                Failure::NotFound(format!(
                    "no version {version} of prompt `{key}` for team `{team}`"
                ))
            })
    }
}

#[tonic::async_trait]
impl PromptAdmin for PromptAdminApi {
    async fn list_prompts(
        &self,
        request: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsResponse>, Status> {
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let (_, extensions, req) = request.into_parts();
        self.admin(&extensions, &req.team_id)
            .map_err(|f| to_status(f, &trace_id))?;
        let team = if req.team_id == "*" {
            None
        } else {
            Some(req.team_id.as_str())
        };
        if let Some(t) = team {
            check_team(t).map_err(|f| to_status(f, &trace_id))?;
        }
        let key = (!req.prompt_key.is_empty()).then_some(req.prompt_key.as_str());
        let prompts = self
            .prompts
            .list(team, key)
            .await
            .map_err(|e| to_status(failure(e), &trace_id))?;
        Ok(super::reply(
            &trace_id,
            pb::ListPromptsResponse {
                prompts: prompts.into_iter().map(to_pb).collect(),
            },
        ))
    }

    async fn create_prompt_version(
        &self,
        request: Request<pb::CreatePromptVersionRequest>,
    ) -> Result<Response<pb::CreatePromptVersionResponse>, Status> {
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let (metadata, extensions, req) = request.into_parts();
        let result = async {
            check_team(&req.team_id)?;
            let principal = self.admin(&extensions, &req.team_id)?;
            let actor = self.actor(&metadata, &principal);
            let new = NewPrompt {
                team_id: req.team_id.clone(),
                key: req.prompt_key.clone(),
                system: req.system_prompt,
                user_template: req.user_prompt_template,
                model: (!req.model.is_empty()).then_some(req.model),
                temperature: req.temperature,
                max_tokens: req.max_tokens,
                activate: req.activate,
            };
            let version = self.prompts.add(new, &actor, chrono::Utc::now().timestamp_millis()).await.map_err(failure)?;
            tracing::info!(%trace_id, %actor, team = %req.team_id, key = %req.prompt_key, version, "prompt version created");
            self.find(&req.team_id, &req.prompt_key, version).await
        }
        .await;
        let prompt = result.map_err(|f| to_status(f, &trace_id))?;
        Ok(super::reply(
            &trace_id,
            pb::CreatePromptVersionResponse {
                prompt: Some(prompt),
            },
        ))
    }

    async fn activate_prompt_version(
        &self,
        request: Request<pb::ActivatePromptVersionRequest>,
    ) -> Result<Response<pb::ActivatePromptVersionResponse>, Status> {
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let (metadata, extensions, req) = request.into_parts();
        let result = async {
            check_team(&req.team_id)?;
            let principal = self.admin(&extensions, &req.team_id)?;
            let actor = self.actor(&metadata, &principal);
            if req.prompt_key.is_empty() {
                return Err(Failure::invalid("prompt_key", "is required"));
            }
            self.prompts
                .activate(&req.team_id, &req.prompt_key, req.version, &actor, chrono::Utc::now().timestamp_millis())
                .await
                .map_err(failure)?;
            tracing::info!(%trace_id, %actor, team = %req.team_id, key = %req.prompt_key, version = req.version, "prompt version activated");
            self.find(&req.team_id, &req.prompt_key, req.version).await
        }
        .await;
        let prompt = result.map_err(|f| to_status(f, &trace_id))?;
        Ok(super::reply(
            &trace_id,
            pb::ActivatePromptVersionResponse {
                prompt: Some(prompt),
            },
        ))
    }
}
