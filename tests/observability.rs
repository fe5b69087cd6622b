//! What ops see, against real processes: exact metric values after a known mix of requests,
//! readiness (the gateway's own, or following the upstream when asked), and the shipped
//! Grafana dashboard reading only metrics the gateway exports. The logs are `tests/access_log.rs`'s.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_gateway::config::file::{AgentFile, BrownoutFile};
use agent_gateway::config::{testing, FileConfig};
use agent_gateway::observe::board;
use common::*;

// ---------------------------------------------------------------------------------------------
// Prometheus text exposition
// ---------------------------------------------------------------------------------------------

type Labels = BTreeMap<String, String>;

/// One sample line of a text exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Labels,
    value: f64,
}

/// Parses `# TYPE` lines and samples; panics on a line it cannot read.
fn parse_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("unreadable sample line {line:?}"),
        };
        let mut labels = Labels::new();
        let mut rest = rest;
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                if c == '}' {
                    end = Some(i);
                    break;
                }
                if c == ',' {
                    continue;
                }
                let key_start = i;
                let mut key_end = i;
                for (j, c) in chars.by_ref() {
                    if c == '=' {
                        key_end = j;
                        break;
                    }
                }
                let key = body[key_start..key_end].to_string();
                assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                let mut value = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(other) => value.push(other),
                            None => panic!("{line}"),
                        },
                        c => value.push(c),
                    }
                }
                labels.insert(key, value);
            }
            let end = end.unwrap_or_else(|| panic!("unterminated labels in {line:?}"));
            rest = &body[end + 1..];
        }
        let value = rest.trim().split(' ').next().unwrap();
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    (types, samples)
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every sample of `name`, by label set.
fn family(samples: &[Sample], name: &str) -> BTreeMap<Labels, f64> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| (s.labels.clone(), s.value))
        .collect()
}

/// `family` with the label sets written as `[(k, v), ..]` and integer values, for assertions.
/// Series the gateway pre-initializes at zero (so `rate()` works from the first scrape) are
/// not traffic, and are left out of the comparison.
fn expect_family(samples: &[Sample], name: &str, want: &[(&[(&str, &str)], u64)]) {
    let mut got = family(samples, name);
    got.retain(|_, v| *v != 0.0);
    let want: BTreeMap<Labels, f64> = want
        .iter()
        .filter(|(_, v)| *v != 0)
        .map(|(l, v)| (labels(l), *v as f64))
        .collect();
    assert_eq!(got, want, "{name}");
}

