//! Distributed tracing against the real binary: W3C trace context from a client through the
//! gateway to a recording backend, and the spans the gateway exports, as a recording OTLP/HTTP
//! collector decodes them (`tests/common/otlp.rs`). Sampling, refusals, a collector that is
//! down or hangs, reloads, and the spans queued when the gateway stops.

mod common;

use std::net::SocketAddr;

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::AGENT_ID;
use agent_gateway::config::FileConfig;
use common::curl::{curl, header_args};
use common::otlp::{Answer, Collector, Received};
use common::*;

/// The client's trace and span (W3C's own example ids).
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7";

/// The harness config in front of `backend`, exporting to `collector` at `sample_ratio`,
/// quickly. Reloads are asked for (`POST /-/reload`), never picked up from the file by chance.
fn traced(backend: SocketAddr, collector: &Collector, sample_ratio: f64) -> FileConfig {
    let mut cfg = test_config(&[backend]);
    cfg.server.watch_config = false;
    cfg.tracing.otlp_endpoint = Some(collector.endpoint());
    cfg.tracing.sample_ratio = sample_ratio;
    cfg.tracing.service_name = "gateway-under-test".into();
    cfg.tracing.scheduled_delay_ms = 20;
    cfg
}

/// An authenticated v1 verify POST with `extra` headers.
fn verify(gw: &Gateway, extra: &[(&str, &str)]) -> Response {
    as_agent(gw.proxy, AGENT_ID, "POST", VERIFY_V1, extra)
}

fn sampled_parent() -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
}

