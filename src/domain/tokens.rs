//! Token counts by the model family's tokenizer (`tiktoken-rs` for OpenAI, an over-count
//! otherwise); reservations and agents' prompt budgets count alike (see `usage::estimate`).

/// A model family's tokenizer.
pub(crate) enum Tokenizer {
    O200k,
    Cl100k,
    /// One token per three bytes.
    Approximate,
}

/// The tokenizer of `model`'s family.
pub(crate) fn tokenizer_for(model: &str) -> Tokenizer {
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

/// How an estimate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Never below the real count; no tokenizer (see the module docs).
    Bound,
    /// The model's own tokenizer where we have it (slow, memory-hungry).
    Exact,
}

/// Whether `model` has a real tokenizer, so [`Precision::Exact`] can be below the bound.
pub fn has_tokenizer(model: &str) -> bool {
    !matches!(tokenizer_for(model), Tokenizer::Approximate)
}

/// Tokens in `text`: the free bound when within `limit`, else the exact count.
pub fn count_within(model: &str, text: &str, limit: u64) -> u64 {
    let bound = count(model, text, Precision::Bound);
    if bound <= limit {
        bound
    } else {
        count(model, text, Precision::Exact)
    }
}

/// Tokens in `text` for `model`.
pub fn count(model: &str, text: &str, precision: Precision) -> u64 {
    match (tokenizer_for(model), precision) {
        (Tokenizer::Approximate, _) => (text.len() as u64).div_ceil(3),
        // Every token of a byte-level BPE is at least one byte.
        (_, Precision::Bound) => text.len() as u64,
        (Tokenizer::O200k, Precision::Exact) => tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
        (Tokenizer::Cl100k, Precision::Exact) => tiktoken_rs::cl100k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
    }
}
