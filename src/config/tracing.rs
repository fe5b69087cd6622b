//! `[tracing]`: where spans are exported, which requests are recorded, and the export queue.
//! Everything here reloads live ([`crate::observe::trace::Tracer::configure`]).

use std::time::Duration;

use super::file::TracingFile;
use super::problems::Problems;
use crate::client::port_is_a_number;
use crate::client::redact::redact_url;

/// Tracing as configured: present only when `tracing.otlp_endpoint` is set.
#[derive(Clone, PartialEq)]
pub struct TracingConfig {
    /// Where export requests go: the endpoint with `/v1/traces` appended.
    pub traces_url: String,
    /// Share of new traces recorded (parent-based: an incoming sampled flag wins).
    pub sample_ratio: f64,
    pub service_name: String,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub scheduled_delay: Duration,
    pub export_timeout: Duration,
}

/// By hand, so that a password in the endpoint is never printed; each field named, so that
/// one added later is placed here too.
impl std::fmt::Debug for TracingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            traces_url,
            sample_ratio,
            service_name,
            max_queue_size,
            max_export_batch_size,
            scheduled_delay,
            export_timeout,
        } = self;
        f.debug_struct("TracingConfig")
            .field("traces_url", &redact_url(traces_url))
            .field("sample_ratio", sample_ratio)
            .field("service_name", service_name)
            .field("max_queue_size", max_queue_size)
            .field("max_export_batch_size", max_export_batch_size)
            .field("scheduled_delay", scheduled_delay)
            .field("export_timeout", export_timeout)
            .finish()
    }
}

/// The OTLP/HTTP path of traces under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// The traces URL of an OTLP/HTTP base URL: plain `http` (a local collector or agent), a host
/// and its port, an optional path prefix, no query. A problem shows the endpoint with its
/// password redacted.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let shown = redact_url(endpoint);
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("{shown:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{shown:?}: https is not supported; export to a local OpenTelemetry Collector \
                 over http, which can forward over TLS"
            ))
        }
        _ => return Err(format!("{shown:?} must start with http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host"));
    }
    if !uri.authority().is_some_and(port_is_a_number) {
        return Err(format!(
            "{shown:?}: its port is not a number from 0 to 65535"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("{shown:?} must not have a query"));
    }
    let base = endpoint.trim_end_matches('/');
    Ok(format!("{base}{TRACES_PATH}"))
}

/// Validates `[tracing]`: every value, whether or not tracing is on.
pub(super) fn tracing(f: &TracingFile, p: &mut Problems) -> Option<TracingConfig> {
    let traces_url = match &f.otlp_endpoint {
        Some(e) => p.check("tracing.otlp_endpoint", traces_url(e)),
        None => None,
    };
    if !(0.0..=1.0).contains(&f.sample_ratio) {
        p.push("tracing.sample_ratio", "must be between 0.0 and 1.0");
    }
    if f.service_name.trim().is_empty() {
        p.push("tracing.service_name", "must not be empty");
    }
    p.positive("tracing.max_queue_size", f.max_queue_size as u64);
    if f.max_export_batch_size == 0 || f.max_export_batch_size > f.max_queue_size {
        p.push(
            "tracing.max_export_batch_size",
            "must be at least 1 and at most tracing.max_queue_size",
        );
    }
    let scheduled_delay = p.millis("tracing.scheduled_delay_ms", f.scheduled_delay_ms);
    let export_timeout = p.millis("tracing.export_timeout_ms", f.export_timeout_ms);
    Some(TracingConfig {
        traces_url: traces_url?,
        sample_ratio: f.sample_ratio,
        service_name: f.service_name.clone(),
        max_queue_size: f.max_queue_size,
        max_export_batch_size: f.max_export_batch_size,
        scheduled_delay,
        export_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing;

    fn problems(f: TracingFile) -> Vec<String> {
        let mut cfg = testing::config();
        cfg.tracing = f;
        cfg.refused_keys()
    }

    fn on(endpoint: &str) -> TracingFile {
        TracingFile {
            otlp_endpoint: Some(endpoint.into()),
            ..TracingFile::default()
        }
    }

    #[test]
    fn tracing_is_off_without_an_endpoint() {
        assert_eq!(testing::snapshot().tracing, None);
    }

    #[test]
    fn the_traces_path_is_appended_to_the_endpoint() {
        for (endpoint, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://collector:4318/", "http://collector:4318/v1/traces"),
            (
                "http://otel.internal/otlp",
                "http://otel.internal/otlp/v1/traces",
            ),
        ] {
            let mut cfg = testing::config();
            cfg.tracing = on(endpoint);
            let settings = cfg.snapshot().tracing.expect("tracing on");
            assert_eq!(settings.traces_url, url);
            assert_eq!(settings.sample_ratio, 1.0);
            assert_eq!(settings.service_name, "agent-gateway");
            assert_eq!(settings.scheduled_delay, Duration::from_secs(5));
        }
    }

    #[test]
    fn bad_endpoints_are_refused() {
        for bad in [
            "https://collector:4318",
            "127.0.0.1:4318",
            "grpc://collector:4317",
            "http://collector:4318/?x=1",
            "not a url",
            "http://collector:99999",
        ] {
            assert_eq!(problems(on(bad)), ["tracing.otlp_endpoint"], "{bad}");
        }
    }

    #[test]
    fn a_refused_endpoint_s_password_is_not_in_its_problem() {
        for bad in [
            "https://otel:otlp-pw@collector:4318",
            "otel:otlp-pw@collector:4318",
            "http://otel:otlp-pw@collector:4318/?x=1",
            // Unencoded, its `/` would end the authority: `otel` and a port `otlp`.
            "http://otel:otlp/pw@collector:4318",
        ] {
            let problem = traces_url(bad).unwrap_err();
            assert!(!problem.contains("otlp-pw"), "{problem}");
            assert!(!problem.contains("otlp/pw"), "{problem}");
            assert!(
                problem.contains("otel:<redacted>@collector:4318"),
                "{problem}"
            );
        }
        // A password of its own is no problem: the endpoint is used as written.
        assert_eq!(
            traces_url("http://otel:otlp-pw@collector:4318").unwrap(),
            "http://otel:otlp-pw@collector:4318/v1/traces"
        );
    }

    #[test]
    fn bad_values_are_refused_even_when_tracing_is_off() {
        let f = TracingFile {
            sample_ratio: 1.5,
            service_name: " ".into(),
            max_queue_size: 8,
            max_export_batch_size: 9,
            scheduled_delay_ms: 0,
            ..TracingFile::default()
        };
        assert_eq!(
            problems(f),
            [
                "tracing.sample_ratio",
                "tracing.service_name",
                "tracing.max_export_batch_size",
                "tracing.scheduled_delay_ms"
            ]
        );
        let nan = TracingFile {
            sample_ratio: f64::NAN,
            ..on("http://c:4318")
        };
        assert_eq!(problems(nan), ["tracing.sample_ratio"]);
    }
}