/// The trace and parent span ids of a `traceparent` the backend received.
fn ids(traceparent: &str) -> (String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(
        (parts.len(), parts[0], traceparent.len()),
        (4, "00", 55),
        "{traceparent}"
    );
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[test]
fn a_client_trace_goes_through_the_gateway_to_the_backend_and_its_span_is_exported() {
    let (backend, collector) = (Backend::start(), Collector::start());
    // Ratio 0: the client's sampled flag alone has the span recorded.
    let gw = Gateway::builder(traced(backend.addr, &collector, 0.0)).start();
    let traceparent = sampled_parent();
    let answer = verify(
        &gw,
        &[
            ("traceparent", &traceparent),
            ("tracestate", TRACESTATE),
            ("User-Agent", "trace-test/1"),
            // A name the gateway can learn only from the request, not from its socket.
            ("Host", "gw.test:8443"),
        ],
    );
    assert_eq!(answer.status, 200, "{}", answer.text());

    let seen = backend.last();
    let (trace, parent, flags) = ids(seen.header("traceparent").expect("a traceparent"));
    assert_eq!((trace.as_str(), flags.as_str()), (CLIENT_TRACE, "01"));
    assert_ne!(
        parent, CLIENT_SPAN,
        "the backend's parent is the gateway's span"
    );
    assert_eq!(seen.header("tracestate"), Some(TRACESTATE));
    assert_eq!(headers_named(&seen.headers, "traceparent").len(), 1);

    let span = collector.span_of_trace(CLIENT_TRACE);
    assert_eq!(span.span_id(), parent);
    assert_eq!(span.parent_span_id(), CLIENT_SPAN);
    assert_eq!(span.service_name, "gateway-under-test");
    assert_eq!(span.span.name, "POST /api/v1/verify/request");
    assert_eq!(span.span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(span.span.trace_state, TRACESTATE.replace(' ', ""));
    assert_eq!(
        span.span.status.clone().unwrap_or_default().code,
        0,
        "unset"
    );
    for (key, value) in [
        ("http.request.method", "POST"),
        ("http.route", "/api/v1/verify/request"),
        ("url.path", "/api/v1/verify/request"),
        ("url.scheme", "http"),
        ("network.protocol.version", "1.1"),
        ("server.address", "gw.test"),
        ("client.address", "127.0.0.1"),
        ("user_agent.original", "trace-test/1"),
        ("agent_gateway.operation", "verify_request"),
        ("agent_gateway.api_version", "v1"),
        ("agent_gateway.agent_id", AGENT_ID),
        ("agent_gateway.auth", "ok"),
        (
            "agent_gateway.upstream.path",
            "/api/v2/verify/ORG_DEFAULT/request",
        ),
        ("agent_gateway.upstream.address", &backend.addr.to_string()),
        (
            "agent_gateway.request_id",
            answer.header("x-request-id").unwrap(),
        ),
    ] {
        assert_eq!(span.string(key).as_deref(), Some(value), "{key}");
    }
    assert_eq!(span.int("http.response.status_code"), Some(200));
    assert_eq!(span.int("server.port"), Some(8443));
    assert_eq!(span.int("http.request.body.size"), Some(BODY.len() as i64));
    assert_eq!(
        span.event_names(),
        [
            "gateway.admitted",
            "gateway.body_received",
            "gateway.body_validated",
            "upstream.connected",
            "upstream.response_head",
            "upstream.response_end"
        ]
    );
    let export = &collector.exports()[0];
    assert_eq!(
        (
            export.method.as_str(),
            export.path.as_str(),
            export.content_type.as_str()
        ),
        ("POST", "/v1/traces", "application/x-protobuf")
    );

    let line = gw.access_line(answer.header("x-request-id").unwrap());
    assert_eq!(line["trace_id"], CLIENT_TRACE, "{line}");
}

#[test]
fn an_http2_request_is_traced_the_same_way() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let gw = Gateway::builder(traced(backend.addr, &collector, 0.0)).start();
    let traceparent = sampled_parent();
    let mut args = header_args(&AUTH);
    args.extend(header_args(&[
        ("traceparent", &traceparent),
        ("tracestate", TRACESTATE),
    ]));
    args.extend(["--http2-prior-knowledge", "-d", BODY].map(String::from));
    args.push(format!("http://{}{VERIFY_V1}", gw.proxy));
    let answer = curl(args);
    assert_eq!(
        (answer.version.as_str(), answer.status),
        ("2", 200),
        "{answer:?}"
    );

    let seen = backend.last();
    let (trace, parent, flags) = ids(seen.header("traceparent").expect("a traceparent"));
    assert_eq!((trace.as_str(), flags.as_str()), (CLIENT_TRACE, "01"));
    assert_eq!(seen.header("tracestate"), Some(TRACESTATE));
    let span = collector.span_of_trace(CLIENT_TRACE);
    assert_eq!(span.span_id(), parent);
    assert_eq!(span.parent_span_id(), CLIENT_SPAN);
    assert_eq!(span.span.name, "POST /api/v1/verify/request");
    assert_eq!(
        span.string("network.protocol.version").as_deref(),
        Some("2")
    );
    assert_eq!(
        span.string("server.address"),
        Some(gw.proxy.ip().to_string())
    );
    assert_eq!(span.int("server.port"), Some(i64::from(gw.proxy.port())));
    assert_eq!(span.int("http.response.status_code"), Some(200));
}

#[test]
fn without_a_traceparent_the_gateway_starts_the_trace() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let gw = Gateway::builder(traced(backend.addr, &collector, 1.0)).start();
    // A tracestate without a trace to go with belongs to no trace: it is not passed on.
    let answer = verify(&gw, &[("tracestate", TRACESTATE)]);
    assert_eq!(answer.status, 200);
    let seen = backend.last();
    let (trace, parent, flags) = ids(seen.header("traceparent").expect("a traceparent"));
    assert_eq!(flags, "01");
    assert_eq!(seen.header("tracestate"), None);
    let span = collector.span_of_trace(&trace);
    assert_eq!(span.span_id(), parent);
    assert_eq!(span.parent_span_id(), "");
    let line = gw.access_line(answer.header("x-request-id").unwrap());
    assert_eq!(line["trace_id"], trace.as_str(), "{line}");
}

