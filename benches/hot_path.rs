//! The per-request hot path without sockets: what the gateway computes for every request.
//!
//! - `plan/*`: route match, auth check (SHA-256 of the token, constant-time compare) and the
//!   upstream path, for a v1 and a v2 request ([`agent_gateway::policy::admit::plan`]).
//! - `telemetry/*`: [`Telemetry::record`] for a served request, with no log subscriber (the
//!   access log filtered out) and with the binary's JSON subscriber writing to a sink.
//! - `http1/*`: parsing the request head a client sends (wrk's POST) and a backend's response
//!   head ([`agent_gateway::http1`]), into buffers reused per connection as the proxy does.
//! - `request/*`: everything the gateway does per request outside I/O: `Exchange::start`, a
//!   minted request id, `plan`, `identified`, `record`.
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

use agent_gateway::config::Snapshot;
use agent_gateway::http1::{RequestHead, ResponseHead};
use agent_gateway::observe::exchange::Exchange;
use agent_gateway::observe::telemetry::Telemetry;
use agent_gateway::policy::admit::{plan, RequestFacts};
use agent_gateway::policy::request_id::RequestIds;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The benchmark config: the one `benches/compare.sh` runs (agent-1, token "secret").
const CONFIG: &str = r#"
[listen]
proxy = "127.0.0.1:8083"
[server]
threads = 1
[v1]
default_service = "DEFAULT"
[upstream]
addresses = ["127.0.0.1:9000"]
[[auth.agents]]
id = "agent-1"
token_sha256 = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
[[auth.agents]]
id = "partner-agent"
token_sha256 = "92bc60cbdec0a60b842eda0e0cd3c14fa0460c8eaaa5badd684f40258f8f50be"
default_service = "PARTNER"
services = ["PARTNER", "DEFAULT"]
"#;

fn snapshot() -> Snapshot {
    Snapshot::parse(CONFIG).expect("the bench config is valid")
}

const REQUEST_ID: &str = "5f1c0e2a9b7d4c31-0000002a";

fn facts(path: &str) -> RequestFacts<'_> {
    RequestFacts {
        method: "POST",
        path,
        query: None,
        agent_id: Some(b"agent-1"),
        token: Some(b"secret"),
        request_id: REQUEST_ID,
        now: SystemTime::now(),
    }
}

const V1: &str = "/api/v1/verify/request";
const V2: &str = "/api/v2/verify/DEFAULT/request";

/// One served v1 request, computed as `proxy.rs` does, without the I/O.
fn serve_one(snap: &Snapshot, ids: &RequestIds, telemetry: &Telemetry) {
    let method = http::Method::POST;
    let mut ex = Exchange::start(&method, V1);
    ex.request_id = ids.next_id();
    let f = RequestFacts {
        request_id: &ex.request_id,
        now: ex.started_at,
        ..facts(V1)
    };
    let forward = plan(snap, &f).expect("authorized");
    ex.identified(&forward.who);
    ex.bytes_in = 56;
    ex.upstream_path = Some(forward.upstream_path);
    ex.upstream_header_time = Some(Duration::from_micros(80));
    ex.status = 200;
    ex.bytes_out = 77;
    ex.upstream_duration = Some(Duration::from_micros(90));
    telemetry.record(black_box(&ex));
}

