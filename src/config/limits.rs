//! `[limits]` and `[validation]`: what a client may send, how slowly, and what happens to
//! bodies that break the spec's schemas.

use std::time::Duration;

use super::file::LimitsFile;
use super::problems::Problems;
use crate::http1;

/// Bounds on what a client may send, and how slowly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
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
pub(super) fn limits(f: &LimitsFile, p: &mut Problems) -> LimitsConfig {
    p.positive("limits.max_body_bytes", f.max_body_bytes as u64);
    p.positive("limits.max_uri_bytes", f.max_uri_bytes as u64);
    p.positive("limits.max_header_bytes", f.max_header_bytes as u64);
    p.positive("limits.max_headers", f.max_headers as u64);
    p.positive(
        "limits.h2_max_concurrent_streams",
        u64::from(f.h2_max_concurrent_streams),
    );
    if f.max_headers > http1::MAX_HEADERS {
        p.push(
            "limits.max_headers",
            format!(
                "must be at most {} (the request parser's table)",
                http1::MAX_HEADERS
            ),
        );
    }
    LimitsConfig {
        max_body_bytes: f.max_body_bytes,
        max_uri_bytes: f.max_uri_bytes,
        max_header_bytes: f.max_header_bytes,
        max_headers: f.max_headers,
        client_header_timeout: p.millis(
            "limits.client_header_timeout_ms",
            f.client_header_timeout_ms,
        ),
        client_body_timeout: p.millis("limits.client_body_timeout_ms", f.client_body_timeout_ms),
        client_send_timeout: p.millis("limits.client_send_timeout_ms", f.client_send_timeout_ms),
        h2_max_concurrent_streams: f.h2_max_concurrent_streams,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{testing, Snapshot};
    use crate::http1;

    #[test]
    fn max_headers_cannot_exceed_the_parsers_table() {
        let with = |n: usize| {
            let mut f = testing::config();
            f.limits.max_headers = n;
            f
        };
        assert!(Snapshot::from_file(with(http1::MAX_HEADERS)).is_ok());
        assert_eq!(
            with(http1::MAX_HEADERS + 1).refused_keys(),
            ["limits.max_headers"]
        );
    }
}
