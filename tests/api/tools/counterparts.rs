//! Reference implementations nobody here wrote: the official
//! `@modelcontextprotocol/server-everything` (npm), the official Python MCP
//! SDK (`mcp` on PyPI), the `hypercorn` HTTP/2 server (PyPI, for the
//! provider connection tests), Python's official gRPC client (`grpcio`
//! and its tools, for the API interop test), and OpenAI's official SDKs
//! (`openai` on PyPI and on npm) with an SSE client library (`httpx-sse`
//! over `httpx`) for the HTTP edge's tests, and `playwright-core` (npm)
//! driving Debian's Chromium for the console's, installed under
//! `target/test-deps` from the package registries on first use (`.ci/run`
//! installs them up front).

use std::{fs::File, path::PathBuf, process::Command};

/// The pinned versions.
pub const SERVER_EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";
pub const PYTHON_MCP: &str = "mcp==2.3.0";
pub const PYTHON_HYPERCORN: &str = "hypercorn==0.17.3";
// Python's gRPC client, its code generator (`grpc_tools.protoc`) and its
// rich-status decoder, with the protobuf runtime and `google.rpc` types
// they need: one release line (grpcio-tools 1.85.1 wants protobuf >= 7.35.1).
pub const PYTHON_GRPCIO: &str = "grpcio==1.85.1";
pub const PYTHON_GRPCIO_TOOLS: &str = "grpcio-tools==1.85.1";
pub const PYTHON_GRPCIO_STATUS: &str = "grpcio-status==1.85.1";
pub const PYTHON_PROTOBUF: &str = "protobuf==7.36.2";
pub const PYTHON_COMMON_PROTOS: &str = "googleapis-common-protos==1.76.0";
// OpenAI's official SDKs (the HTTP edge's callers) and an SSE client
// library. `httpx-sse` imports `httpx`, which it does not declare, and the
// Python SDK moved to `httpx2`: so `httpx` is pinned here too.
pub const PYTHON_OPENAI: &str = "openai==3.57.0";
pub const PYTHON_HTTPX_SSE: &str = "httpx-sse==0.4.3";
pub const PYTHON_HTTPX: &str = "httpx==0.28.1";
pub const NPM_OPENAI: &str = "openai@6.49.0";
// The ops console's browser tests: Playwright's driver without its browser
// downloads, driving Debian's Chromium.
pub const NPM_PLAYWRIGHT_CORE: &str = "playwright-core@1.65.2";
/// Debian's Chromium (`.ci/run` installs the `chromium` package when missing).
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Holds the lock on installing counterparts until dropped: across test
/// processes (nextest runs each test in its own, and two `npm install`s
/// into one folder leave it broken), and across threads (each call opens
/// the file anew, and `flock` locks an open file, not a process).
fn install_lock() -> File {
    std::fs::create_dir_all(deps()).unwrap();
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(deps().join(".install.lock"))
        .unwrap();
    file.lock().unwrap();
    file
}

fn deps() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-deps")
}

fn run(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `server-everything`'s entry point (installs it when missing).
pub fn server_everything() -> PathBuf {
    let _once = install_lock();
    let dir = deps();
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        run(
            "npm install server-everything",
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .arg(SERVER_EVERYTHING),
        );
    }
    entry
}

/// A Python with the MCP SDK (a venv, made when missing).
pub fn python_with_mcp() -> PathBuf {
    let _once = install_lock();
    let venv = deps().join("venv");
    let python = venv.join("bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", "import mcp, httpx2"])
            .status()
            .is_ok_and(|s| s.success());
    if !ready {
        std::fs::create_dir_all(deps()).unwrap();
        run(
            "python3 -m venv",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        );
        run(
            "pip install mcp",
            Command::new(&python).args(["-m", "pip", "install", "-q", PYTHON_MCP]),
        );
    }
    python
}

/// A Python with `hypercorn` (the same venv, made when missing).
pub fn python_with_hypercorn() -> PathBuf {
    let python = python_with_mcp();
    let _once = install_lock();
    let ready = Command::new(&python)
        .args(["-c", "import hypercorn"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        run(
            "pip install hypercorn",
            Command::new(&python).args(["-m", "pip", "install", "-q", PYTHON_HYPERCORN]),
        );
    }
    python
}

/// A Python with `grpcio`, `grpcio-tools` and `grpcio-status` (the same
/// venv, made when missing).
pub fn python_with_grpc() -> PathBuf {
    let python = python_with_mcp();
    let _once = install_lock();
    let ready = Command::new(&python)
        .args([
            "-c",
            "import grpc, grpc_tools.protoc, grpc_status.rpc_status",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        run(
            "pip install grpcio",
            Command::new(&python)
                .args(["-m", "pip", "install", "-q"])
                .args([
                    PYTHON_GRPCIO,
                    PYTHON_GRPCIO_TOOLS,
                    PYTHON_GRPCIO_STATUS,
                    PYTHON_PROTOBUF,
                    PYTHON_COMMON_PROTOS,
                ]),
        );
    }
    python
}

/// A Python with OpenAI's SDK, `httpx-sse` and `httpx` (the same venv,
/// made when missing).
pub fn python_with_openai() -> PathBuf {
    let python = python_with_mcp();
    let _once = install_lock();
    let ready = Command::new(&python)
        .args(["-c", "import openai, httpx_sse"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        run(
            "pip install openai",
            Command::new(&python)
                .args(["-m", "pip", "install", "-q"])
                .args([PYTHON_OPENAI, PYTHON_HTTPX_SSE, PYTHON_HTTPX]),
        );
    }
    python
}

/// The folder of OpenAI's Node SDK, `require`-able (installs it when missing).
pub fn node_openai() -> PathBuf {
    let _once = install_lock();
    let dir = deps();
    let package = dir.join("node_modules/openai");
    if !package.join("package.json").exists() {
        std::fs::create_dir_all(&dir).unwrap();
        run(
            "npm install openai",
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .arg(NPM_OPENAI),
        );
    }
    package
}

/// `playwright-core`'s folder (installs it when missing).
pub fn node_playwright() -> PathBuf {
    let _once = install_lock();
    let dir = deps();
    let package = dir.join("node_modules/playwright-core");
    if !package.join("package.json").exists() {
        std::fs::create_dir_all(&dir).unwrap();
        run(
            "npm install playwright-core",
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .arg(NPM_PLAYWRIGHT_CORE),
        );
    }
    package
}
