//! One `tracing` subscriber for everything: the gateway's events and pingora's `log` records,
//! written through one non-blocking [`LineSink`] on stderr (the access log writes its JSON
//! lines into the same sink directly: [`crate::observe::access_log`]).

use std::sync::Arc;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::{fmt, EnvFilter};

use crate::observe::log_sink::{LineSink, SinkWriter, DEFAULT_CAPACITY, FLUSH_EVERY};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for machines; the default).
    Json,
    /// Human-readable lines.
    Pretty,
}

/// The process's logs, once [`init`] has installed them.
pub struct Logs {
    pub sink: Arc<LineSink>,
    pub format: LogFormat,
}

/// Installs the global subscriber, writing to stderr through a [`LineSink`]. `RUST_LOG` wins
/// over `default_level` when set.
pub fn init(format: LogFormat, default_level: &str) -> Logs {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let (dispatch, logs) = subscriber(format, filter, std::io::stderr());
    let _ = tracing::dispatcher::set_global_default(dispatch);
    logs
}

/// A subscriber writing to `out` through a [`LineSink`] of its own, and pingora's `log`
/// records bridged into whichever subscriber is current. An in-process gateway (a test's)
/// runs its threads under one of its own instead of the global one.
pub fn subscriber(
    format: LogFormat,
    mut filter: EnvFilter,
    out: impl std::io::Write + Send + 'static,
) -> (tracing::Dispatch, Logs) {
    let _ = tracing_log::LogTracer::init();
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
    let sink = LineSink::spawn(out, DEFAULT_CAPACITY, FLUSH_EVERY);
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(SinkWriter(sink.clone()));
    let dispatch = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .into(),
        LogFormat::Pretty => builder.into(),
    };
    (dispatch, Logs { sink, format })
}
