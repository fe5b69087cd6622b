//! What happened to each request: the per-request record, the metrics, access log and span
//! made from it, the count of requests being served, tracing's context and export, the retirement plan as metrics, and who still
//! calls v1 (one gateway's count, or the fleet's from Prometheus, through its query API), and
//! the retirement board's figures made of them; the backend's addresses and names
//! ([`backend`]).

pub mod access_log;
pub mod backend;
pub mod board;
pub mod exchange;
pub mod fleet;
pub mod in_flight;
pub mod log_sink;
pub mod prometheus;
pub mod retirement;
pub mod spans;
pub mod telemetry;
pub mod trace;
pub mod usage;
