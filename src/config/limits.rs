//! `[limits]` and `[validation]`: what a client may send, how slowly, and what happens to
//! bodies that break the spec's schemas.

use std::time::Duration;

use super::file::LimitsFile;
use super::{millis, Problems};
use crate::http1;

/// What happens to request bodies that break the spec's schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Answer 400 naming the field and rule; nothing reaches the backend.
    #[default]
    Enforce,
    /// Forward anyway, but count and log the violation.
    Report,
    /// Do not validate.
    Off,
}

/// Bounds on what a client may send, and how slowly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    /// How long one write to a client may wait for it to read.
    pub client_send_timeout: Duration,
    pub h2_max_concurrent_streams: u32,
}

/// Validates `[limits]`.
pub(super) fn limits(f: &LimitsFile, p: &mut Problems) -> Limits {
    for (key, value) in [
        ("limits.max_body_bytes", f.max_body_bytes),
        ("limits.max_uri_bytes", f.max_uri_bytes),
        ("limits.max_header_bytes", f.max_header_bytes),
        ("limits.max_headers", f.max_headers),
        (
            "limits.h2_max_concurrent_streams",
            f.h2_max_concurrent_streams as usize,
        ),
    ] {
        if value == 0 {
            p.push(key, "must be greater than 0");
        }
    }
    if f.max_headers > http1::MAX_HEADERS {
        p.push(
            "limits.max_headers",
            format!(
                "must be at most {} (the request parser's table)",
                http1::MAX_HEADERS
            ),
        );
    }
    Limits {
        max_body_bytes: f.max_body_bytes,
        max_uri_bytes: f.max_uri_bytes,
        max_header_bytes: f.max_header_bytes,
        max_headers: f.max_headers,
        client_header_timeout: millis(
            "limits.client_header_timeout_ms",
            f.client_header_timeout_ms,
            p,
        ),
        client_body_timeout: millis("limits.client_body_timeout_ms", f.client_body_timeout_ms, p),
        client_send_timeout: millis("limits.client_send_timeout_ms", f.client_send_timeout_ms, p),
        h2_max_concurrent_streams: f.h2_max_concurrent_streams,
    }
}
