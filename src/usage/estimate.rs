//! Token estimates for reservations. [`Precision::Bound`] is free and never
//! under-counts OpenAI models (a BPE token is at least a byte);
//! [`Precision::Exact`], when a cap refuses the bound, runs the real
//! tokenizer (tens of MB, built on first use). Other models: a token per
//! three bytes, over-counting English on purpose.

/// What a model call sends, as far as counting its input goes.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// System prompt.
    pub system: Option<&'a str>,
    /// Message texts, in order.
    pub messages: &'a [&'a str],
    /// Structured-output schema, when asked for.
    pub schema: Option<&'a serde_json::Value>,
}

/// Framing tokens per message (role markers), as in OpenAI's counting guide.
const PER_MESSAGE: u64 = 4;
/// Tokens priming the reply.
const PER_REPLY: u64 = 3;

pub use crate::domain::tokens::{Precision, count, has_tokenizer};
use crate::domain::tokens::{Tokenizer, tokenizer_for};

/// Bytes of `value` serialized as JSON, without building the string.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    let _ = serde_json::to_writer(&mut n, value);
    n.0
}

/// Estimated input tokens of `input` to `model`; `Exact` is CPU-heavy.
pub fn input_tokens(model: &str, input: &Input<'_>, precision: Precision) -> u64 {
    let system = input
        .system
        .map_or(0, |s| count(model, s, precision) + PER_MESSAGE);
    let schema = input.schema.map_or(0, |schema| {
        match (precision, tokenizer_for(model)) {
            (Precision::Exact, Tokenizer::O200k | Tokenizer::Cl100k) => {
                count(model, &schema.to_string(), precision)
            }
            // Same rule as `count`, from the length alone.
            (_, Tokenizer::Approximate) => (json_len(schema) as u64).div_ceil(3),
            (Precision::Bound, _) => json_len(schema) as u64,
        }
    });
    let messages = input
        .messages
        .iter()
        .map(|m| count(model, m, precision) + PER_MESSAGE)
        .fold(0_u64, u64::saturating_add);
    system
        .saturating_add(schema)
        .saturating_add(messages)
        .saturating_add(PER_REPLY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_use_their_tokenizer() {
        // "hello world" is two tokens in both OpenAI encodings.
        assert_eq!(count("gpt-4o-mini", "hello world", Precision::Exact), 2);
        assert_eq!(count("gpt-4", "hello world", Precision::Exact), 2);
        // Other models over-count rather than under-count.
        assert_eq!(count("claude-3-haiku", "hello world", Precision::Exact), 4);
        assert!(has_tokenizer("gpt-4o") && !has_tokenizer("claude-3-haiku"));
    }

    #[test]
    fn the_bound_never_under_counts() {
        let texts = [
            "hello world",
            "Yes, I'm interested - can you call me tomorrow afternoon?",
            "数据可视化 🎉🎉 1234567890 !!!???... \n\t   spaces",
            "{\"intent\":\"INTERESTED\",\"confidence\":0.92}",
        ];
        for model in ["gpt-4o-mini", "gpt-4"] {
            for text in texts {
                let exact = count(model, text, Precision::Exact);
                let bound = count(model, text, Precision::Bound);
                assert!(
                    bound >= exact,
                    "{model}: {text:?} bound {bound} < exact {exact}"
                );
            }
        }
        let schema = serde_json::json!({"type": "object", "required": ["a"]});
        assert_eq!(json_len(&schema), schema.to_string().len());
    }
}