fn total(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// The samples once `n` requests are counted and none is in flight (a request is counted
/// just after its answer).
fn wait_counted(gw: &Gateway, n: usize) -> Vec<Sample> {
    let mut samples = Vec::new();
    gw.wait_until(&format!("{n} requests counted"), || {
        samples = parse_exposition(&gw.settled_scrape()).1;
        total(&samples, "agent_gateway_requests_total") as usize == n
    });
    samples
}

// ---------------------------------------------------------------------------------------------
// Exact metric values
// ---------------------------------------------------------------------------------------------

/// Adds agent `browned` (token [`testing::TOKEN`]), inside a brownout that refuses all its v1
/// calls.
fn add_browned_agent(cfg: &mut FileConfig) {
    cfg.auth
        .agents
        .push(AgentFile::new("browned", testing::TOKEN));
    cfg.retirement.brownouts.push(BrownoutFile {
        agents: Some(vec!["browned".into()]),
        ..BrownoutFile::new("2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z")
    });
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn metrics_count_a_known_mix_exactly() {
    let backend = backend_with_reset();
    let started_at = unix_now();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent_2());
    cfg.auth.agents.extend(mix_agents());
    add_browned_agent(&mut cfg);
    let gw = Gateway::builder(cfg).start();
    let p = gw.proxy;
    let send = |method, path, agent: &str, body: &str| {
        let headers = agent_headers(agent);
        request(p, method, path, &headers, body.as_bytes()).status
    };
    let statuses = [
        // v1 and v2, authenticated: 7 x 200
        post(p, "/api/v1/verify/request", VERIFY_BODY).status,
        post(p, "/api/v1/verify/request", VERIFY_BODY).status,
        post(p, "/api/v1/verify/request", VERIFY_BODY).status,
        get(p, "/api/v1/transaction/t1/status").status,
        post(p, "/api/v2/connection/S/invitation", INVITATION_BODY).status,
        post(p, "/api/v2/connection/S/invitation", INVITATION_BODY).status,
        get(p, "/api/v2/transaction/t2/status").status,
        // one 401 of each reason
        request(p, "POST", "/api/v1/credential/offer", &[], b"{}").status,
        send("POST", "/api/v2/verify/response", "nobody-zz", "{}"),
        request(
            p,
            "POST",
            "/api/v1/verify/response",
            &[("X-Service-Agent-Id", "agent-1"), ("X-Auth-Token", "wrong")],
            b"{}",
        )
        .status,
        send(
            "POST",
            "/api/v2/verify/OTHER/request",
            "agent-2",
            VERIFY_BODY,
        ),
        // 404, 405, and a 502 because the backend dropped the connection. A wrong method on a
        // v1 path is still a v1 client: it counts under v1 and the path's operation.
        post(p, "/nope-404-path", "{}").status,
        get(p, "/api/v1/verify/request").status,
        post(p, "/api/v2/credential/RESET/offer", OFFER_BODY).status,
        // The retirement policy: a blocked agent (whose v2 calls still pass), a brownout.
        send("POST", "/api/v1/verify/request", "retired", VERIFY_BODY),
        send("POST", "/api/v2/verify/S/request", "retired", VERIFY_BODY),
        send("GET", "/api/v1/transaction/t3/status", "browned", ""),
        // A body without the required business_code; an agent over its rate limit.
        post(p, "/api/v2/verify/S/request", "{}").status,
        send("GET", "/api/v2/transaction/t4/status", "throttled", ""),
        send("GET", "/api/v2/transaction/t5/status", "throttled", ""),
    ];
    assert_eq!(
        statuses,
        [
            200, 200, 200, 200, 200, 200, 200, 401, 401, 401, 401, 404, 405, 502, 410, 200, 410,
            400, 200, 429
        ]
    );
    let samples = wait_counted(&gw, statuses.len());

    let v = |version, op, code| -> [(&str, &str); 3] {
        [("api_version", version), ("code", code), ("operation", op)]
    };
    expect_family(
        &samples,
        "agent_gateway_requests_total",
        &[
            (&v("v1", "verify_request", "200"), 3),
            (&v("v1", "transaction_status", "200"), 1),
            (&v("v2", "connection_invitation", "200"), 2),
            (&v("v2", "transaction_status", "200"), 2),
            (&v("v1", "credential_offer", "401"), 1),
            (&v("v2", "verify_response", "401"), 1),
            (&v("v1", "verify_response", "401"), 1),
            (&v("v2", "verify_request", "401"), 1),
            (&v("none", "unmatched", "404"), 1),
            (&v("v1", "verify_request", "405"), 1),
            (&v("v2", "credential_offer", "502"), 1),
            (&v("v1", "verify_request", "410"), 1),
            (&v("v2", "verify_request", "200"), 1),
            (&v("v1", "transaction_status", "410"), 1),
            (&v("v2", "verify_request", "400"), 1),
            (&v("v2", "transaction_status", "429"), 1),
        ],
    );
    expect_family(
        &samples,
        "agent_gateway_auth_failures_total",
        &[
            (&[("reason", "missing_headers")], 1),
            (&[("reason", "unknown_agent")], 1),
            (&[("reason", "bad_token")], 1),
            (&[("reason", "service_not_allowed")], 1),
        ],
    );
    // Only an authenticated (or allow-list-refused) agent is named; everything else, the
    // unconfigured "nobody-zz" and a configured id with a wrong token included, is "unknown".
    // The 404 names no version and is not counted here.
    let a = |agent, version, op| -> [(&str, &str); 3] {
        [
            ("agent_id", agent),
            ("api_version", version),
            ("operation", op),
        ]
    };
    expect_family(
        &samples,
        "agent_gateway_agent_requests_total",
        &[
            (&a("agent-1", "v1", "verify_request"), 3),
            (&a("agent-1", "v1", "transaction_status"), 1),
            (&a("agent-1", "v2", "connection_invitation"), 2),
            (&a("agent-1", "v2", "transaction_status"), 1),
            (&a("agent-1", "v2", "credential_offer"), 1),
            (&a("agent-1", "v2", "verify_request"), 1),
            (&a("agent-2", "v2", "verify_request"), 1),
            (&a("browned", "v1", "transaction_status"), 1),
            (&a("retired", "v1", "verify_request"), 1),
            (&a("retired", "v2", "verify_request"), 1),
            (&a("throttled", "v2", "transaction_status"), 2),
            (&a("unknown", "v1", "credential_offer"), 1),
            (&a("unknown", "v1", "verify_response"), 1),
            (&a("unknown", "v1", "verify_request"), 1),
            (&a("unknown", "v2", "verify_response"), 1),
        ],
    );
    expect_family(
        &samples,
        "agent_gateway_v1_refusals_total",
        &[
            (&[("agent_id", "browned"), ("reason", "brownout")], 1),
            (&[("agent_id", "retired"), ("reason", "blocked")], 1),
        ],
    );
    expect_family(
        &samples,
        "agent_gateway_validation_failures_total",
        &[(&[("operation", "verify_request"), ("rule", "required")], 1)],
    );
    expect_family(
        &samples,
        "agent_gateway_rate_limited_total",
        &[(&[("agent_id", "throttled")], 1)],
    );
    // The throttled agent's two calls, decided by this process's buckets (the default).
    expect_family(
        &samples,
        "agent_gateway_rate_limit_decisions_total",
        &[
            (&[("backend", "local"), ("result", "allowed")], 1),
            (&[("backend", "local"), ("result", "limited")], 1),
        ],
    );
    expect_family(
        &samples,
        "agent_gateway_rate_limit_backend_errors_total",
        &[],
    );
    // Every caller of v1, refused or not, has a last-seen time from this test's run.
    let last_seen = family(&samples, "agent_gateway_v1_last_seen_timestamp_seconds");
    let seen: Vec<&str> = last_seen.keys().map(|l| l["agent_id"].as_str()).collect();
    assert_eq!(seen, ["agent-1", "browned", "retired", "unknown"]);
    let now = unix_now();
    for (l, t) in &last_seen {
        assert!(
            (started_at - 1.0..=now + 1.0).contains(t),
            "{l:?} last seen at {t}, test ran {started_at}..{now}"
        );
    }
    // A configured agent's first v1 call is kept too, never after its last.
    let first_seen = family(&samples, "agent_gateway_v1_first_seen_timestamp_seconds");
    let firsts: Vec<&str> = first_seen.keys().map(|l| l["agent_id"].as_str()).collect();
    assert_eq!(firsts, ["agent-1", "browned", "retired"]);
    for (l, first) in &first_seen {
        assert!(
            started_at - 1.0 <= *first && *first <= last_seen[l],
            "{l:?}"
        );
    }
    expect_family(
        &samples,
        "agent_gateway_upstream_errors_total",
        &[
            (&[("kind", "connect")], 0),
            (&[("kind", "timeout")], 0),
            (&[("kind", "reset")], 1),
            (&[("kind", "other")], 0),
        ],
    );
    // The one address: in rotation (one reset is no ejection), never ejected, no budget.
    let address = backend.addr.to_string();
    expect_family(
        &samples,
        "agent_gateway_upstream_address_up",
        &[(&[("address", &address)], 1)],
    );
    expect_family(
        &samples,
        "agent_gateway_upstream_ejections_total",
        &[(&[("address", &address)], 0)],
    );
    expect_family(
        &samples,
        "agent_gateway_upstream_overflow_total",
        &[
            (&[("reason", "queue_full")], 0),
            (&[("reason", "timeout")], 0),
        ],
    );
    expect_family(&samples, "agent_gateway_in_flight_requests", &[(&[], 0)]);
    expect_family(
        &samples,
        "agent_gateway_build_info",
        &[(&[("version", env!("CARGO_PKG_VERSION"))], 1)],
    );

    // The request histogram has one series per (version, operation), counting every request.
    let mut per_op: BTreeMap<Labels, f64> = BTreeMap::new();
    for (l, n) in family(&samples, "agent_gateway_requests_total") {
        let key = labels(&[
            ("api_version", &l["api_version"]),
            ("operation", &l["operation"]),
        ]);
        *per_op.entry(key).or_default() += n;
    }
    assert_eq!(
        family(&samples, "agent_gateway_request_duration_seconds_count"),
        per_op
    );
    // The backend histogram counts every request that waited on the backend: the 200s and
    // the one the backend dropped; none of the gateway's refusals.
    expect_family(
        &samples,
        "agent_gateway_upstream_duration_seconds_count",
        &[
            (&[("operation", "verify_request")], 4),
            (&[("operation", "transaction_status")], 3),
            (&[("operation", "connection_invitation")], 2),
            (&[("operation", "credential_offer")], 1),
        ],
    );
    assert_eq!(backend.count(), 10);
    check_histograms(&samples);

    // Config reloads: none yet; the first config is generation 1, applied at start-up.
    expect_family(
        &samples,
        "agent_gateway_config_reloads_total",
        &[(&[("result", "success")], 0), (&[("result", "failure")], 0)],
    );
    expect_family(&samples, "agent_gateway_config_generation", &[(&[], 1)]);
    let loaded = family(
        &samples,
        "agent_gateway_config_last_reload_success_timestamp_seconds",
    );
    let loaded = loaded.get(&Labels::new()).copied().unwrap_or(0.0);
    assert!(
        (started_at - 1.0..=now + 1.0).contains(&loaded),
        "last successful load at {loaded}, gateway started at {started_at}"
    );

    check_labels_are_bounded(
        &samples,
        &["agent-1", "agent-2", "retired", "browned", "throttled"],
    );
}

/// Every histogram: cumulative buckets, `+Inf` equal to `_count`, a sum for each count.
fn check_histograms(samples: &[Sample]) {
    let counts: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name.starts_with("agent_gateway_") && s.name.ends_with("_count"))
        .collect();
    assert!(!counts.is_empty());
    for c in counts {
        let base = c.name.strip_suffix("_count").unwrap();
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| s.name == format!("{base}_bucket"))
            .filter(|s| {
                let mut l = s.labels.clone();
                l.remove("le");
                l == c.labels
            })
            .map(|s| {
                let le = &s.labels["le"];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s.value)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.len() > 2, "{base} {:?} has no buckets", c.labels);
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{base} {:?}: buckets not cumulative",
            c.labels
        );
        let inf = buckets.last().unwrap();
        assert_eq!(inf.0, f64::INFINITY);
        assert_eq!(inf.1, c.value, "{base} {:?}: +Inf != _count", c.labels);
        let sum = samples
            .iter()
            .find(|s| s.name == format!("{base}_sum") && s.labels == c.labels)
            .unwrap_or_else(|| panic!("{base} {:?} has no _sum", c.labels));
        assert!(sum.value >= 0.0 && sum.value.is_finite());
    }
}

