//! One `tracing` subscriber for everything: the gateway's events and pingora's `log` records.

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::{fmt, EnvFilter};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for machines; the default).
    Json,
    /// Human-readable lines.
    Pretty,
}

/// Installs the global subscriber. `RUST_LOG` wins over `default_level` when set.
pub fn init(format: LogFormat, default_level: &str) {
    let _ = tracing_log::LogTracer::init();
    let mut filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // pingora traces whole request headers (credentials included) at trace level: whenever
    // trace is on anywhere, cap pingora's HTTP protocol targets at debug. (Only then: the
    // directive would otherwise raise those targets to debug.)
    if filter.max_level_hint() == Some(LevelFilter::TRACE) {
        filter = filter.add_directive(
            "pingora_core::protocols::http=debug"
                .parse()
                .expect("static directive"),
        );
    }
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
