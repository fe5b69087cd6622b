//! Distributed tracing: W3C trace context in, one server span per request, the context out to
//! the backend, spans exported over OTLP ([`export`]).
//!
//! [`Tracer::start`] begins a request's [`RequestSpan`]: it continues the client's
//! `traceparent` (and keeps its `tracestate`), or starts a new trace, and the configured
//! parent-based sampler decides whether the span is recorded. Either way the backend gets a
//! `traceparent` whose parent is this span ([`RequestSpan::propagation`]), and the access log
//! the trace id. What a recorded span says is decided from the finished request's record
//! ([`crate::observe::spans`]) and written by [`RequestSpan::finish`].
//!
//! Cost: with tracing off (no `tracing.otlp_endpoint`) a request pays one field read of its
//! snapshot. An unsampled request allocates nothing; only a recorded span gets attributes,
//! events and clock reads.

mod export;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::Span;
use prometheus::Registry;

pub use export::{ExportError, ExportMetrics, Pipeline};

use crate::client::redact::redact_url;
use crate::config::{Snapshot, TracingConfig};
use crate::http1::split_host;
use crate::policy::admit::RequestView;
use crate::policy::headers::{TRACEPARENT, TRACESTATE};

/// The methods HTTP semantic conventions name; any other is `_OTHER` in the span.
const KNOWN_METHODS: [&str; 9] = [
    "GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

/// The method as a span attribute, and the span's first name: the method, or `HTTP` for one
/// the conventions do not know (the name gets its route once the request is routed).
fn method_name(method: &str) -> Option<&'static str> {
    KNOWN_METHODS.iter().find(|m| **m == method).copied()
}

/// Length of a version-00 `traceparent` value.
pub const TRACEPARENT_LEN: usize = 55;

/// Starts request spans on the current export pipeline, which a reload replaces
/// ([`Tracer::configure`]).
pub struct Tracer {
    current: ArcSwapOption<Pipeline>,
    metrics: ExportMetrics,
}

impl Tracer {
    /// A tracer with no pipeline yet, its metrics registered in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Tracer {
            current: ArcSwapOption::empty(),
            metrics: ExportMetrics::register(registry)?,
        })
    }

    /// The counters every pipeline of this tracer writes.
    pub fn metrics(&self) -> &ExportMetrics {
        &self.metrics
    }

    /// Makes the pipeline match `settings`: builds one, replaces it, or stops tracing
    /// (`None`). Settings equal to the running ones change nothing. Requests in flight finish
    /// their spans on the pipeline they started on.
    pub fn configure(&self, settings: Option<&TracingConfig>) -> Result<(), ExportError> {
        let running = self.current.load();
        if running.as_ref().map(|p| &p.settings) == settings {
            return Ok(());
        }
        let next = settings
            .map(|s| Pipeline::otlp(s, &self.metrics))
            .transpose()?;
        match settings {
            Some(s) => tracing::info!(
                traces_url = %redact_url(&s.traces_url),
                sample_ratio = s.sample_ratio,
                service_name = %s.service_name,
                "tracing on"
            ),
            None => tracing::info!("tracing off"),
        }
        self.install(next);
        Ok(())
    }

    /// Serves spans from `pipeline` from now on (tests and benches build their own).
    pub fn install(&self, pipeline: Option<Pipeline>) {
        self.current.store(pipeline.map(Arc::new));
    }

    /// Stops tracing and waits, at most `timeout`, for the spans queued to be sent.
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(pipeline) = self.current.swap(None) {
            // Another holder (a reload in progress) lets it go by itself.
            if let Ok(pipeline) = Arc::try_unwrap(pipeline) {
                pipeline.close(timeout);
            }
        }
    }

    /// The span of a request whose head is `req`, started at `started_at`; `None` when
    /// tracing is off.
    pub fn start<R: RequestView>(
        &self,
        snap: &Snapshot,
        req: &R,
        client: Option<IpAddr>,
        started_at: SystemTime,
    ) -> Option<RequestSpan> {
        snap.tracing.as_ref()?;
        let pipeline = self.current.load();
        let pipeline = pipeline.as_ref()?;
        let incoming = Incoming::of(req);
        let parent = match incoming.traceparent {
            Some(_) => {
                TraceContextPropagator::new().extract_with_context(&Context::new(), &incoming)
            }
            None => Context::new(),
        };
        let continued = parent.span().span_context().is_valid();
        let method = method_name(req.method());
        let span = pipeline
            .tracer
            .span_builder(method.unwrap_or("HTTP"))
            .with_kind(SpanKind::Server)
            .with_start_time(started_at)
            .start_with_context(&pipeline.tracer, &parent);
        let mut span = RequestSpan::new(span, continued);
        if let Inner::Recording(s) = &mut span.inner {
            s.set_attributes(request_attributes(snap, req, method, client));
        }
        Some(span)
    }

    /// The span of a request whose head could not be read: a new trace, recorded or not as
    /// the sampler decides.
    pub fn start_unreadable(&self, started_at: SystemTime) -> Option<RequestSpan> {
        let pipeline = self.current.load();
        let pipeline = pipeline.as_ref()?;
        let span = pipeline
            .tracer
            .span_builder("HTTP")
            .with_kind(SpanKind::Server)
            .with_start_time(started_at)
            .start_with_context(&pipeline.tracer, &Context::new());
        Some(RequestSpan::new(span, false))
    }
}

