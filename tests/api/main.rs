//! End-to-end tests of the gRPC API against the real server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

mod agents;
mod auth;
mod cli;
mod cluster;
mod common;
mod connections;
mod console;
mod crash;
mod deadlines;
mod docs_commands;
mod errors;
mod fleet;
mod guardrails;
mod health;
mod interop;
mod metering;
mod observability;
mod probes;
mod routing;
mod rpcs;
mod storage;
mod tasks;
mod tls;
mod tools;
mod trace;
mod upstream_tls;
mod web;