#[test]
fn refusals_are_spans_with_their_status() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let mut cfg = traced(backend.addr, &collector, 1.0);
    cfg.limits.max_body_bytes = 128;
    let mut limited = AgentFile::new("limited", "limited-token");
    limited.rate_limit_per_second = Some(0.001);
    limited.burst = Some(1);
    let mut blocked = AgentFile::new("blocked", "blocked-token");
    blocked.v1_policy = agent_gateway::config::V1Policy::Block;
    cfg.auth.agents.extend([limited, blocked]);
    let gw = Gateway::builder(cfg).start();
    let as_agent = |id: &str, token: &str| {
        let headers = [
            ("X-Service-Agent-Id", id),
            ("X-Auth-Token", token),
            ("Content-Type", "application/json"),
        ];
        request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &headers,
            BODY.as_bytes(),
        )
        .status
    };
    assert_eq!(as_agent(AGENT_ID, "wrong"), 401);
    assert_eq!(get(gw.proxy, "/api/v1/nothing-here").status, 404);
    assert_eq!(as_agent("blocked", "blocked-token"), 410);
    let big = format!(r#"{{"business_code":"{}"}}"#, "x".repeat(200));
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", &big).status, 413);
    assert_eq!(as_agent("limited", "limited-token"), 200);
    assert_eq!(as_agent("limited", "limited-token"), 429);

    let spans = collector.spans_when("six spans", |s| s.len() >= 6);
    let with = |status: i64| -> &Received {
        spans
            .iter()
            .find(|s| s.int("http.response.status_code") == Some(status))
            .unwrap_or_else(|| panic!("no span with status {status}"))
    };
    for (status, message_code) in [
        (401, 40100),
        (404, 40400),
        (410, 41001),
        (413, 41300),
        (429, 42900),
    ] {
        let span = with(status);
        assert_eq!(span.int("agent_gateway.message_code"), Some(message_code));
        // A client error is not the server span's: status unset, no error.type.
        assert_eq!(span.span.status.clone().unwrap_or_default().code, 0);
        assert_eq!(span.string("error.type"), None);
    }
    assert_eq!(
        with(401).string("agent_gateway.auth").as_deref(),
        Some("bad_token")
    );
    assert_eq!(
        with(410).string("agent_gateway.agent_id").as_deref(),
        Some("blocked")
    );
    assert_eq!(with(429).span.name, "POST /api/v1/verify/request");
    assert_eq!(with(404).span.name, "GET");
    assert_eq!(
        backend.count(),
        1,
        "only the first limited call was forwarded"
    );
}

#[test]
fn a_backend_failure_is_an_error_span() {
    let collector = Collector::start();
    let dead = ClosedPort::new();
    let gw = Gateway::builder(traced(dead.addr, &collector, 1.0)).start();
    assert_eq!(verify(&gw, &[]).status, 502);
    let spans = collector.spans_when("one span", |s| !s.is_empty());
    let status = spans[0].span.status.clone().expect("a status");
    assert_eq!(status.code, 2, "STATUS_CODE_ERROR");
    assert_eq!(status.message, "the backend could not be reached");
    assert_eq!(spans[0].string("error.type").as_deref(), Some("connect"));
    assert_eq!(
        spans[0].event_names(),
        [
            "gateway.admitted",
            "gateway.body_received",
            "gateway.body_validated"
        ]
    );
}

#[test]
fn at_ratio_zero_nothing_is_exported_but_what_the_client_sampled() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let gw = Gateway::builder(traced(backend.addr, &collector, 0.0)).start();
    for _ in 0..20 {
        assert_eq!(verify(&gw, &[]).status, 200);
        let (_, _, flags) = ids(backend.last().header("traceparent").unwrap());
        assert_eq!(flags, "00", "unsampled, and the backend is told so");
    }
    // Spans leave in the order they end: once this one is in, any before it would be too.
    assert_eq!(
        verify(&gw, &[("traceparent", &sampled_parent())]).status,
        200
    );
    let spans = collector.spans_when("the sampled span", |s| !s.is_empty());
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].trace_id(), CLIENT_TRACE);
    // Counted once the collector's answer is in, just after it recorded the export.
    gw.wait_for_metric("agent_gateway_trace_spans_exported_total", 1.0);
}

#[test]
fn a_collector_that_is_down_costs_requests_nothing_and_its_lost_spans_are_counted() {
    let backend = Backend::start();
    let nobody = ClosedPort::new();
    let mut cfg = test_config(&[backend.addr]);
    cfg.tracing.otlp_endpoint = Some(format!("http://{}", nobody.addr));
    cfg.tracing.scheduled_delay_ms = 20;
    let gw = Gateway::builder(cfg).start();
    for _ in 0..20 {
        assert_eq!(verify(&gw, &[]).status, 200);
    }
    gw.wait_for_metric_at_least(
        r#"agent_gateway_trace_spans_dropped_total{reason="export_failed"}"#,
        20.0,
    );
    assert_eq!(gw.metric("agent_gateway_trace_spans_exported_total"), 0.0);
    gw.wait_until("the export failure in the log", || {
        gw.log().contains("span export failed")
    });
}