/// The attributes a recorded span gets from the request's head (HTTP semantic conventions).
/// Only these headers are read: never a credential.
fn request_attributes<R: RequestView>(
    snap: &Snapshot,
    req: &R,
    method: Option<&'static str>,
    client: Option<IpAddr>,
) -> Vec<KeyValue> {
    let scheme = if snap.startup.proxy_tls {
        "https"
    } else {
        "http"
    };
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.unwrap_or("_OTHER")),
        KeyValue::new("url.path", req.path().to_owned()),
        KeyValue::new("url.scheme", scheme),
    ];
    if method.is_none() {
        attributes.push(KeyValue::new(
            "http.request.method_original",
            req.method().to_owned(),
        ));
    }
    let host = req.authority().or_else(|| {
        req.single_header("host")
            .and_then(|h| std::str::from_utf8(h).ok())
    });
    if let Some((address, port)) = host.and_then(split_host) {
        attributes.push(KeyValue::new("server.address", address.to_owned()));
        if let Some(port) = port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
    }
    if let Some(ip) = client {
        attributes.push(KeyValue::new("client.address", ip.to_string()));
    }
    if let Some(agent) = req.single_header("user-agent") {
        attributes.push(KeyValue::new(
            "user_agent.original",
            String::from_utf8_lossy(agent).into_owned(),
        ));
    }
    attributes
}

/// The client's trace context, as the W3C propagator reads it: a `traceparent` sent exactly
/// once (two could name two parents), and the `tracestate` lines as one list.
struct Incoming<'a> {
    traceparent: Option<&'a str>,
    tracestate: Cow<'a, str>,
}

impl<'a> Incoming<'a> {
    fn of<R: RequestView>(req: &'a R) -> Self {
        let traceparent = req
            .single_header(TRACEPARENT)
            .and_then(|v| std::str::from_utf8(v).ok());
        let mut tracestate = Cow::Borrowed("");
        if traceparent.is_some() {
            for line in req.headers_named(TRACESTATE) {
                let Ok(line) = std::str::from_utf8(line) else {
                    continue;
                };
                tracestate = if tracestate.is_empty() {
                    Cow::Borrowed(line)
                } else {
                    Cow::Owned(format!("{tracestate},{line}"))
                };
            }
        }
        Incoming {
            traceparent,
            tracestate,
        }
    }
}

impl Extractor for Incoming<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => Some(&*self.tracestate).filter(|s| !s.is_empty()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// One request's span: recorded (exported when it ends) or only propagated.
pub struct RequestSpan {
    inner: Inner,
    /// The client's trace is continued: its `tracestate` goes upstream unchanged.
    continued: bool,
}

impl std::fmt::Debug for RequestSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSpan")
            .field("context", self.context())
            .field("recording", &self.is_recording())
            .field("continued", &self.continued)
            .finish()
    }
}

enum Inner {
    /// Boxed: an unrecorded span, the common case, keeps the request's record small.
    Recording(Box<Span>),
    /// Not recorded: only its identity travels on.
    Unsampled(SpanContext),
}

/// The trace context a forwarded request carries instead of the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagation {
    /// `traceparent`: this trace, with the gateway's span as the parent and its sampled flag.
    pub traceparent: [u8; TRACEPARENT_LEN],
    /// The client's `tracestate` goes on unchanged; a new trace starts without it.
    pub keep_tracestate: bool,
}

/// What a recorded request span says, decided from the finished request
/// ([`crate::observe::spans::outline`]).
#[derive(Debug, Default)]
pub struct SpanOutline {
    /// `{method} {route}`, once the request was routed.
    pub name: Option<String>,
    pub attributes: Vec<KeyValue>,
    /// Phases that ended, in order.
    pub events: Vec<(&'static str, SystemTime)>,
    /// Set when the request failed on the gateway's side (a 5xx, a backend that broke): the
    /// span's status is then Error with this description.
    pub error: Option<String>,
}

impl RequestSpan {
    fn new(span: Span, continued: bool) -> Self {
        let inner = if span.is_recording() {
            Inner::Recording(Box::new(span))
        } else {
            // Dropping an unrecorded span exports nothing.
            Inner::Unsampled(span.span_context().clone())
        };
        RequestSpan { inner, continued }
    }

    pub fn context(&self) -> &SpanContext {
        match &self.inner {
            Inner::Recording(span) => span.span_context(),
            Inner::Unsampled(context) => context,
        }
    }

