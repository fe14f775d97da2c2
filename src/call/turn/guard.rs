//! An agent's turn under its guardrails and PII masking (SPEC §15):
//!
//! ```text
//! input, retrieved   screened before the conversation is taken: a block
//!                    refuses the turn (GUARDRAIL_BLOCKED), nothing stored
//! each model call    its request masked; the answer held whole, screened
//!                    (`output`; a block fails the turn), then the
//!                    originals put back in its text and tool calls
//! tool_input         the arguments as the tool would get them; a block
//!                    answers the model with an error result
//! tool_output        the result before the model reads it; likewise
//! ```
//!
//! One masker serves the whole turn, so a value keeps its placeholder from
//! one model call to the next.

use super::super::{
    CallContext, CallError, Pipeline,
    guard::{Pii, events},
};
use crate::{
    agent::prompt::Retrieved,
    config::{agents::AgentConfig, guardrails::Stage},
    domain::{Completion, CompletionRequest},
    guardrails::Guardrail,
    usage::ledger::Op,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// A turn's guardrails and masker; absent when the agent lists neither.
pub(in crate::call) struct TurnGuard {
    pub list: Vec<Arc<Guardrail>>,
    pii: Option<Mutex<Pii>>,
}

impl TurnGuard {
    /// What `agent` screens and masks, if anything.
    pub fn of(pipeline: &Pipeline, agent: &AgentConfig) -> Option<Arc<Self>> {
        let list = pipeline.guardrails().listed(&agent.guardrails);
        let pii = agent.pii.as_ref().map(|p| Mutex::new(Pii::of(p)));
        (!list.is_empty() || pii.is_some()).then(|| Arc::new(Self { list, pii }))
    }

    /// Whether any guardrail looks at `stage`.
    pub fn applies(&self, stage: Stage) -> bool {
        self.list.iter().any(|g| g.applies(stage))
    }

    /// Whether a model call's answer is held until it is whole: it is
    /// screened, or placeholders in it (one may span two deltas) are put back.
    pub fn holds(&self) -> bool {
        self.applies(Stage::Output) || self.pii().is_some_and(|p| p.restore)
    }

    /// The masker, through a lock no panic can leave unusable (masking
    /// leaves it whole whatever happens).
    fn pii(&self) -> Option<MutexGuard<'_, Pii>> {
        (self.pii.as_ref()).map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A model call's request as the provider gets it.
    pub fn mask(&self, request: CompletionRequest) -> CompletionRequest {
        match self.pii() {
            Some(mut pii) => pii.mask(&request),
            None => request,
        }
    }

    /// A model's answer as the turn sees it: its text and the tool calls
    /// it wrote with the originals back, if the agent restores.
    pub fn show(&self, completion: &mut Completion) {
        if let Some(pii) = self.pii() {
            completion.text = pii.shown(&completion.text);
            pii.show_calls(&mut completion.tool_calls);
        }
    }

    /// Masked text back to what the caller wrote, with any redaction kept.
    fn unmask(&self, text: String) -> String {
        match self.pii() {
            Some(pii) => pii.masker.restore(&text),
            None => text,
        }
    }

    fn masked(&self, text: &str) -> String {
        match self.pii() {
            Some(mut pii) => pii.masker.mask(text),
            None => text.to_owned(),
        }
    }
}

impl Pipeline {
    /// The turn's message (`input`) and retrieved items (`retrieved`)
    /// screened as the provider would see them (masked), with redactions
    /// applied in place. Detections are durable before the turn goes on; a
    /// block refuses it.
    pub(super) async fn screen_turn(
        &self,
        ctx: &CallContext,
        guard: &TurnGuard,
        agent: &str,
        message: &mut String,
        retrieved: &mut [Retrieved],
    ) -> Result<(), CallError> {
        if guard.applies(Stage::Input) && !message.is_empty() {
            *message = self
                .screen_turn_text(ctx, guard, Stage::Input, message, agent)
                .await?;
        }
        if guard.applies(Stage::Retrieved) {
            for item in retrieved {
                item.text = self
                    .screen_turn_text(ctx, guard, Stage::Retrieved, &item.text, agent)
                    .await?;
            }
        }
        Ok(())
    }

    async fn screen_turn_text(
        &self,
        ctx: &CallContext,
        guard: &TurnGuard,
        stage: Stage,
        text: &str,
        agent: &str,
    ) -> Result<String, CallError> {
        let masked = guard.masked(text);
        let (findings, screened) = match self.screen_text(ctx, &guard.list, stage, &masked).await {
            Ok(screened) => (screened.findings, Ok(screened.text)),
            Err(blocked) => {
                let error = CallError::GuardrailBlocked {
                    guardrail: blocked.guardrail.clone(),
                    stage: stage.as_str(),
                    answered: false,
                };
                (vec![super::super::guard::as_finding(blocked)], Err(error))
            }
        };
        if !findings.is_empty() {
            let events = events(ctx, &findings, &format!("agent:{agent}"), &masked);
            self.ledger()
                .submit(Op::Audit(events))
                .await
                .map_err(|e| CallError::Storage(e.to_string()))?;
        }
        // Unchanged, the caller's own text stays exactly as written.
        screened.map(|screened| {
            if screened == masked {
                text.to_owned()
            } else {
                guard.unmask(screened)
            }
        })
    }
}
