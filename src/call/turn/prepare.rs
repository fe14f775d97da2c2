//! Before a turn's first event: agent found, conversation taken, prompt
//! assembled, tools listed. A failure here gives the conversation back.

use super::{
    super::{CallContext, CallError, Pipeline},
    guard::TurnGuard,
    held::Resumed,
    history::Overflow,
    lease::Held,
};
use crate::{
    agent::{
        AgentError,
        conversations::{self, Acquired, Conversation},
        prompt::{self, Assembled, Budgets, Layers, Preferences, Retrieved},
    },
    auth::Principal,
    config::agents::AgentConfig,
    domain::{ChatMessage, ToolSpec, completion::Role},
};
use std::sync::Arc;
use tokio::time::Instant;

/// How long a turn's hold on its conversation outlives its deadline: the
/// conversation of a replica that died mid-turn is free this long after.
const LEASE_SLACK_MS: i64 = 30_000;

/// One turn as asked for.
#[derive(Debug, Clone, Default)]
pub struct TurnRequest {
    pub agent: String,
    /// The conversation to continue; `None` starts one.
    pub conversation_id: Option<String>,
    pub message: String,
    /// Layer 3.
    pub preferences: Preferences,
    /// Layer 4.
    pub retrieved: Vec<Retrieved>,
    /// Settles the conversation's held tool calls as decided, then goes
    /// on, with no message (SPEC §14.1).
    pub resume: bool,
}

/// A turn ready to run.
pub(super) struct Prepared {
    pub name: String,
    pub agent: AgentConfig,
    pub conversation: Conversation,
    /// The lease's holder.
    pub token: String,
    /// Gives the conversation back unless the turn is stored.
    pub held: Held,
    /// The system prompt: layers 1-4 (and the memory instruction).
    pub system: String,
    /// Layer 5: the kept history and the new message, last.
    pub messages: Vec<ChatMessage>,
    /// The tools offered, in our names.
    pub tools: Vec<ToolSpec>,
    /// Every tool the agent's patterns allow, offered or not: a call of one
    /// maps back to its name, and the entry point says why it is refused.
    pub known: Vec<String>,
    /// The governed prompt: `(owner team, key, version)`; version 0 is none.
    pub prompt: (String, String, u32),
    /// A resumed turn's held calls and their decisions.
    pub resumed: Resumed,
    /// The agent's guardrails and masker, if it lists any.
    pub guard: Option<Arc<TurnGuard>>,
}

/// What `assemble` gives a turn.
struct Assembly {
    system: String,
    messages: Vec<ChatMessage>,
    tools: Vec<ToolSpec>,
    prompt: (String, String, u32),
    resumed: Resumed,
}