    pub fn trace_id(&self) -> TraceId {
        self.context().trace_id()
    }

    /// Whether the span is recorded (and exported when it ends).
    pub fn is_recording(&self) -> bool {
        matches!(self.inner, Inner::Recording(_))
    }

    /// The trace context for the backend: this span as the parent.
    pub fn propagation(&self) -> Propagation {
        let context = self.context();
        let mut traceparent = *b"00-00000000000000000000000000000000-0000000000000000-00";
        let sampled = context.trace_flags().to_u8() & 1;
        let fields = [
            (3..35, &context.trace_id().to_bytes()[..]),
            (36..52, &context.span_id().to_bytes()[..]),
            (53..55, &[sampled][..]),
        ];
        for (range, bytes) in fields {
            hex::encode_to_slice(bytes, &mut traceparent[range])
                .expect("each field is twice its bytes");
        }
        Propagation {
            traceparent,
            keep_tracestate: self.continued,
        }
    }

    /// Ends the span as `outline` says, now. An unrecorded span just goes.
    pub fn finish(self, outline: SpanOutline) {
        let Inner::Recording(mut span) = self.inner else {
            return;
        };
        if let Some(name) = outline.name {
            span.update_name(name);
        }
        span.set_attributes(outline.attributes);
        for (name, at) in outline.events {
            span.add_event_with_timestamp(name, at, Vec::new());
        }
        if let Some(description) = outline.error {
            span.set_status(Status::error(description));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing;
    use crate::http1::RequestHead;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};

    #[derive(Debug)]
    struct Discard;

    impl SpanExporter for Discard {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Ok(())
        }
    }

    /// A tracer at `ratio` and a snapshot that has tracing on.
    fn tracer(ratio: f64) -> (Tracer, Snapshot) {
        let mut cfg = testing::config();
        cfg.tracing.otlp_endpoint = Some("http://127.0.0.1:9".into());
        cfg.tracing.sample_ratio = ratio;
        let snap = cfg.snapshot();
        let tracer = Tracer::register(&Registry::new()).unwrap();
        let settings = snap.tracing.as_ref().unwrap();
        tracer.install(Some(
            Pipeline::with_exporter(Discard, settings, tracer.metrics()).unwrap(),
        ));
        (tracer, snap)
    }

    /// The span of a GET with `headers` (each line ending in CRLF).
    fn span_of(tracer: &Tracer, snap: &Snapshot, headers: &str) -> RequestSpan {
        let raw = format!("GET /a HTTP/1.1\r\nHost: gw\r\n{headers}\r\n");
        let mut head = RequestHead::default();
        assert_eq!(head.parse(raw.as_bytes()), Ok(true));
        let view = head.view(raw.as_bytes());
        tracer
            .start(snap, &view, None, SystemTime::now())
            .expect("tracing is on")
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn off_in_the_snapshot_means_no_span() {
        let (tracer, _) = tracer(1.0);
        let raw = b"GET /a HTTP/1.1\r\nHost: gw\r\n\r\n";
        let mut head = RequestHead::default();
        assert_eq!(head.parse(raw), Ok(true));
        let view = head.view(raw);
        let off = testing::snapshot();
        assert!(tracer.start(&off, &view, None, SystemTime::now()).is_none());
    }

    #[test]
    fn a_valid_traceparent_is_continued_and_the_backend_gets_this_span_as_its_parent() {
        let (tracer, snap) = tracer(0.0);
        let span = span_of(&tracer, &snap, &format!("traceparent: {PARENT}\r\n"));
        assert!(span.is_recording(), "the client sampled it");
        let sent = span.propagation();
        let ours = span.context().span_id().to_string();
        let want = format!("00-0af7651916cd43dd8448eb211c80319c-{ours}-01");
        assert_eq!(std::str::from_utf8(&sent.traceparent), Ok(want.as_str()));
        assert!(sent.keep_tracestate);
    }

    #[test]
    fn a_repeated_or_broken_traceparent_starts_a_new_trace() {
        let (tracer, snap) = tracer(0.0);
        let other = "00-11111111111111111111111111111111-2222222222222222-01";
        for headers in [
            format!("traceparent: {PARENT}\r\ntraceparent: {other}\r\n"),
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01\r\n".into(),
            "traceparent: 00-zzz\r\ntracestate: a=1\r\n".into(),
        ] {
            let span = span_of(&tracer, &snap, &headers);
            assert!(!span.is_recording(), "{headers}: ratio 0 and no parent");
            let sent = span.propagation();
            let sent = std::str::from_utf8(&sent.traceparent).unwrap();
            assert!(
                !sent.contains("0af7651916cd43dd8448eb211c80319c"),
                "{headers}"
            );
            assert!(sent.ends_with("-00"), "{sent}");
            assert!(!span.propagation().keep_tracestate);
        }
    }
}
