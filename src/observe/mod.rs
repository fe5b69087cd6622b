//! What happened to each request: the per-request record, the metrics and access log made
//! from it, the retirement plan as metrics, and who still calls v1.

pub mod exchange;
pub mod retirement;
pub mod telemetry;
pub mod usage;