/// Label values come from fixed sets (never a raw path, a client's agent id or a token).
fn check_labels_are_bounded(samples: &[Sample], agents: &[&str]) {
    let ops = [
        "verify_request",
        "verify_response",
        "connection_invitation",
        "credential_offer",
        "transaction_status",
        "unmatched",
    ];
    for s in samples
        .iter()
        .filter(|s| s.name.starts_with("agent_gateway_"))
    {
        for (k, v) in &s.labels {
            let ok = match k.as_str() {
                "api_version" => ["v1", "v2", "none"].contains(&v.as_str()),
                "operation" => ops.contains(&v.as_str()),
                "code" => v.len() == 3 && v.bytes().all(|b| b.is_ascii_digit()),
                "agent_id" => v == "unknown" || agents.contains(&v.as_str()),
                "reason" => [
                    "missing_headers",
                    "unknown_agent",
                    "bad_token",
                    "service_not_allowed",
                    "blocked",
                    "brownout",
                    "sunset",
                    "rehearsal",
                    "queue_full",
                    "timeout",
                    "export_failed",
                ]
                .contains(&v.as_str()),
                // An upstream address of the current set (the gauges are made from it at
                // each scrape), never a client's.
                "address" => v.parse::<std::net::SocketAddr>().is_ok(),
                "state" => ["active", "idle"].contains(&v.as_str()),
                "kind" if s.name.starts_with("agent_gateway_rate_limit_") => {
                    ["timeout", "error", "unavailable"].contains(&v.as_str())
                }
                "kind" => ["connect", "timeout", "reset", "other"].contains(&v.as_str()),
                "protocol" => ["http/1.1", "h2"].contains(&v.as_str()),
                "result" if s.name.starts_with("agent_gateway_rate_limit_") => {
                    ["allowed", "limited"].contains(&v.as_str())
                }
                "result" => ["success", "failure"].contains(&v.as_str()),
                "backend" => ["local", "redis", "on_redis_error"].contains(&v.as_str()),
                "v1_policy" => ["allow", "block", "exempt"].contains(&v.as_str()),
                "rule" => [
                    "not_json",
                    "not_object",
                    "required",
                    "type",
                    "duplicate",
                    "item_required",
                    "item_type",
                    "allow_multiple_read_with_connection",
                    "credential_values_required",
                ]
                .contains(&v.as_str()),
                "token" => v.len() == 8 && v.bytes().all(|b| b.is_ascii_hexdigit()),
                "le" => v == "+Inf" || v.parse::<f64>().is_ok(),
                "version" => v == env!("CARGO_PKG_VERSION"),
                _ => false,
            };
            assert!(ok, "{} has an unexpected label {k}={v:?}", s.name);
        }
    }
}