/// Unix ms now.
pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Pipeline {
    /// Takes the turn's conversation and assembles its first request.
    pub(super) async fn prepare(
        &self,
        ctx: &CallContext,
        principal: &Principal,
        mut req: TurnRequest,
    ) -> Result<Prepared, CallError> {
        let Some(agent) = self.config().agents.get(&req.agent).cloned() else {
            let known = self.config().agents.keys().cloned().collect();
            return Err(AgentError::UnknownAgent {
                name: req.agent,
                known,
            }
            .into());
        };
        check_message(&req)?;
        // Screened before the conversation is taken: a block leaves nothing to give back.
        let guard = TurnGuard::of(self, &agent);
        if let Some(guard) = &guard {
            let (message, retrieved) = (&mut req.message, &mut req.retrieved);
            self.screen_turn(ctx, guard, &req.agent, message, retrieved)
                .await?;
        }
        let store = self.store();
        let now = now_ms();
        let left = ctx.deadline.saturating_duration_since(Instant::now());
        let lease_until = now
            .saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX))
            .saturating_add(LEASE_SLACK_MS);
        let token = uuid::Uuid::now_v7().simple().to_string();
        let storage = |e: crate::store::StoreError| CallError::Storage(e.to_string());
        // Row and lease ride the ledger's group commit; the turn's end waits for disk.
        let (conversation, mut held) = match &req.conversation_id {
            None => {
                let (conversation, insert) = conversations::create(
                    &ctx.team_id,
                    &req.agent,
                    &principal.name,
                    now,
                    lease_until,
                    &token,
                );
                // Armed before the write is queued: a caller gone from here gives it back.
                let held = Held::new(self, &ctx.team_id, &conversation.id, &token, true);
                if !super::lease::write(self, &ctx.team_id, vec![insert], false, Vec::new()).await?
                {
                    return Err(CallError::Storage(
                        "a new conversation's row was not written".into(),
                    ));
                }
                (conversation, held)
            }
            Some(id) => {
                let mut held = Held::new(self, &ctx.team_id, id, &token, false);
                let lease = conversations::acquire(&ctx.team_id, id, now, lease_until, &token);
                let taken =
                    super::lease::write(self, &ctx.team_id, vec![lease], false, Vec::new()).await?;
                match conversations::acquired(store, &ctx.team_id, id, now, taken)
                    .await
                    .map_err(storage)?
                {
                    Acquired::Held(c) => {
                        held.holds(&c);
                        (c, held)
                    }
                    Acquired::Busy => {
                        held.let_go();
                        return Err(AgentError::ConversationBusy(id.clone()).into());
                    }
                    Acquired::NotFound => {
                        held.let_go();
                        return Err(AgentError::ConversationNotFound(id.clone()).into());
                    }
                }
            }
        };
        let assembled = self
            .assemble(ctx, principal, &agent, &conversation, &token, &req)
            .await;
        match assembled {
            Ok(Assembly {
                system,
                messages,
                tools,
                prompt,
                resumed,
            }) => Ok(Prepared {
                known: self
                    .toolbox()
                    .registry
                    .all()
                    .into_iter()
                    .filter(|t| crate::agent::allows(&agent.tools, &t.name))
                    .map(|t| t.name.clone())
                    .collect(),
                name: req.agent,
                agent,
                conversation,
                token,
                held,
                system,
                messages,
                tools,
                prompt,
                resumed,
                guard,
            }),
            Err(e) => {
                held.release(ctx).await;
                Err(e)
            }
        }
    }

    async fn assemble(
        &self,
        ctx: &CallContext,
        principal: &Principal,
        agent: &AgentConfig,
        conversation: &Conversation,
        token: &str,
        req: &TurnRequest,
    ) -> Result<Assembly, CallError> {
        if conversation.agent != req.agent {
            return Err(AgentError::AgentMismatch {
                conversation: conversation.id.clone(),
                agent: conversation.agent.clone(),
            }
            .into());
        }
        let stored = self.history(agent, conversation).await?;
        let history: Vec<ChatMessage> = stored.messages.iter().map(|m| m.message.clone()).collect();
        let resumed = self
            .held(&ctx.team_id, &conversation.id, &history, req.resume)
            .await?;
        let governed = self.governed(&ctx.team_id, agent).await?;
        let governed_text = governed.as_ref().map(|p| p.system.clone());
        let summary = Some(conversation.summary.clone()).filter(|s| !s.is_empty());
        let first = layered(
            ctx,
            agent,
            governed_text.clone(),
            req,
            history.clone(),
            summary,
        )
        .await?;
        let overflow = Overflow {
            agent: &req.agent,
            config: agent,
            conversation,
            token,
            dropped: first.2,
        };
        let (system, messages) = match self.overflowed(ctx, &stored, overflow).await? {
            // The summary stands in for what was left out.
            Some(summary) => {
                let kept = history.get(first.2..).unwrap_or_default().to_vec();
                let again = layered(ctx, agent, governed_text, req, kept, Some(summary)).await?;
                (again.0, again.1)
            }
            None => (first.0, first.1),
        };
        let tools = self.offered_tools(principal, &ctx.team_id, agent);
        let prompt = governed.map_or((String::new(), String::new(), 0), |p| {
            (p.owner, p.key, p.version)
        });
        debug_assert!(req.resume || messages.last().is_some_and(|m| m.role == Role::User));
        Ok(Assembly {
            system,
            messages,
            tools,
            prompt,
            resumed,
        })
    }

    /// Layer 2: the active stored version only. A store that cannot be
    /// read fails the turn (UNAVAILABLE) rather than drop the governed
    /// layer.
    async fn governed(
        &self,
        team: &str,
        agent: &AgentConfig,
    ) -> Result<Option<crate::prompts::Prompt>, CallError> {
        let Some(key) = &agent.prompt_key else {
            return Ok(None);
        };
        match self.inner.prompts.resolve(team, key).await {
            Ok(p) if p.version > 0 => Ok(Some(p)),
            Ok(_) => Ok(None),
            Err(e) => Err(CallError::Storage(e.to_string())),
        }
    }

    /// The tools the agent may offer this caller: its patterns over what
    /// the policy gate shows, newest version first (a call by name runs
    /// that one).
    fn offered_tools(
        &self,
        principal: &Principal,
        team: &str,
        agent: &AgentConfig,
    ) -> Vec<ToolSpec> {
        if agent.tools.is_empty() {
            return Vec::new();
        }
        let mut offered: Vec<_> = self
            .tools_for(principal, team)
            .into_iter()
            .filter(|t| crate::agent::allows(&agent.tools, &t.name))
            .collect();
        offered.dedup_by(|a, b| a.name == b.name);
        offered
            .into_iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.input_schema.clone(),
            })
            .collect()
    }
}