#[test]
fn a_collector_that_hangs_fills_the_queue_and_the_spans_past_it_are_dropped_and_counted() {
    let (backend, collector) = (Backend::start(), Collector::answering(Answer::Stall));
    let mut cfg = traced(backend.addr, &collector, 1.0);
    cfg.tracing.max_queue_size = 2;
    cfg.tracing.max_export_batch_size = 1;
    cfg.tracing.export_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg).start();
    for _ in 0..30 {
        assert_eq!(verify(&gw, &[]).status, 200);
    }
    // One span in the export that hangs, at most two queued behind it: the rest are dropped.
    // A span ends just after its answer is sent, so the last ones may still be on their way.
    gw.wait_for_metric_at_least(
        r#"agent_gateway_trace_spans_dropped_total{reason="queue_full"}"#,
        27.0,
    );
    assert_eq!(backend.count(), 30);
}

#[test]
fn no_token_or_credential_appears_in_any_exported_span() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let mut cfg = traced(backend.addr, &collector, 1.0);
    const TOKEN: &str = "tok-7c1e9a44d0b2f3e5";
    const WRONG: &str = "wrong-5d2b8f61a9c0e4b7";
    cfg.auth.agents.push(AgentFile::new("holder", TOKEN));
    let gw = Gateway::builder(cfg).start();
    let mut statuses = Vec::new();
    for token in [TOKEN, WRONG] {
        let headers = [
            ("X-Service-Agent-Id", "holder"),
            ("X-Auth-Token", token),
            ("Content-Type", "application/json"),
            ("Authorization", token),
            ("Cookie", token),
        ];
        for target in [
            format!("/api/v1/verify/request?token={token}"),
            format!("/api/v1/transaction/tx-1/status?token={token}"),
        ] {
            let method = if target.contains("status") {
                "GET"
            } else {
                "POST"
            };
            let body = if method == "POST" {
                BODY.as_bytes()
            } else {
                b""
            };
            statuses.push(request(gw.proxy, method, &target, &headers, body).status);
        }
    }
    assert_eq!(statuses, [200, 200, 401, 401]);
    let spans = collector.spans_when("four spans", |s| s.len() >= 4);
    assert_eq!(spans.len(), 4);
    for export in collector.exports() {
        for secret in [TOKEN, WRONG] {
            let found = export
                .body
                .windows(secret.len())
                .any(|w| w == secret.as_bytes());
            assert!(!found, "{secret} is in an export: {:?}", export.request);
        }
    }
}

#[test]
fn tracing_follows_reloads_on_off_and_its_settings() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let on = traced(backend.addr, &collector, 1.0);
    let mut off = on.clone();
    off.tracing.otlp_endpoint = None;
    let gw = Gateway::builder(off.clone()).start();

    // Off: the client's trace context passes as it came.
    let traceparent = sampled_parent();
    verify(&gw, &[("traceparent", &traceparent)]);
    assert_eq!(
        backend.last().header("traceparent"),
        Some(traceparent.as_str())
    );

    let mut a = on.clone();
    a.tracing.service_name = "gw-a".into();
    gw.reload(&a);
    verify(&gw, &[]);
    let (first, _, _) = ids(backend.last().header("traceparent").unwrap());
    assert_eq!(collector.span_of_trace(&first).service_name, "gw-a");

    let mut b = on;
    b.tracing.service_name = "gw-b".into();
    gw.reload(&b);
    verify(&gw, &[]);
    let (second, _, _) = ids(backend.last().header("traceparent").unwrap());
    assert_eq!(collector.span_of_trace(&second).service_name, "gw-b");

    gw.reload(&off);
    let answer = verify(&gw, &[]);
    assert_eq!(backend.last().header("traceparent"), None);
    let line = gw.access_line(answer.header("x-request-id").unwrap());
    assert!(line.get("trace_id").is_none(), "{line}");
}

#[test]
fn spans_still_queued_are_sent_when_the_gateway_stops() {
    let (backend, collector) = (Backend::start(), Collector::start());
    let mut cfg = traced(backend.addr, &collector, 1.0);
    // Nothing would be sent for an hour but for the stop.
    cfg.tracing.scheduled_delay_ms = 3_600_000;
    let mut gw = Gateway::builder(cfg).process().start();
    assert_eq!(verify(&gw, &[]).status, 200);
    let (trace, _, _) = ids(backend.last().header("traceparent").unwrap());
    assert!(collector.spans().is_empty());
    gw.terminate();
    gw.wait_exit();
    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].trace_id(), trace);
}
