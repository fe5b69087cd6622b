//! agent-gateway: a pingora reverse proxy that serves v1 and v2 of the Agent REST Service in
//! front of a backend that speaks only v2.
//!
//! # Layout
//! - [`config`]: the TOML file ([`config::file`]) and the validated [`config::Snapshot`].
//! - [`route`]: which operation a path names, and the upstream path it becomes. Pure.
//! - [`auth`]: agent id and token checks against the snapshot. Pure.
//! - [`plan`]: the whole per-request decision (route, auth, service code). Pure.
//! - [`schema`]: the spec's request body schemas as data, and the body validator. Pure.
//! - [`openapi`]: the OpenAPI document, generated from the routing table and the schemas.
//! - [`retirement`]: v1 deprecation headers, per-agent policy, sunset and brownouts. Pure.
//! - [`reply`]: the gateway's own answers, one body shape.
//! - [`http1`]: HTTP/1.1 heads, body framing and chunked decoding over bytes. Pure.
//! - [`proxy`]: the pingora glue that carries out a plan: body, upstream, response;
//!   [`upstream_pool`]: kept-alive backend connections.
//! - [`exchange`] and [`telemetry`]: the per-request record, metrics and access log;
//!   [`usage`]: which agents still call v1 (`/v1-usage`).
//! - [`reload`]: the live snapshot store and its triggers; [`signals`]: SIGHUP, SIGTERM, SIGQUIT.
//! - [`health`]: active upstream health checks and readiness; [`rate_limit`]: per-agent buckets.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz` on their own listener.
//! - [`mock_backend`]: a stand-in v2 service for the demo and tests.
//! - [`load`]: `agent-gateway load`, a load generator that speaks the Agent API.
//! - [`server`]: assembles the pingora server; [`logging`]: the tracing subscriber.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod config;
pub mod exchange;
pub mod health;
pub mod http1;
pub mod load;
pub mod logging;
pub mod mock_backend;
pub mod openapi;
pub mod plan;
pub mod proxy;
pub mod rate_limit;
pub mod reload;
pub mod reply;
pub mod request_id;
pub mod retirement;
pub mod route;
pub mod schema;
pub mod server;
pub mod signals;
pub mod telemetry;
pub mod upstream_pool;
pub mod usage;
