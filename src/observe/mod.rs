//! What happened to each request: the per-request record, the metrics, access log and span
//! made from it, tracing's context and export, and who still calls v1.

pub mod exchange;
pub mod spans;
pub mod telemetry;
pub mod trace;
pub mod usage;
