//! The prompt store as the service and the CLI open it: refusing to
//! activate a system prompt that would leave an agent using its key no room
//! in its window (SPEC §11.5: layers 1–2 are never cut). A turn checks the
//! same again, for versions activated under an earlier config.

use crate::{
    agent,
    config::Config,
    prompts::store::{ActivationCheck, PromptStore},
    store::Store,
};
use std::sync::Arc;

/// The prompt store over `store`, guarded by `config`'s agents.
pub fn prompt_store(store: Store, config: &Config) -> PromptStore {
    PromptStore::new(store).with_activation_check(activation_check(config))
}

fn activation_check(config: &Config) -> ActivationCheck {
    let agents: Vec<_> = config
        .agents
        .iter()
        .filter(|(_, a)| a.prompt_key.is_some())
        .map(|(name, a)| (name.clone(), a.clone()))
        .collect();
    Arc::new(move |key: &str, system: &str| {
        for (name, a) in &agents {
            if a.prompt_key.as_deref() != Some(key) {
                continue;
            }
            let needed = agent::fixed_need(a, Some(system));
            if needed > u64::from(a.context_window) {
                return Err(format!(
                    "as layer 2 of agent `{name}`, this system prompt with the core prompt, the \
                     layer budgets and max_tokens needs {needed} tokens; its context_window is {}",
                    a.context_window
                ));
            }
        }
        Ok(())
    })
}
