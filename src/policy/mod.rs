//! Per-request policy as plain functions over plain data: what the gateway decides about a
//! request before and apart from any I/O.

pub mod admit;
pub mod auth;
pub mod headers;
pub mod rate_limit;
pub mod request_id;
pub mod retirement;
