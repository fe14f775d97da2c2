//! A call's model calls (`tasks::Session`): the prompt resolved for the
//! team, and each model call reserved, routed and logged.

use super::Call;
use crate::{
    config::{TargetConfig, guardrails::Stage},
    domain::{
        ChatMessage, Completion, CompletionRequest, JsonSchemaFormat, ToolChoice, completion::Role,
    },
    guardrails, prompts,
    router::RouteOptions,
    tasks::{Rendered, Session, TaskError, template_error},
};
use std::collections::BTreeMap;

impl Session for Call {
    async fn render(
        &self,
        key: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Rendered, TaskError> {
        let team = &self.ctx.team_id;
        let prompt = match self.pipeline.inner.prompts.resolve(team, key).await {
            Ok(p) => p,
            Err(e) => {
                // The built-in default keeps the product working without the store.
                tracing::warn!(trace_id = %self.ctx.trace_id, error = %e, key, "prompt store unavailable; using the built-in prompt");
                prompts::builtin(key)
            }
        };
        self.rendered(prompt, vars)
    }

    async fn render_named(
        &self,
        key: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Rendered, TaskError> {
        let team = &self.ctx.team_id;
        // Version 0 is the built-in: a named key has none to fall back on, nor a store
        // that cannot be read (the caller asked for this prompt, not another).
        match self.pipeline.inner.prompts.resolve(team, key).await {
            Ok(prompt) if prompt.version > 0 => self.rendered(prompt, vars),
            Ok(_) => Err(TaskError::PromptNotFound(key.to_owned())),
            Err(e) => Err(TaskError::PromptStore(e.to_string())),
        }
    }

    async fn complete<T: Send>(
        &self,
        task: &str,
        prompt: &Rendered,
        format: Option<JsonSchemaFormat>,
        parse: impl Fn(&Completion) -> Result<T, String> + Send + Sync,
    ) -> Result<(T, Completion), TaskError> {
        let chain = self.pipeline.router().chain(task)?;
        let options = RouteOptions {
            priority: self.ctx.priority,
            primary_model: prompt.prompt.model.clone(),
        };
        let request = self.request(task, prompt, format);
        self.routed(task, chain, &request, &options, parse).await
    }

    fn answered_by_rule(&self, key: &str) {
        self.log().prompt = Some((String::new(), key.to_owned(), 0));
    }
}

impl Call {
    /// `prompt` rendered with `vars`, and remembered as the call's prompt.
    fn rendered(
        &self,
        prompt: prompts::Prompt,
        vars: &BTreeMap<String, String>,
    ) -> Result<Rendered, TaskError> {
        self.log().prompt(&prompt);
        // One budget for both texts: together they are what is sent.
        let limit = self.pipeline.inner.config.server.max_prompt_bytes;
        let system = prompts::render_bounded(&prompt.system, vars, limit)
            .map_err(|e| template_error(e, &prompt, vars))?;
        let user = prompts::render_bounded(&prompt.user_template, vars, limit - system.len())
            .map_err(|e| template_error(e, &prompt, vars))?;
        Ok(Rendered {
            prompt,
            system,
            user,
        })
    }

    /// One model call of `request` over `chain` under the task's guardrails
    /// and PII masking (SPEC §15): the request masked, its user messages
    /// screened, the answer screened then restored before it is parsed, so
    /// a redaction (or an original put back) is what the caller gets; the
    /// classifiers judge it after. An answer blocked is the call's error,
    /// not a malformed answer: no other target is tried.
    pub(super) async fn routed<T: Send>(
        &self,
        task: &str,
        chain: &[TargetConfig],
        request: &CompletionRequest,
        options: &RouteOptions,
        parse: impl Fn(&Completion) -> Result<T, String> + Send + Sync,
    ) -> Result<(T, Completion), TaskError> {
        let guardrails = self.task_guardrails(task);
        let mut pii = self.task_pii(task);
        if guardrails.is_empty() && pii.is_none() {
            return self.route(task, chain, request, options, parse).await;
        }
        // Masked first: guardrails, logs and the provider see placeholders only.
        let masked = pii.as_mut().map(|p| p.mask(request));
        let request = masked.as_ref().unwrap_or(request);
        let screened = self.screen_request(&guardrails, task, request).await?;
        let request = screened.as_ref().unwrap_or(request);
        let shown = |text: &str| {
            pii.as_ref()
                .map_or_else(|| text.to_owned(), |p| p.shown(text))
        };
        let answer = |c: &Completion| match guardrails::screen(&guardrails, Stage::Output, &c.text)
        {
            Err(blocked) => Ok(Err(blocked)),
            Ok(screened) => {
                let mut seen = Completion {
                    text: shown(&screened.text),
                    ..c.clone()
                };
                if let Some(p) = &pii {
                    p.show_calls(&mut seen.tool_calls);
                }
                parse(&seen).map(|value| Ok((value, screened)))
            }
        };
        let (value, mut completion) = self.route(task, chain, request, options, answer).await?;
        // Classifiers are model calls: they judge the answer once it is in.
        let value = match value {
            Ok((value, screened)) => (self.pipeline)
                .classified(&self.ctx, &guardrails, Stage::Output, screened)
                .await
                .map(|screened| (value, screened)),
            Err(blocked) => Err(blocked),
        };
        match value {
            Ok((value, screened)) => {
                self.report(&screened.findings, task, &completion.text, true)
                    .await?;
                completion.text = shown(&screened.text);
                if let Some(p) = &pii {
                    p.show_calls(&mut completion.tool_calls);
                }
                Ok((value, completion))
            }
            Err(blocked) => Err(self.blocked(blocked, task, &completion.text, true).await),
        }
    }

    /// [`Call::routed`] without guardrails: reserved at its worst case
    /// (priced as called: a prompt's model override at the primary), routed,
    /// and every attempt logged.
    async fn route<T: Send>(
        &self,
        task: &str,
        chain: &[TargetConfig],
        request: &CompletionRequest,
        options: &RouteOptions,
        parse: impl Fn(&Completion) -> Result<T, String> + Send + Sync,
    ) -> Result<(T, Completion), TaskError> {
        self.reserve(task, &options.chain_as_called(chain), request)
            .await?;
        let router = self.pipeline.router();
        let routed = router
            .run(chain, request, self.ctx.deadline, options, parse)
            .await;
        let pricing = self.pipeline.meter().pricing();
        match routed {
            Ok(routed) => {
                self.audit_answer(&routed.completion);
                let mut log = self.log();
                log.add(&routed.attempts, pricing);
                log.served = Some((routed.provider, routed.model, routed.degraded));
                drop(log);
                Ok((routed.value, routed.completion))
            }
            Err(err) => {
                self.log().add(err.attempts(), pricing);
                Err(err.into())
            }
        }
    }

    /// One model call's request: the prompt version's overrides, then the task's.
    pub(super) fn request(
        &self,
        task: &str,
        prompt: &Rendered,
        format: Option<JsonSchemaFormat>,
    ) -> CompletionRequest {
        let task_cfg = self.pipeline.inner.config.tasks.get(task);
        CompletionRequest {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            model: String::new(),
            system: Some(prompt.system.clone()),
            messages: vec![ChatMessage {
                role: Role::User,
                content: prompt.user.clone(),
                ..Default::default()
            }],
            temperature: prompt
                .prompt
                .temperature
                .or_else(|| task_cfg.and_then(|t| t.temperature)),
            max_tokens: prompt
                .prompt
                .max_tokens
                .or_else(|| task_cfg.map(|t| t.max_tokens))
                .unwrap_or(512),
            response_format: format,
            trace_id: self.ctx.trace_id.clone(),
            traceparent: self.ctx.traceparent.clone(),
            deadline: self.ctx.deadline,
        }
    }
}
