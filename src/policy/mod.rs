//! Per-request policy as plain functions over plain data: what the gateway decides about a
//! request before and apart from any I/O. One decision needs I/O by nature: a rate limit the
//! replicas share, whose state lives in Redis ([`rate_limit::redis`]); it sits behind the same
//! [`rate_limit::Limiter`] trait as the in-process buckets. The backend's addresses have their
//! decisions too ([`backend`]: the rotation, DNS refresh, the connection budget, ejection).

pub mod admin;
pub mod admit;
pub mod auth;
pub mod backend;
pub mod client;
pub mod headers;
pub mod rate_limit;
pub mod request;
pub mod request_id;
pub mod retirement;
pub mod throttle;
