//! The export side of tracing: finished spans go through a bounded queue to a thread of their
//! own, which sends them in batches over OTLP/HTTP (protobuf). A request never waits on it.
//!
//! The OpenTelemetry SDK's `BatchSpanProcessor` does not fit here: its thread drives exports
//! without a tokio runtime (the hyper-based OTLP client then panics), and the spans it drops
//! when its queue is full are counted only in a private field. [`BoundedProcessor`] is the
//! small part of it the gateway needs: `on_end` is a `try_send` that counts what does not fit,
//! and one thread with a single-threaded runtime owns the exporter. A pipeline replaced by a
//! reload is simply let go: spans still open keep it alive, and when the last one ends the
//! queue closes and its thread sends what is left and exits. Nothing blocks a worker.

use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::config::TracingConfig;

/// Why an export pipeline could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    #[error("cannot start the span export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What happened to finished spans, shared by every pipeline a process builds.
#[derive(Clone)]
pub struct ExportMetrics {
    exported: IntCounter,
    queue_full: IntCounter,
    export_failed: IntCounter,
}

impl ExportMetrics {
    /// Creates and registers the span counters in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let exported = IntCounter::new(
            "agent_gateway_trace_spans_exported_total",
            "Spans the OTLP collector accepted.",
        )?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "agent_gateway_trace_spans_dropped_total",
                "Spans lost: the export queue was full, or the export failed (collector down, \
                 slow or refusing).",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(exported.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        Ok(ExportMetrics {
            exported,
            queue_full: dropped.with_label_values(&["queue_full"]),
            export_failed: dropped.with_label_values(&["export_failed"]),
        })
    }
}

/// One export pipeline: the tracer requests start spans with, over a provider whose processor
/// is a [`BoundedProcessor`].
pub struct Pipeline {
    pub(super) tracer: SdkTracer,
    provider: SdkTracerProvider,
    pub(super) settings: TracingConfig,
    worker: JoinHandle<()>,
}

impl Pipeline {
    /// A pipeline exporting to `settings.traces_url`.
    pub fn otlp(settings: &TracingConfig, metrics: &ExportMetrics) -> Result<Self, ExportError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            // Used as given: the SDK appends `/v1/traces` only to an endpoint from the environment.
            .with_endpoint(&settings.traces_url)
            .with_timeout(settings.export_timeout)
            // A retried export holds up the queue behind it; a failed batch is dropped and counted.
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build()
            .map_err(|e| ExportError::Exporter(e.to_string()))?;
        Self::with_exporter(exporter, settings, metrics)
    }

    /// A pipeline sending its batches to `exporter` (tests and benches pass their own).
    pub fn with_exporter<E: SpanExporter + 'static>(
        mut exporter: E,
        settings: &TracingConfig,
        metrics: &ExportMetrics,
    ) -> Result<Self, ExportError> {
        // Only `service.name`: `Resource::builder()` would also read OTEL_SERVICE_NAME and
        // OTEL_RESOURCE_ATTRIBUTES, so the config file would not be the whole story.
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .build();
        // The provider hands the resource to its processors, not to an exporter they own.
        exporter.set_resource(&resource);
        let (processor, worker) = BoundedProcessor::start(exporter, settings, metrics)?;
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let scope = InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Pipeline {
            tracer,
            provider,
            settings: settings.clone(),
            worker,
        })
    }

    /// Lets the pipeline go and waits, at most `timeout`, for its thread to send what is
    /// queued (spans still open by then keep it going, and are sent when they end).
    pub fn close(self, timeout: Duration) {
        let Pipeline {
            tracer,
            provider,
            worker,
            ..
        } = self;
        drop((tracer, provider));
        let deadline = Instant::now() + timeout;
        while !worker.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The processor of a [`Pipeline`]: finished spans into a bounded queue, never waiting.
struct BoundedProcessor {
    queue: mpsc::Sender<SpanData>,
    /// Wakes the export thread, only once a whole batch is queued: a wake per span would be a
    /// cross-thread signal per request.
    batch_ready: Arc<Notify>,
    /// Free queue slots at or below which a whole batch is waiting.
    wake_at: usize,
    queue_full: IntCounter,
    /// Dropped after `queue` (fields drop in order): tells the export thread that nothing more
    /// will come, so it sends what is left now rather than at its next tick, and stops.
    _closed: oneshot::Sender<()>,
}

impl fmt::Debug for BoundedProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedProcessor")
            .field("free", &self.queue.capacity())
            .finish()
    }
}

