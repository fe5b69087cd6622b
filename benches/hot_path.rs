//! The per-request hot path without sockets: what the gateway computes for every request.
//!
//! - `admit/*`: admission ([`agent_gateway::policy::admit`]) of the request wrk sends, as
//!   the pipeline calls it: the facts read off the parsed head, then route match, auth check
//!   (SHA-256 of the token, constant-time compare), retirement and the upstream path, for a
//!   v1 and a v2 request.
//! - `telemetry/*`: [`Telemetry::record`] for a served request, with no log subscriber (the
//!   access log filtered out) and with the binary's JSON subscriber writing to a sink; and
//!   the access-log line the binary writes by hand ([`access_log::json_line`]), alone.
//! - `http1/*`: parsing the request head a client sends (wrk's POST) and a backend's response
//!   head ([`agent_gateway::http1`]), into buffers reused per connection as the proxy does.
//! - `request/*`: everything the gateway does per request outside I/O: `Exchange::start`, a
//!   minted request id, admission, `identified`, `record`.
//! - `trace/*`: a request's span as the pipeline makes it ([`Tracer::start`] from the head, the
//!   `traceparent` for the backend, [`spans::finish`] from the record) with tracing off, at
//!   sample ratios 0, 0.01 and 1.0, spans going to an exporter that discards them.
//!
//! Before the timings it prints heap allocations per call, counted by an instrumented global
//! allocator (`stats_alloc`: the crate forbids `unsafe`, so the counting `GlobalAlloc` comes
//! from there rather than being written here; its counters add a few ns to each allocation in
//! the timings too). Target: at most 2 allocations and < 1 µs for route + rewrite + auth +
//! metrics.
//!
//! `cargo bench --bench hot_path`; `cargo test --all-targets` runs each benchmark once.

use std::alloc::System;
use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, Criterion};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::{testing, FileConfig, Snapshot};
use agent_gateway::http1::{RequestHead, ResponseHead};
use agent_gateway::observe::access_log;
use agent_gateway::observe::exchange::{Exchange, Protocol};
use agent_gateway::observe::spans;
use agent_gateway::observe::telemetry::Telemetry;
use agent_gateway::observe::trace::{Pipeline, RequestSpan, Tracer};
use agent_gateway::policy::admit::{admit, Forward, Refusal, RequestFacts};
use agent_gateway::policy::request_id::RequestIds;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The test config with a second agent limited to two services, as in the shipped one.
fn snapshot() -> Snapshot {
    let mut f = testing::config();
    let mut partner = AgentFile::new("partner-agent", "partner-token");
    partner.default_service = Some("PARTNER".into());
    partner.services = Some(vec!["PARTNER".into(), testing::DEFAULT_SERVICE.into()]);
    f.auth.agents.push(partner);
    FileConfig::snapshot(f)
}

const REQUEST_ID: &str = "5f1c0e2a9b7d4c31-0000002a";

/// A request head as wrk sends it (shared/peers/post-verify.lua), for `path` and `token`.
fn request_head(path: &str, token: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:8083\r\nContent-Type: application/json\r\nX-Auth-Token: {token}\r\nX-Service-Agent-Id: {}\r\nContent-Length: 55\r\n\r\n",
        testing::AGENT_ID
    )
    .into_bytes()
}

const V1: &str = "/api/v1/verify/request";
const V2: &str = "/api/v2/verify/ORG_DEFAULT/request";

/// A parsed request head over its bytes, as a client connection holds it.
struct Parsed {
    head: RequestHead,
    buf: Vec<u8>,
}

impl Parsed {
    fn new(path: &str) -> Self {
        Self::with_token(path, testing::TOKEN)
    }

    fn with_token(path: &str, token: &str) -> Self {
        let buf = request_head(path, token);
        let mut head = RequestHead::default();
        assert_eq!(head.parse(&buf), Ok(true));
        Parsed { head, buf }
    }

    /// Admission as the pipeline runs it: the facts of the head, then `admit`.
    fn admit<'s>(&self, snap: &'s Snapshot, request_id: &str) -> Result<Forward<'s>, Refusal<'s>> {
        let view = self.head.view(&self.buf);
        admit(
            snap,
            &RequestFacts::of(&view, request_id, SystemTime::now()),
        )
    }
}

/// One served v1 request, computed as the pipeline does, without the I/O.
fn serve_one(snap: &Snapshot, parsed: &Parsed, ids: &RequestIds, telemetry: &Telemetry) {
    let mut ex = Exchange::start(Protocol::Http1, Some(&http::Method::POST), V1);
    ex.request_id = ids.next_id();
    let forward = parsed.admit(snap, &ex.request_id).expect("admitted");
    ex.identified(&forward.who);
    ex.bytes_in = 56;
    ex.upstream.path = Some(forward.upstream_path);
    ex.upstream.header_time = Some(Duration::from_micros(80));
    ex.status = 200;
    ex.bytes_out = 77;
    ex.upstream.duration = Some(Duration::from_micros(90));
    telemetry.record(black_box(&ex));
}

