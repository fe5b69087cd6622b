//! The shared test harness. Tests talk to real servers over the wire:
//!
//! - [`gateway`]: the gateway on a typed config ([`test_config`], changed field by field,
//!   started by [`Gateway::builder`]) on port-0 listeners, in this process or, where a process
//!   is the point, as the `agent-gateway` binary; and what a test reads back from it, each
//!   read waiting for the state it asserts.
//! - [`backend`]: a recording backend answering as the test's handler says, and the mock v2
//!   backend.
//! - [`client`]: a raw HTTP/1.1 client that sends bytes exactly as written; [`curl`] for
//!   HTTP/2.
//! - [`paused`]: the gateway, a backend and clients on a test's paused clock, for tests of
//!   timeouts that take no wall time.
//! - [`ports`]: ports no other process takes meanwhile, an address that refuses connections.
//! - [`process`]: other programs, signals, and [`wait_until`] with one bounded deadline.
//! - [`dns`]: a real DNS server whose answers the test changes.
//! - [`redis`], [`otlp`], [`python`], [`pki`], [`chromium`]: a real Redis, a recording OTLP
//!   collector, the pinned Python tools, a test CA, a headless browser; [`board`]: the
//!   retirement board's rows; [`dashboard`] and [`traffic`] for the metrics tests;
//!   [`markdown`]: the commands of the docs.
// Each test binary uses a part of the harness.
#![allow(dead_code, unused_imports)]

pub mod backend;
pub mod board;
pub mod chromium;
pub mod client;
pub mod curl;
pub mod dashboard;
pub mod dns;
pub mod gateway;
pub mod markdown;
pub mod otlp;
pub mod paused;
pub mod pki;
pub mod ports;
pub mod process;
pub mod python;
pub mod redis;
pub mod traffic;

use std::net::SocketAddr;

use agent_gateway::config::FileConfig;

pub use backend::{
    assert_sent_nowhere, assert_sent_nowhere_in_plaintext, backend_with_reset,
    held_behind_one_connection, post_on_a_thread, Action, Backend, Gate, MockBackend, Recorded,
};
pub use board::board_row;
pub use chromium::chromium;
pub use client::*;
pub use dashboard::*;
pub use gateway::{
    cli, listening_line, metric_value, replace_file, who_ended, Gateway, GatewayBuilder, ANY_PORT,
    BIN,
};
pub use ports::{free_port, loopback, ClosedPort, SilentPort};
pub use process::{signal, wait_until, which, PATIENCE};
pub use traffic::*;

/// The harness's config: [`FileConfig::for_test`] (agent `agent-1`, token `secret`) in front
/// of `upstreams`, with proxy and admin listeners on any free port ([`ANY_PORT`]). Two threads and a one-second grace period keep start and stop quick; the
/// upstream timeouts are short so tests of a dead or slow backend finish in a few seconds.
pub fn test_config(upstreams: &[SocketAddr]) -> FileConfig {
    let mut cfg = FileConfig::for_test(ANY_PORT.parse().unwrap(), upstreams);
    cfg.listen.admin = Some(ANY_PORT.into());
    cfg.server.threads = Some(2);
    cfg.server.grace_period_seconds = 1;
    cfg.upstream.connect_timeout_ms = 500;
    cfg.upstream.read_timeout_ms = 2000;
    cfg
}
