//! The prompt store as the service and the CLI open it. It refuses a system
//! prompt that leaves an agent using its key no room in its window (SPEC
//! §11.5: layers 1–2 are never cut), an unpriced model override with metering
//! on (SPEC §5: an unknown cost never counts against a cap), and a version
//! whose texts alone pass `server.max_prompt_bytes`.

use crate::{
    agent,
    config::{Config, is_priced},
    prompts::store::{ActivationCheck, ModelCheck, PromptStore},
    store::Store,
};
use std::sync::Arc;

/// The prompt store over `store`, guarded by `config`'s agents.
pub fn prompt_store(store: Store, config: &Config) -> PromptStore {
    PromptStore::new(store)
        .with_activation_check(activation_check(config))
        .with_model_check(model_check(config))
        .with_max_text_bytes(config.server.max_prompt_bytes)
}

/// A model override replaces the model of the primary target of the task
/// named by the prompt key: with metering on it must be priced there.
fn model_check(config: &Config) -> ModelCheck {
    let metered = config.metering.enabled;
    let primaries: std::collections::BTreeMap<String, String> = config
        .tasks
        .iter()
        .filter_map(|(task, t)| Some((task.clone(), t.chain.first()?.provider.clone())))
        .collect();
    let pricing = config.pricing.clone();
    Arc::new(move |key: &str, model: &str| match primaries.get(key) {
        Some(provider) if metered && !is_priced(&pricing, provider, model) => Err(format!(
            "no price for `{model}` (the primary of task `{key}` is `{provider}`): add \
             [pricing.\"{model}\"] to the config (or price = \"unknown\")"
        )),
        _ => Ok(()),
    })
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