/// A turn has a message, or resumes a conversation with none.
fn check_message(req: &TurnRequest) -> Result<(), CallError> {
    let invalid =
        |field: &str, why: &str| Err(CallError::Invalid(vec![(field.into(), why.into())]));
    match (req.resume, req.message.trim().is_empty()) {
        (false, true) => invalid("message", "is required"),
        (true, false) => invalid("message", "must be empty when `resume` is set"),
        (true, true) if req.conversation_id.is_none() => {
            invalid("conversation_id", "is required when `resume` is set")
        }
        _ => Ok(()),
    }
}

/// Layers 1 to 5 assembled within their budgets, off the runtime's threads
/// (a real tokenizer is CPU work): the system prompt, the messages and how
/// many of `history`'s oldest were left out, or a refusal when the fixed
/// layers leave the window no room.
async fn layered(
    ctx: &CallContext,
    agent: &AgentConfig,
    governed_text: Option<String>,
    req: &TurnRequest,
    history: Vec<ChatMessage>,
    summary: Option<String>,
) -> Result<(String, Vec<ChatMessage>, usize), CallError> {
    // The primary model's tokenizer counts the budgets.
    let model = agent.chain.first().map_or("", |t| t.model.as_str());
    // The structured-answer instruction is layer 1's, counted against the window.
    let core = crate::agent::core_layer(agent);
    let closing = crate::agent::safety::tool_guardrail(agent);
    let fixed_text = crate::agent::fixed_text(agent, governed_text.as_deref());
    let (preferences, retrieved, message) = (
        req.preferences.clone(),
        req.retrieved.clone(),
        req.message.clone(),
    );
    let budgets = Budgets {
        preferences: agent.preferences_token_budget,
        retrieved: agent.retrieved_token_budget,
        history: agent.history_token_budget,
    };
    let model = model.to_owned();
    let (variable, window) = (agent.variable_tokens(), u64::from(agent.context_window));
    let assembled = tokio::task::spawn_blocking(move || {
        let assembled = prompt::assemble(
            &model,
            &Layers {
                core: &core,
                system: governed_text.as_deref(),
                preferences: &preferences,
                retrieved: &retrieved,
                history: &history,
                summary: summary.as_deref(),
                message: &message,
                closing,
            },
            &budgets,
        )?;
        // Counted with the bound: over the window, count exactly before refusing.
        let mut fixed = assembled.counts.fixed_tokens;
        if fixed.saturating_add(variable) > window {
            fixed = prompt::tokens(&model, &fixed_text);
        }
        Ok::<_, prompt::PromptError>((assembled, fixed))
    })
    .await
    .map_err(|e| CallError::Storage(format!("assembling the prompt failed: {e}")))?;
    let (
        Assembled {
            system,
            messages,
            counts,
        },
        fixed,
    ) = assembled.map_err(AgentError::from)?;
    let needed = fixed.saturating_add(variable);
    if needed > window {
        return Err(AgentError::WindowExceeded {
            tokens: needed,
            window: agent.context_window,
        }
        .into());
    }
    tracing::debug!(
        trace_id = %ctx.trace_id,
        retrieved_kept = counts.retrieved_kept,
        retrieved_dropped = counts.retrieved_dropped,
        history_kept = counts.history_kept,
        history_dropped = counts.history_dropped,
        summary_tokens = counts.summary_tokens,
        "agent prompt assembled"
    );
    Ok((system, messages, counts.history_dropped))
}
