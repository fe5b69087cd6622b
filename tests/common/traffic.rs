//! Agents with a policy of their own and a mix of requests of every kind the dashboard
//! charts, shared by the metrics, access-log and Prometheus tests.

use std::net::SocketAddr;

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::TOKEN;
use agent_gateway::config::V1Policy;

use super::client::{agent_headers, get, post, request, INVITATION_BODY, VERIFY_BODY};

/// Two agents with token [`TOKEN`]: `retired`, whose v1 calls the retirement policy refuses
/// with 410 (and whose own deprecation and sunset dates have passed), and `throttled`, allowed
/// one request and then (for the next 1000 s) refused with 429.
pub fn mix_agents() -> [AgentFile; 2] {
    let retired = AgentFile {
        v1_policy: V1Policy::Block,
        deprecated_at: Some("2026-01-01T00:00:00Z".into()),
        sunset_at: Some("2026-06-01T00:00:00Z".into()),
        ..AgentFile::new("retired", TOKEN)
    };
    let throttled = AgentFile {
        rate_limit_per_second: Some(0.001),
        burst: Some(1),
        ..AgentFile::new("throttled", TOKEN)
    };
    [retired, throttled]
}

/// Sends one request of every kind the dashboard charts, through `proxy` (which must reach a
/// backend that answers 200, and know `agent-1` and [`mix_agents`]): v1 and v2 by a
/// configured agent, a v1 call refused by the retirement policy, a body that breaks the
/// schema, a rate-limited call, a 401, a 404. Returns how many requests it sent.
pub fn send_traffic_mix(proxy: SocketAddr) -> usize {
    let throttled = agent_headers("throttled");
    let sent = [
        post(proxy, "/api/v1/verify/request", VERIFY_BODY).status,
        get(proxy, "/api/v1/transaction/tx-1/status").status,
        post(proxy, "/api/v2/connection/SVC/invitation", INVITATION_BODY).status,
        get(proxy, "/api/v2/transaction/tx-2/status").status,
        request(
            proxy,
            "POST",
            "/api/v1/verify/request",
            &agent_headers("retired"),
            VERIFY_BODY.as_bytes(),
        )
        .status,
        post(proxy, "/api/v2/verify/SVC/request", "{}").status,
        request(
            proxy,
            "GET",
            "/api/v2/transaction/tx-3/status",
            &throttled[..2],
            b"",
        )
        .status,
        request(
            proxy,
            "GET",
            "/api/v2/transaction/tx-4/status",
            &throttled[..2],
            b"",
        )
        .status,
        request(proxy, "POST", "/api/v1/credential/offer", &[], b"{}").status,
        post(proxy, "/not-an-operation", "{}").status,
    ];
    // The throttled agent's first call of the test passes; every later one is refused.
    let first_throttled = if sent[6] == 200 { 200 } else { 429 };
    assert_eq!(
        sent,
        [200, 200, 200, 200, 410, 400, first_throttled, 429, 401, 404],
        "traffic mix answers"
    );
    sent.len()
}

/// Agent `agent-2` (token [`TOKEN`]), allowed only the service `ONLY`.
pub fn agent_2() -> AgentFile {
    AgentFile {
        services: Some(vec!["ONLY".into()]),
        ..AgentFile::new("agent-2", TOKEN)
    }
}
