//! Provider conformance suite: every adapter against the same scenarios
//! (see `harness.rs`), with local fake upstreams only.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

mod harness;
mod openai;
mod openai_compatible;
mod perplexity;