#[test]
fn a_dead_upstream_address_is_a_502_counted_as_a_connect_error() {
    let dead = ClosedPort::new();
    let gw = Gateway::start(&[dead.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", VERIFY_BODY);
    assert_eq!(resp.status, 502);
    let samples = wait_counted(&gw, 1);
    expect_family(
        &samples,
        "agent_gateway_requests_total",
        &[(
            &[
                ("api_version", "v1"),
                ("code", "502"),
                ("operation", "verify_request"),
            ],
            1,
        )],
    );
    expect_family(
        &samples,
        "agent_gateway_upstream_errors_total",
        &[
            (&[("kind", "connect")], 1),
            (&[("kind", "timeout")], 0),
            (&[("kind", "reset")], 0),
            (&[("kind", "other")], 0),
        ],
    );
    expect_family(
        &samples,
        "agent_gateway_agent_requests_total",
        &[(
            &[
                ("agent_id", "agent-1"),
                ("api_version", "v1"),
                ("operation", "verify_request"),
            ],
            1,
        )],
    );
    expect_family(
        &samples,
        "agent_gateway_request_duration_seconds_count",
        &[(&[("api_version", "v1"), ("operation", "verify_request")], 1)],
    );
    // Nothing was sent, so no backend time was observed.
    expect_family(
        &samples,
        "agent_gateway_upstream_duration_seconds_count",
        &[],
    );
    check_histograms(&samples);
}

// ---------------------------------------------------------------------------------------------
// Admin endpoints
// ---------------------------------------------------------------------------------------------

/// `path` on `gw`'s admin listener, with its JSON body.
fn admin_json(gw: &Gateway, path: &str) -> (u16, serde_json::Value) {
    let answer = admin_get(gw.admin, path);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    (answer.status, answer.json())
}

#[test]
fn a_backend_outage_is_answered_and_alerted_on_and_leaves_the_gateway_ready() {
    // The upstream's port is held for the test: no other process can take it while the
    // backend is gone.
    let upstream = ClosedPort::new();
    let backend = Backend::start_on(&upstream);
    let mut cfg = test_config(&[upstream.addr]);
    cfg.upstream.health_check_interval_ms = 100;
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("the first health check", || {
        admin_json(&gw, "/readyz").1["upstream"] == "reachable"
    });
    assert_eq!(
        admin_json(&gw, "/readyz"),
        (
            200,
            serde_json::json!({"status": "ready", "upstream": "reachable"})
        )
    );

    // Dropped, the backend's listener is closed: connections are refused.
    drop(backend);
    assert!(TcpStream::connect(upstream.addr).is_err());
    gw.wait_until("the health check to notice", || {
        admin_json(&gw, "/readyz").1["upstream"] != "reachable"
    });
    // Still ready: the gateway answers for the backend, which a pod out of its Service could not.
    let (status, body) = admin_json(&gw, "/readyz");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert!(
        body["upstream"].as_str().unwrap().contains("reachable"),
        "{body}"
    );
    // Clients get the gateway's JSON error, counted where AgentGatewayUpstreamErrorRatioHigh
    // reads it.
    let answer = post(gw.proxy, VERIFY_V1, BODY);
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(answer.json()["message_code"], 50200);
    gw.wait_for_metric("agent_gateway_upstream_errors_total{kind=\"connect\"}", 1.0);
    gw.wait_for_metric(
        "agent_gateway_requests_total{api_version=\"v1\",code=\"502\",operation=\"verify_request\"}",
        1.0,
    );

    // Liveness is about the process, not the upstream.
    assert_eq!(
        admin_json(&gw, "/healthz"),
        (200, serde_json::json!({"status": "ok"}))
    );

    // Anything listening on the address again, and the check says so.
    let _listener = upstream.listen();
    gw.wait_until("upstream reachable again", || {
        admin_json(&gw, "/readyz").1["upstream"] == "reachable"
    });
}

#[test]
fn readiness_requires_upstream_makes_the_pod_unready_while_no_backend_answers() {
    let upstream = ClosedPort::new();
    let backend = Backend::start_on(&upstream);
    let mut cfg = test_config(&[upstream.addr]);
    cfg.upstream.health_check_interval_ms = 100;
    cfg.server.readiness_requires_upstream = true;
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("/readyz 200 with a live backend", || {
        admin_get(gw.admin, "/readyz").status == 200
    });

    drop(backend);
    gw.wait_until("/readyz 503 once the only upstream is gone", || {
        admin_get(gw.admin, "/readyz").status == 503
    });
    let (_, body) = admin_json(&gw, "/readyz");
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["reason"], "no upstream address is reachable");
    assert_eq!(body["upstream"], body["reason"]);
    assert_eq!(admin_get(gw.admin, "/healthz").status, 200);

    let _listener = upstream.listen();
    gw.wait_until("/readyz 200 again", || {
        admin_get(gw.admin, "/readyz").status == 200
    });
}

#[test]
fn readiness_is_503_while_the_gateway_drains_its_requests() {
    // A request held by the backend keeps the gateway draining after SIGTERM.
    let gate = Gate::new();
    let held = gate.clone();
    let backend = Backend::with(move |_| Action::AfterGate(held.clone(), "{}".into()));
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.grace_period_seconds = 30;
    let gw = Gateway::builder(cfg).process().start();
    assert_eq!(admin_get(gw.admin, "/readyz").status, 200);
    let proxy = gw.proxy;
    let slow = std::thread::spawn(move || get(proxy, STATUS_V1));
    wait_until("the request to reach the backend", || backend.count() == 1);
    gw.terminate();
    gw.wait_until("/readyz 503 draining", || {
        let answer = admin_get(gw.admin, "/readyz");
        answer.status == 503 && answer.json()["reason"] == "draining"
    });
    // The admin listener still serves metrics; the proxy listener takes no new connection.
    assert_eq!(admin_get(gw.admin, "/metrics").status, 200);
    gw.wait_until("the proxy listener to close", || {
        TcpStream::connect(proxy).is_err()
    });
    gate.open();
    assert_eq!(slow.join().unwrap().status, 200);
}

#[test]
fn admin_listener_serves_only_its_endpoints() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let metrics = admin_get(gw.admin, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        metrics.header("content-type")
    );
    assert!(metrics.text().contains("agent_gateway_build_info"));
    assert_eq!(admin_get(gw.admin, "/healthz").status, 200);
    for path in [
        "/index.html",
        "/metrics/",
        "/health",
        "/api/v1/verify/request",
        "/readyz/x",
    ] {
        let resp = admin_get(gw.admin, path);
        assert_eq!(resp.status, 404, "{path}");
        assert_eq!(resp.json()["status_code"], 404, "{path}");
    }
    // Proxy traffic is not served on the admin listener, nor the admin endpoints on the proxy.
    assert_eq!(backend.count(), 0);
    assert_eq!(get(gw.proxy, "/metrics").status, 404);
}