/// A served request's record, as `telemetry.record` receives it.
fn served_exchange(snap: &Snapshot) -> Exchange<'_> {
    let mut ex = Exchange::start(Protocol::Http1, Some(&http::Method::POST), V1);
    ex.request_id = REQUEST_ID.into();
    let forward = Parsed::new(V1).admit(snap, REQUEST_ID).expect("admitted");
    ex.identified(&forward.who);
    ex.upstream.path = Some(forward.upstream_path);
    ex.bytes_in = 56;
    ex.status = 200;
    ex.bytes_out = 77;
    ex.upstream.header_time = Some(Duration::from_micros(80));
    ex.upstream.duration = Some(Duration::from_micros(90));
    ex
}

/// The binary's JSON log subscriber (see `logging::init`), writing to a sink.
fn json_subscriber() -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .finish()
}

/// Heap allocations (and bytes) per call of `f`, averaged over `n` calls after a warm-up.
fn allocations(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..16 {
        f();
    }
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        f();
    }
    let c = region.change();
    (
        (c.allocations + c.reallocations) as f64 / n as f64,
        c.bytes_allocated as f64 / n as f64,
    )
}

/// Takes the spans it is given and drops them.
#[derive(Debug)]
struct Discard;

impl SpanExporter for Discard {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        drop(black_box(batch));
        Ok(())
    }
}

/// A tracer and the snapshot it serves under: off (`None`), or on at `ratio`, exporting to
/// [`Discard`] with a queue that does not fill while the bench runs.
fn tracing_at(ratio: Option<f64>) -> (Tracer, Snapshot) {
    let mut f = testing::config();
    if let Some(ratio) = ratio {
        f.tracing.otlp_endpoint = Some("http://127.0.0.1:4318".into());
        f.tracing.sample_ratio = ratio;
        f.tracing.max_queue_size = 1 << 16;
    }
    let snap = f.snapshot();
    let tracer = Tracer::register(&prometheus::Registry::new()).expect("fresh registry");
    if let Some(settings) = &snap.tracing {
        let pipeline =
            Pipeline::with_exporter(Discard, settings, tracer.metrics()).expect("a pipeline");
        tracer.install(Some(pipeline));
    }
    (tracer, snap)
}

/// One request's span, as the pipeline makes it, on the record `ex` of a served request.
fn span_one(tracer: &Tracer, snap: &Snapshot, parsed: &Parsed, ex: &mut Exchange) {
    let view = parsed.head.view(&parsed.buf);
    ex.span = tracer.start(snap, &view, "127.0.0.1".parse().ok(), ex.started_at);
    black_box(ex.span.as_ref().map(RequestSpan::propagation));
    spans::finish(ex, &snap.bases);
}

/// The tracing settings the benches compare: bench name, allocation row, sample ratio.
const TRACING: [(&str, &str, Option<f64>); 4] = [
    ("off", "span, tracing off", None),
    ("ratio_0", "span, ratio 0 (never recorded)", Some(0.0)),
    ("ratio_0.01", "span, ratio 0.01", Some(0.01)),
    ("ratio_1", "span, ratio 1 (recorded)", Some(1.0)),
];

fn print_allocations() {
    let snap = snapshot();
    let telemetry = Telemetry::register(&prometheus::Registry::new()).expect("fresh registry");
    let ids = RequestIds::default();
    let ex = served_exchange(&snap);
    let (v1, v2) = (Parsed::new(V1), Parsed::new(V2));
    let n = 1000;
    let (mut head, wire) = (RequestHead::default(), request_head(V1, testing::TOKEN));
    let mut response_head = ResponseHead::default();
    // Warm: the first parse sizes the reused header lists.
    let _ = (head.parse(&wire), response_head.parse(RESPONSE_HEAD));
    let mut rows: Vec<(&str, (f64, f64))> = vec![
        (
            "admit v1 (route+auth+rewrite)",
            allocations(n, || drop(black_box(v1.admit(&snap, REQUEST_ID)))),
        ),
        (
            "admit v2 (route+auth+rewrite)",
            allocations(n, || drop(black_box(v2.admit(&snap, REQUEST_ID)))),
        ),
        (
            "Exchange::start",
            allocations(n, || {
                drop(black_box(Exchange::start(
                    Protocol::Http1,
                    Some(&http::Method::POST),
                    V1,
                )));
            }),
        ),
        (
            "RequestIds::next_id",
            allocations(n, || drop(black_box(ids.next_id()))),
        ),
        (
            "telemetry.record, no log subscriber",
            allocations(n, || telemetry.record(&ex)),
        ),
        (
            "http1 request head (warm buffers)",
            allocations(n, || {
                black_box(head.parse(&wire)).ok();
            }),
        ),
        (
            "http1 response head (warm buffers)",
            allocations(n, || {
                black_box(response_head.parse(RESPONSE_HEAD)).ok();
            }),
        ),
        (
            "whole request, no log subscriber",
            allocations(n, || serve_one(&snap, &v1, &ids, &telemetry)),
        ),
    ];
    tracing::subscriber::with_default(json_subscriber(), || {
        rows.push((
            "telemetry.record, JSON access log",
            allocations(n, || telemetry.record(&ex)),
        ));
        rows.push((
            "whole request, JSON access log",
            allocations(n, || serve_one(&snap, &v1, &ids, &telemetry)),
        ));
    });
    let v1_head = Parsed::new(V1);
    for (_, row, ratio) in TRACING {
        let (tracer, traced_snap) = tracing_at(ratio);
        let mut traced = served_exchange(&traced_snap);
        let calls = allocations(n, || span_one(&tracer, &traced_snap, &v1_head, &mut traced));
        rows.push((row, calls));
    }
    println!("heap allocations per call (target for admission + metrics: <= 2):");
    for (name, (allocs, bytes)) in rows {
        println!("  {name:<40} {allocs:>6.2} allocations {bytes:>8.0} bytes");
    }
}

