//! Provider conformance suite: every adapter against the same scenarios
//! (see `harness.rs`), each adapter module supplying a [`harness::Fixture`]
//! of recorded wire traffic; local fake upstreams only.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

mod anthropic;
mod fuzz;
mod gemini;
mod harness;
mod openai;
mod openai_compatible;
mod openai_tools;
mod perplexity;
