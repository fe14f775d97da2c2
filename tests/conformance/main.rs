//! Provider conformance suite: every adapter against the same scenarios
//! (see `harness.rs`), each adapter module supplying a [`harness::Fixture`]
//! of recorded wire traffic; local fake upstreams only.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

mod anthropic;
mod anthropic_tools;
mod fuzz;
mod gemini;
mod gemini_tools;
mod harness;
mod openai;
mod openai_compatible;
mod openai_tools;
mod perplexity;
mod tool_history;
