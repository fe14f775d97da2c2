//! Token counts with the model family's tokenizer (`tiktoken-rs` for
//! OpenAI families; a documented over-count for the rest): reservations
//! (`usage::estimate`) and the agents' prompt budgets count with the same
//! rules. See `usage::estimate` for the two precisions.

/// A model family's tokenizer.
pub(crate) enum Tokenizer {
    /// `o200k_base`.
    O200k,
    /// `cl100k_base`.
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

/// Whether [`Precision::Exact`] can give a smaller estimate than the bound
/// for `model` (it has a real tokenizer).
pub fn has_tokenizer(model: &str) -> bool {
    !matches!(tokenizer_for(model), Tokenizer::Approximate)
}

/// Tokens in `text` for `model` as far as a check against `limit` needs
/// them: the free bound when it is within `limit` (the text fits whatever
/// the exact count is), else the exact count.
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