/// How the export thread batches.
#[derive(Debug, Clone, Copy)]
struct Batching {
    batch_size: usize,
    delay: Duration,
    timeout: Duration,
}

impl BoundedProcessor {
    /// The processor, and the thread that exports what it queues.
    fn start<E: SpanExporter + 'static>(
        exporter: E,
        settings: &TracingConfig,
        metrics: &ExportMetrics,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (queue, spans) = mpsc::channel(settings.max_queue_size);
        let (closed_tx, closed) = oneshot::channel();
        let batch_ready = Arc::new(Notify::new());
        let batching = Batching {
            batch_size: settings.max_export_batch_size,
            delay: settings.scheduled_delay,
            timeout: settings.export_timeout,
        };
        let queue_full = metrics.queue_full.clone();
        let (wake, metrics) = (batch_ready.clone(), metrics.clone());
        // A thread logs nowhere until told: it logs where the thread that starts it does.
        let logs = tracing::dispatcher::get_default(Clone::clone);
        let worker = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let _logs = tracing::dispatcher::set_default(&logs);
                // The OTLP client is hyper's: it needs a runtime, and this one is its own, so
                // a slow collector never occupies a proxy worker.
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(rt) => rt.block_on(export_loop(
                        exporter, spans, wake, closed, batching, metrics,
                    )),
                    Err(e) => tracing::error!(error = %e, "cannot start the span export runtime"),
                }
            })?;
        let processor = BoundedProcessor {
            queue,
            batch_ready,
            wake_at: settings.max_queue_size - batching.batch_size,
            queue_full,
            _closed: closed_tx,
        };
        Ok((processor, worker))
    }
}

impl SpanProcessor for BoundedProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.queue.try_send(span) {
            Ok(()) => {
                if self.queue.capacity() <= self.wake_at {
                    self.batch_ready.notify_one();
                }
            }
            Err(_) => self.queue_full.inc(),
        }
    }

    /// Nothing to wait for here: the export thread sends every `scheduled_delay`, and
    /// [`Pipeline::close`] is the way to wait for it.
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// Called by the provider's `Drop`, on whichever thread ends the last span (often a proxy
    /// worker): it must not block. Dropping this processor is what stops the export thread.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export thread: sleeps until a batch is full, `delay` has passed or the processor is
/// gone; then sends what is queued, a batch at a time, each export bounded by `timeout`.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    batch_ready: Arc<Notify>,
    mut closed: oneshot::Receiver<()>,
    batching: Batching,
    metrics: ExportMetrics,
) {
    let (mut last_round, mut failing) = (false, false);
    while !last_round {
        // Never `spans.recv().await`: a receiver waiting on the channel makes every
        // `try_send` wake this thread.
        tokio::select! {
            _ = batch_ready.notified() => {}
            _ = tokio::time::sleep(batching.delay) => {}
            _ = &mut closed => last_round = true,
        }
        loop {
            let mut batch = Vec::with_capacity(batching.batch_size);
            while batch.len() < batching.batch_size {
                match spans.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
            }
            let (count, full) = (batch.len() as u64, batch.len() == batching.batch_size);
            if count == 0 {
                break;
            }
            let failure = match tokio::time::timeout(batching.timeout, exporter.export(batch)).await
            {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer within {:?}", batching.timeout)),
            };
            match failure {
                None => {
                    metrics.exported.inc_by(count);
                    if std::mem::take(&mut failing) {
                        tracing::info!("span export works again");
                    }
                }
                // Said once per outage, not per batch; the metric counts every span.
                Some(error) => {
                    metrics.export_failed.inc_by(count);
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(%error, "span export failed; spans are dropped until the collector accepts them");
                    }
                }
            }
            if !full {
                break;
            }
        }
    }
    let _ = exporter.shutdown();
}
