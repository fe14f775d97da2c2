# syntax=docker/dockerfile:1
# ai-orchestrator image: a release build on Debian bookworm, run on distroless
# (glibc + CA certificates, no shell, no package manager) as uid 65532.
#
#   docker build -t ai-orchestrator:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9090:9090 ai-orchestrator:0.1.0
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG RUST_VERSION=1.94

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the crate downloads and compiled dependencies between
# builds on this builder, so a source change rebuilds only this crate. The
# binary is copied out because the mounted target/ is not part of the layer.
# No protoc needed: build.rs compiles the proto with protox.
RUN --mount=type=cache,id=aio-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=aio-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=aio-target,target=/src/target,sharing=locked \
    cargo build --release --locked --bin ai-orchestrator \
 && install -D -m 0755 target/release/ai-orchestrator /out/ai-orchestrator
# The default SQLite path (data/ under the working directory) must be
# writable by the runtime user; distroless has no shell to create it later.
RUN install -d -o 65532 -g 65532 /out/data

FROM gcr.io/distroless/cc-debian12:nonroot
WORKDIR /app
COPY --from=build /out/ai-orchestrator /usr/local/bin/ai-orchestrator
COPY --from=build --chown=65532:65532 /out/data /app/data
# Sample configs: config/local.toml (mock providers) is the CLI default, so
# `docker run` works without a mounted config; production mounts its own
# (the Helm chart sets AIO_CONFIG=/etc/ai-orchestrator/config.toml).
COPY config/ /app/config/
USER 65532:65532
# Reachable from outside the container: gRPC and /metrics on all
# interfaces (the sample config binds loopback for local runs). The Helm
# chart sets both from its own values.
ENV AIO_LOG_FORMAT=json \
    AIO_SERVER__LISTEN=0.0.0.0:50051 \
    AIO_SERVER__METRICS_LISTEN=0.0.0.0:9090
EXPOSE 50051 9090
# The binary is its own gRPC health client (no shell or curl here).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ai-orchestrator", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/ai-orchestrator"]
# Any other subcommand runs in its place: `docker run IMAGE migrate`,
# `docker run IMAGE check-config`.
CMD ["serve"]
