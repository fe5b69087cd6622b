//! What happened to each request: the per-request record, the metrics and access log made
//! from it, the retirement plan as metrics, and who still calls v1 (one gateway's count, or
//! the fleet's from Prometheus).

pub mod exchange;
pub mod fleet;
pub mod retirement;
pub mod telemetry;
pub mod usage;