// ---------------------------------------------------------------------------------------------
// The dashboard reads only metrics that exist
// ---------------------------------------------------------------------------------------------

#[test]
fn the_dashboard_is_importable_and_reads_only_exported_metrics() {
    let dash = dashboard();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(dash["uid"].is_string() && dash["title"].is_string());
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(vars.contains(&"datasource"), "a data source variable");

    // Every panel: a unique id, a place on the grid, the data source variable; every target a
    // refId unique within its panel.
    let mut ids = BTreeSet::new();
    for p in dashboard_panels(&dash) {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        let g = &p["gridPos"];
        for k in ["h", "w", "x", "y"] {
            assert!(g[k].is_u64(), "{title}: gridPos.{k}");
        }
        assert!(
            g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
            "{title}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds");
    }

    // A gateway that has seen one request of each kind the dashboard charts.
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.extend(mix_agents());
    let gw = Gateway::builder(cfg).start();
    let n = send_traffic_mix(gw.proxy);
    wait_counted(&gw, n);
    let (types, samples) = parse_exposition(&gw.scrape());
    let names: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();

    let mut used = BTreeSet::new();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 10, "{} queries", queries.len());
    let variable_queries = dashboard_variable_queries(&dash);
    let all = queries
        .iter()
        .map(|q| (q.panel.clone(), q.expr.clone()))
        .chain(
            variable_queries
                .iter()
                .map(|q| ("variable".into(), q.clone())),
        );
    for (panel, expr) in all {
        let metrics = gateway_metric_names(&expr);
        assert!(
            !metrics.is_empty(),
            "{panel}: reads no gateway metric: {expr}"
        );
        for m in metrics {
            assert!(
                names.contains(m.as_str()),
                "{panel}: {m} is not in /metrics (query: {expr})"
            );
            // histogram_quantile needs the buckets of a real histogram.
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .filter(|base| types.get(*base).is_some_and(|t| t == "histogram"))
                .unwrap_or(&m)
                .to_string();
            if m.ends_with("_bucket") {
                assert_eq!(
                    types.get(&family).map(String::as_str),
                    Some("histogram"),
                    "{m}"
                );
            }
            used.insert(family);
        }
    }
    // Every family the gateway exports has a place on the dashboard.
    let exported: BTreeSet<String> = types
        .keys()
        .filter(|n| n.starts_with("agent_gateway_") || n.starts_with("process_"))
        .cloned()
        .collect();
    let missing: Vec<&String> = exported.difference(&used).collect();
    assert!(missing.is_empty(), "not on the dashboard: {missing:?}");
}

