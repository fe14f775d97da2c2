//! A model call's worst case over its chain, reserved before the call: a
//! byte bound first, counted exactly (on a blocking thread) only when the
//! bound is refused, so its slack never refuses a call that fits (ADR 0013).

use super::Call;
use crate::{
    config::TargetConfig,
    domain::CompletionRequest,
    usage::{
        Estimate, Meter, MeterError, MeterSession,
        estimate::{self, Input, Precision},
    },
};

impl Call {
    /// Reserves the worst case of `request` over `chain` for `task`.
    pub(super) async fn reserve(
        &self,
        task: &str,
        chain: &[TargetConfig],
        request: &CompletionRequest,
    ) -> Result<(), MeterError> {
        let meter = self.pipeline.meter();
        if !meter.enabled() {
            return Ok(());
        }
        let bound = worst_case(meter, chain, request, Precision::Bound);
        let reserved = match self.meter.reserve(task, bound).await {
            Err(e)
                if MeterSession::refusal_depends_on_size(&e)
                    && chain.iter().any(|t| estimate::has_tokenizer(&t.model)) =>
            {
                let (meter, chain, request) = (meter.clone(), chain.to_vec(), request.clone());
                let exact = tokio::task::spawn_blocking(move || {
                    worst_case(&meter, &chain, &request, Precision::Exact)
                })
                .await
                .unwrap_or(bound);
                self.meter.reserve(task, exact).await.map(|()| exact)
            }
            other => other.map(|()| bound),
        }?;
        // The call's audit event shows what was held against what was spent.
        self.log().estimated(reserved.cost_micros);
        Ok(())
    }
}

/// Over `chain`: the largest input plus the output cap, and the largest cost.
fn worst_case(
    meter: &Meter,
    chain: &[TargetConfig],
    request: &CompletionRequest,
    precision: Precision,
) -> Estimate {
    // Tool calls, tool results and tool definitions are input too.
    let texts: Vec<std::borrow::Cow<'_, str>> = request
        .messages
        .iter()
        .map(|m| {
            if m.tool_calls.is_empty() && m.tool_result.is_none() {
                std::borrow::Cow::Borrowed(m.content.as_str())
            } else {
                let mut all = m.content.clone();
                for c in &m.tool_calls {
                    all.push_str(&c.name);
                    all.push_str(&c.arguments);
                }
                if let Some(r) = &m.tool_result {
                    all.push_str(&r.content);
                }
                std::borrow::Cow::Owned(all)
            }
        })
        .chain(request.tools.iter().map(|t| {
            std::borrow::Cow::Owned(format!("{} {} {}", t.name, t.description, t.parameters))
        }))
        .collect();
    let messages: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
    let input = Input {
        system: request.system.as_deref(),
        messages: &messages,
        schema: request.response_format.as_ref().map(|f| &f.schema),
    };
    let output = u64::from(request.max_tokens);
    let mut worst = Estimate {
        output_tokens: i64::from(request.max_tokens),
        ..Estimate::default()
    };
    for target in chain {
        let tokens = estimate::input_tokens(&target.model, &input, precision);
        worst.input_tokens = worst
            .input_tokens
            .max(i64::try_from(tokens).unwrap_or(i64::MAX));
        let cost = meter
            .pricing()
            .cost_micros(&target.provider, &target.model, tokens, output)
            .unwrap_or(0);
        worst.cost_micros = worst.cost_micros.max(cost);
    }
    worst
}
