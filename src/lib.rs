//! agent-gateway: a pingora reverse proxy that serves v1 and v2 of the Agent REST Service in
//! front of a backend that speaks only v2.
//!
//! # Layout
//! Each folder is one layer; a layer uses only the ones listed above it.
//! - [`config`]: the TOML file as written, and the validated [`config::Snapshot`] the gateway runs on.
//! - [`http1`]: the HTTP/1.1 codec over bytes: heads, framing, chunked bodies, writers. Pure.
//! - [`api`]: the Agent API surface: the operation table, routes, body schemas, OpenAPI, the gateway's own answers.
//! - [`policy`]: per-request decisions as plain functions: admission, auth, retirement, rate limits (local, or shared in Redis), request ids.
//! - [`observe`]: what happened to each request: the record, metrics, the access log, v1 usage.
//! - [`proxy`]: the data plane: client connections, the request pipeline, backends, the pool, health checks.
//! - [`app`]: process assembly: the pingora server, live config reload, signals, the admin listener, logging.
//! - [`tools`]: programs beside the gateway: the mock v2 backend and the load generator.
//!
//! The command line (`src/main.rs`, `src/cli/`) is the binary's own; errors become `anyhow` there.
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod config;
pub mod http1;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod tools;