#[test]
fn every_dashboard_query_is_scoped_by_job_namespace_and_instance_and_the_board_s_are_among_them() {
    let dash = dashboard();
    // The variables, each listing what the ones before it leave.
    let vars: Vec<(&str, &str)> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["query"]["query"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        vars,
        [
            ("job", "label_values(agent_gateway_build_info, job)"),
            (
                "namespace",
                "label_values(agent_gateway_build_info{job=~\"$job\"}, namespace)"
            ),
            (
                "instance",
                "label_values(agent_gateway_build_info{job=~\"$job\",namespace=~\"$namespace\"}, instance)"
            ),
        ]
    );
    let queries = dashboard_queries(&dash);
    for q in &queries {
        let selectors = metric_selectors(&q.expr);
        assert!(!selectors.is_empty(), "{}: {}", q.panel, q.expr);
        for (metric, matchers) in selectors {
            assert!(
                matchers == DASHBOARD_SCOPE || matchers.ends_with(&format!(",{DASHBOARD_SCOPE}")),
                "{} [{}]: {metric} is not scoped by the variables: {}",
                q.panel,
                q.ref_id,
                q.expr
            );
        }
    }
    // The retirement board's fleet queries are the dashboard's, scope and range aside.
    let exprs: Vec<&str> = queries.iter().map(|q| q.expr.as_str()).collect();
    for board_query in [
        board::v1_share_query(DASHBOARD_SCOPE, "$__rate_interval"),
        board::rate_limited_query(DASHBOARD_SCOPE, "$__range"),
    ] {
        assert!(
            exprs.contains(&board_query.as_str()),
            "not on the dashboard: {board_query}"
        );
    }
}

#[test]
fn the_process_is_measured_cpu_memory_file_descriptors_and_start_time() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let text = gw.scrape();
    let value = |series: &str| {
        metric_value(&text, series).unwrap_or_else(|| panic!("no {series} in /metrics"))
    };
    let (open, max) = (value("process_open_fds"), value("process_max_fds"));
    assert!(open >= 3.0 && open < max, "{open} of {max}");
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_cpu_seconds_total") >= 0.0);
    // The process (this test's) started at or before the gateway inside it.
    let started = value("process_start_time_seconds");
    assert!(started <= value("agent_gateway_start_time_seconds") + 1.0);
    assert!(started > 1.7e9);
}
