//! Token estimates for reservations, before any provider call.
//!
//! OpenAI model families are counted with their real tokenizer
//! (`tiktoken-rs`: `o200k_base` for gpt-4o/4.1/5 and o-series,
//! `cl100k_base` for gpt-4/3.5). Other models (Claude, Gemini, Llama, ...)
//! have no public Rust tokenizer here, so they use the documented
//! approximation of one token per three bytes of UTF-8, which over-counts
//! English (≈ 4 bytes/token) on purpose: a reservation should not be smaller
//! than the call. Every message adds a few tokens of chat framing.

use crate::providers::CompletionRequest;

/// Framing tokens per message (role markers), as in OpenAI's counting guide.
const PER_MESSAGE: u64 = 4;
/// Tokens priming the reply.
const PER_REPLY: u64 = 3;

enum Tokenizer {
    O200k,
    Cl100k,
    Approximate,
}

fn tokenizer_for(model: &str) -> Tokenizer {
    let m = model.to_ascii_lowercase();
    let o200k = [
        "gpt-4o",
        "chatgpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-5",
        "o1",
        "o3",
        "o4",
    ];
    if o200k.iter().any(|p| m.starts_with(p)) {
        Tokenizer::O200k
    } else if m.starts_with("gpt-4") || m.starts_with("gpt-3.5") {
        Tokenizer::Cl100k
    } else {
        Tokenizer::Approximate
    }
}

/// Builds the tokenizer tables now (they take a while to build, longer in a
/// debug build) so the first requests do not pay for it. Call from a
/// blocking thread.
pub fn warm_up() {
    let _ = tiktoken_rs::o200k_base_singleton();
    let _ = tiktoken_rs::cl100k_base_singleton();
}

/// Tokens in `text` for `model`.
pub fn count(model: &str, text: &str) -> u64 {
    match tokenizer_for(model) {
        Tokenizer::O200k => tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
        Tokenizer::Cl100k => tiktoken_rs::cl100k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
        Tokenizer::Approximate => (text.len() as u64).div_ceil(3),
    }
}

/// Estimated input tokens of `req` sent to `model`.
pub fn input_tokens(model: &str, req: &CompletionRequest) -> u64 {
    let system = req
        .system
        .as_deref()
        .map_or(0, |s| count(model, s) + PER_MESSAGE);
    let schema = req
        .response_format
        .as_ref()
        .map_or(0, |f| count(model, &f.schema.to_string()));
    let messages: u64 = req
        .messages
        .iter()
        .map(|m| count(model, &m.content) + PER_MESSAGE)
        .sum();
    system + schema + messages + PER_REPLY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_use_their_tokenizer() {
        // "hello world" is two tokens in both OpenAI encodings.
        assert_eq!(count("gpt-4o-mini", "hello world"), 2);
        assert_eq!(count("gpt-4", "hello world"), 2);
        // Other models over-count rather than under-count.
        assert_eq!(count("claude-3-haiku", "hello world"), 4);
    }
}