/// A served request's record, as `telemetry.record` receives it.
fn served_exchange(snap: &Snapshot) -> Exchange {
    let mut ex = Exchange::start(&http::Method::POST, V1);
    ex.request_id = REQUEST_ID.into();
    let forward = plan(snap, &facts(V1)).expect("authorized");
    ex.identified(&forward.who);
    ex.upstream_path = Some(forward.upstream_path);
    ex.bytes_in = 56;
    ex.status = 200;
    ex.bytes_out = 77;
    ex.upstream_header_time = Some(Duration::from_micros(80));
    ex.upstream_duration = Some(Duration::from_micros(90));
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

fn print_allocations() {
    let snap = snapshot();
    let telemetry = Telemetry::register(&prometheus::Registry::new()).expect("fresh registry");
    let ids = RequestIds::default();
    let ex = served_exchange(&snap);
    let n = 1000;
    let (mut request_head, mut response_head) = (RequestHead::default(), ResponseHead::default());
    // Warm: the first parse sizes the reused header lists.
    let _ = (
        request_head.parse(REQUEST_HEAD),
        response_head.parse(RESPONSE_HEAD),
    );
    let mut rows: Vec<(&str, (f64, f64))> = vec![
        (
            "plan v1 (route+auth+rewrite)",
            allocations(n, || drop(black_box(plan(&snap, &facts(V1))))),
        ),
        (
            "plan v2 (route+auth+rewrite)",
            allocations(n, || drop(black_box(plan(&snap, &facts(V2))))),
        ),
        (
            "Exchange::start",
            allocations(n, || {
                drop(black_box(Exchange::start(&http::Method::POST, V1)));
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
                black_box(request_head.parse(REQUEST_HEAD)).ok();
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
            allocations(n, || serve_one(&snap, &ids, &telemetry)),
        ),
    ];
    tracing::subscriber::with_default(json_subscriber(), || {
        rows.push((
            "telemetry.record, JSON access log",
            allocations(n, || telemetry.record(&ex)),
        ));
        rows.push((
            "whole request, JSON access log",
            allocations(n, || serve_one(&snap, &ids, &telemetry)),
        ));
    });
    println!("heap allocations per call (target for plan + metrics: <= 2):");
    for (name, (allocs, bytes)) in rows {
        println!("  {name:<40} {allocs:>6.2} allocations {bytes:>8.0} bytes");
    }
}

fn bench_plan(c: &mut Criterion) {
    let snap = snapshot();
    let mut g = c.benchmark_group("plan");
    g.bench_function("v1_verify_request", |b| {
        b.iter(|| plan(black_box(&snap), black_box(&facts(V1))))
    });
    g.bench_function("v2_verify_request", |b| {
        b.iter(|| plan(black_box(&snap), black_box(&facts(V2))))
    });
    g.bench_function("v1_bad_token", |b| {
        let f = RequestFacts {
            token: Some(b"wrong"),
            ..facts(V1)
        };
        b.iter(|| plan(black_box(&snap), black_box(&f)))
    });
    g.finish();
}

fn bench_telemetry(c: &mut Criterion) {
    let snap = snapshot();
    let telemetry = Telemetry::register(&prometheus::Registry::new()).expect("fresh registry");
    let ids = RequestIds::default();
    let ex = served_exchange(&snap);
    let mut g = c.benchmark_group("telemetry");
    g.bench_function("record_no_log_subscriber", |b| {
        b.iter(|| telemetry.record(black_box(&ex)))
    });
    tracing::subscriber::with_default(json_subscriber(), || {
        g.bench_function("record_json_access_log", |b| {
            b.iter(|| telemetry.record(black_box(&ex)))
        });
    });
    g.finish();

    let mut g = c.benchmark_group("request");
    g.bench_function("start_plan_record_no_log_subscriber", |b| {
        b.iter(|| serve_one(&snap, &ids, &telemetry))
    });
    tracing::subscriber::with_default(json_subscriber(), || {
        g.bench_function("start_plan_record_json_access_log", |b| {
            b.iter(|| serve_one(&snap, &ids, &telemetry))
        });
    });
    g.finish();
}

/// The request wrk sends in `benches/compare.sh` (shared/peers/post-verify.lua).
const REQUEST_HEAD: &[u8] = b"POST /api/v1/verify/request HTTP/1.1\r\nHost: 127.0.0.1:8083\r\nContent-Type: application/json\r\nX-Auth-Token: secret\r\nX-Service-Agent-Id: agent-1\r\nContent-Length: 55\r\n\r\n";
/// The answer of the static backend there (shared/peers/backend-nginx.conf).
const RESPONSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 01:00:00 GMT\r\nContent-Type: application/json\r\nContent-Length: 75\r\nConnection: keep-alive\r\nX-Upstream-Path: /api/v2/verify/DEFAULT/request\r\n\r\n";

fn bench_http1(c: &mut Criterion) {
    let mut g = c.benchmark_group("http1");
    let mut request_head = RequestHead::default();
    g.bench_function("parse_request_head", |b| {
        b.iter(|| request_head.parse(black_box(REQUEST_HEAD)))
    });
    let mut response_head = ResponseHead::default();
    g.bench_function("parse_response_head", |b| {
        b.iter(|| response_head.parse(black_box(RESPONSE_HEAD)))
    });
    g.finish();
}

criterion_group!(benches, bench_plan, bench_http1, bench_telemetry);

fn main() {
    print_allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
