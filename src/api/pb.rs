//! Code generated from `proto/ai/orchestrator/v1/orchestrator.proto`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("ai.orchestrator.v1");

/// Encoded descriptor set of the public proto, served by server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("orchestrator_descriptor");