fn bench_admit(c: &mut Criterion) {
    let snap = snapshot();
    let mut g = c.benchmark_group("admit");
    for (name, parsed) in [
        ("v1_verify_request", Parsed::new(V1)),
        ("v2_verify_request", Parsed::new(V2)),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| parsed.admit(black_box(&snap), black_box(REQUEST_ID)))
        });
    }
    let bad_token = Parsed::with_token(V1, "wrong");
    g.bench_function("v1_bad_token", |b| {
        b.iter(|| bad_token.admit(black_box(&snap), black_box(REQUEST_ID)))
    });
    g.finish();
}

fn bench_telemetry(c: &mut Criterion) {
    let snap = snapshot();
    let telemetry = Telemetry::register(&prometheus::Registry::new()).expect("fresh registry");
    let ids = RequestIds::default();
    let ex = served_exchange(&snap);
    let v1 = Parsed::new(V1);
    let mut g = c.benchmark_group("telemetry");
    g.bench_function("record_no_log_subscriber", |b| {
        b.iter(|| telemetry.record(black_box(&ex)))
    });
    tracing::subscriber::with_default(json_subscriber(), || {
        g.bench_function("record_json_access_log", |b| {
            b.iter(|| telemetry.record(black_box(&ex)))
        });
    });
    let mut logged = served_exchange(&snap);
    logged.client_addr = Some([127, 0, 0, 1].into());
    logged.user_agent = Some("agent-sdk/1.2".into());
    let mut line = Vec::new();
    let now = SystemTime::now();
    g.bench_function("access_log_line", |b| {
        b.iter(|| {
            line.clear();
            access_log::json_line(
                &mut line,
                black_box(&logged),
                Duration::from_micros(95),
                now,
            );
            black_box(&line);
        })
    });
    g.finish();

    let mut g = c.benchmark_group("request");
    g.bench_function("start_admit_record_no_log_subscriber", |b| {
        b.iter(|| serve_one(&snap, &v1, &ids, &telemetry))
    });
    tracing::subscriber::with_default(json_subscriber(), || {
        g.bench_function("start_admit_record_json_access_log", |b| {
            b.iter(|| serve_one(&snap, &v1, &ids, &telemetry))
        });
    });
    g.finish();
}

/// The answer of the static backend there (shared/peers/backend-nginx.conf).
const RESPONSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 01:00:00 GMT\r\nContent-Type: application/json\r\nContent-Length: 75\r\nConnection: keep-alive\r\nX-Upstream-Path: /api/v2/verify/DEFAULT/request\r\n\r\n";

fn bench_http1(c: &mut Criterion) {
    let mut g = c.benchmark_group("http1");
    let (mut head, wire) = (RequestHead::default(), request_head(V1, testing::TOKEN));
    g.bench_function("parse_request_head", |b| {
        b.iter(|| head.parse(black_box(&wire)))
    });
    let mut response_head = ResponseHead::default();
    g.bench_function("parse_response_head", |b| {
        b.iter(|| response_head.parse(black_box(RESPONSE_HEAD)))
    });
    g.finish();
}

fn bench_trace(c: &mut Criterion) {
    let v1 = Parsed::new(V1);
    let mut g = c.benchmark_group("trace");
    for (name, _, ratio) in TRACING {
        let (tracer, snap) = tracing_at(ratio);
        let mut ex = served_exchange(&snap);
        g.bench_function(name, |b| b.iter(|| span_one(&tracer, &snap, &v1, &mut ex)));
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_admit,
    bench_http1,
    bench_telemetry,
    bench_trace
);

fn main() {
    print_allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
