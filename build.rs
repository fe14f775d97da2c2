//! Compiles the public proto with `protox` (pure Rust, so no system `protoc` is
//! needed) and writes the encoded descriptor set that server reflection serves.

use prost::Message;
use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/ai/orchestrator/v1/orchestrator.proto",
        "proto/ai/orchestrator/v1/prompt_admin.proto",
        "proto/ai/orchestrator/v1/tools.proto",
        "proto/ai/orchestrator/v1/audit.proto",
        "proto/ai/orchestrator/v1/agent.proto",
        "proto/ai/orchestrator/v1/approvals.proto",
        "proto/ai/orchestrator/v1/tool_admin.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    // `sqlx::migrate!` embeds the migration folders at compile time; a new
    // migration file must rebuild the crate.
    println!("cargo:rerun-if-changed=migrations");
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("orchestrator_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
