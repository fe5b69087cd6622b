//! The admin listener, separate from proxy traffic: `/metrics`, `/healthz`, `/readyz`,
//! `POST /-/reload`, `/v1-usage`, `/openapi.json`, `/config`, and at `/` the retirement board
//! ([`super::board`]), from this gateway's counts or, with `retirement.prometheus_url`, the
//! fleet's.
//!
//! Each endpoint is a row of [`ENDPOINTS`]: its method, its path and who may call it
//! ([`Access`]), and every request passes [`authorize`] with its endpoint's access, on its
//! head, before its body is read or it is served: that is the one place where admin
//! authorization is decided, in [`crate::policy::admin`] (the admin token as a bearer token,
//! or as a browser's Basic password where nothing changes; loopback only without a token;
//! nothing for what another site's page makes a browser ask for). Each refusal's answer is [`Refusal::response`].
//!
//! Every answer is computed when it is asked for (a metric, a reload's result, the usage
//! report, the running config), so each carries `Cache-Control: no-store`: a cache between an
//! operator and the gateway must never serve an old `safe_to_block`. pingora adds `Date`.
//!
//! `/readyz` is about the gateway itself ([`readiness`]): it answers 200 while the process
//! serves (its config loaded, its listeners open) and 503 once it drains (SIGTERM; a SIGQUIT
//! handover leaves it 200, the new process serving the address). A backend outage
//! does not make it unready, since the gateway answers for the backend (502/504 JSON, counted
//! and alerted on) and a pod taken out of its Service could not; `server.readiness_requires_upstream`
//! makes the last health check's result ([`crate::proxy::health`]) part of it again. Every
//! answer also says that result, read from the checker: a probe never causes a check.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::{Encoder, Registry, TextEncoder};
use serde_json::json;

use crate::app::board;
use crate::app::reload::{ConfigStore, Trigger};
use crate::config::{dump, format_time, Snapshot};
use crate::observe::board::{self as observe_board, Figures, Source};
use crate::observe::prometheus::PrometheusApi;
use crate::observe::telemetry::Telemetry;
use crate::policy::admin::{authorize, Access, Caller, Denied};
use crate::proxy::health::UpstreamHealth;
use crate::proxy::Drain;

/// The admin HTTP service.
pub struct AdminApp {
    pub registry: Registry,
    pub health: Arc<UpstreamHealth>,
    pub store: Arc<ConfigStore>,
    pub telemetry: Arc<Telemetry>,
    /// Started when the gateway stops taking connections: `/readyz` then answers 503.
    pub drain: Drain,
}

/// How long the board waits for `retirement.prometheus_url` before it shows this gateway's
/// own counts instead.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(10);

/// What `/readyz` answers, from the gateway's state: `Err` with the reason when it should not
/// be sent traffic. `upstream` is the last health check's result, which counts only when
/// `requires_upstream` (`server.readiness_requires_upstream`).
pub fn readiness(
    draining: bool,
    upstream: Result<(), &'static str>,
    requires_upstream: bool,
) -> Result<(), &'static str> {
    if draining {
        return Err("draining");
    }
    if requires_upstream {
        upstream?;
    }
    Ok(())
}

/// What the admin listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Metrics,
    Healthz,
    Readyz,
    Reload,
    V1Usage,
    OpenApi,
    Config,
    Board,
}

/// Every endpoint: method, path, access.
const ENDPOINTS: [(&str, &str, Endpoint, Access); 8] = [
    ("GET", "/metrics", Endpoint::Metrics, Access::Metrics),
    ("GET", "/healthz", Endpoint::Healthz, Access::Open),
    ("GET", "/readyz", Endpoint::Readyz, Access::Open),
    ("POST", "/-/reload", Endpoint::Reload, Access::AdminAction),
    ("GET", "/v1-usage", Endpoint::V1Usage, Access::Admin),
    ("GET", "/openapi.json", Endpoint::OpenApi, Access::Admin),
    ("GET", "/config", Endpoint::Config, Access::Admin),
    ("GET", "/", Endpoint::Board, Access::Admin),
];

/// Why a request reaches no endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    NotFound,
    /// Its body could not be read (a broken chunked encoding, a connection lost).
    UnreadableBody,
    /// Its body is longer than [`BODY_LIMIT`].
    BodyTooLarge,
    /// Its caller may not ([`authorize`]).
    Denied(Denied),
    /// The path's endpoint takes `allow`.
    MethodNotAllowed {
        allow: &'static str,
    },
}

impl Refusal {
    fn response(self) -> Response<Vec<u8>> {
        match self {
            Refusal::NotFound => json_response(
                404,
                json!({"status_code": 404, "message_code": 40400, "message": "no such admin endpoint"}),
            ),
            Refusal::Denied(Denied::Unauthorized { basic }) => {
                let message = if basic {
                    "this admin endpoint needs the admin token: Authorization: Bearer <token>, or Basic with the token as the password"
                } else {
                    "this admin endpoint needs the admin token: Authorization: Bearer <token>"
                };
                let mut r = json_response(
                    401,
                    json!({"status_code": 401, "message_code": 40100, "message": message}),
                );
                let headers = r.headers_mut();
                let challenge = http::HeaderValue::from_static("Bearer");
                headers.insert(http::header::WWW_AUTHENTICATE, challenge);
                if basic {
                    // The challenge a browser answers by asking for a user name and password.
                    let challenge = http::HeaderValue::from_static(
                        "Basic realm=\"agent-gateway admin\", charset=\"UTF-8\"",
                    );
                    headers.append(http::header::WWW_AUTHENTICATE, challenge);
                }
                r
            }
            Refusal::Denied(Denied::FromAnotherSite) => json_response(
                403,
                json!({"status_code": 403, "message_code": 40301, "message": "this admin endpoint does not answer what another site's page made a browser ask for with the browser's own credentials (Basic, or a loopback address): open it directly, or send Authorization: Bearer <token>"}),
            ),
            Refusal::UnreadableBody => json_response(
                400,
                json!({"status_code": 400, "message_code": 40001, "message": "the request body could not be read as framed"}),
            ),
            Refusal::BodyTooLarge => json_response(
                413,
                json!({"status_code": 413, "message_code": 41300, "message": "no admin endpoint takes a request body; this one is over 64 KiB"}),
            ),
            Refusal::Denied(Denied::LoopbackOnly) => json_response(
                403,
                json!({"status_code": 403, "message_code": 40300, "message": "without an admin token (admin.token_sha256) this admin endpoint answers only connections from loopback"}),
            ),
            Refusal::Denied(Denied::NotLoopbackName) => json_response(
                403,
                json!({"status_code": 403, "message_code": 40302, "message": "without an admin token (admin.token_sha256) this admin endpoint answers only requests to a loopback name (localhost, 127.0.0.1, [::1]), not to a name that resolves to this host"}),
            ),
            Refusal::MethodNotAllowed { allow } => {
                let mut r = json_response(
                    405,
                    json!({"status_code": 405, "message_code": 40500, "message": "method not allowed for this admin endpoint"}),
                );
                let allow = http::HeaderValue::from_static(allow);
                r.headers_mut().insert(http::header::ALLOW, allow);
                r
            }
        }
    }
}

/// The endpoint `method` and `path` name, with who may call it.
fn route(method: &str, path: &str) -> Result<(Endpoint, Access), Refusal> {
    let at_path = || ENDPOINTS.iter().filter(move |(_, p, ..)| *p == path);
    // A HEAD is answered as its GET is; pingora sends no body.
    let method = if method == "HEAD" { "GET" } else { method };
    if let Some((_, _, endpoint, access)) = at_path().find(|(m, ..)| *m == method) {
        return Ok((*endpoint, *access));
    }
    match at_path().next() {
        // A GET endpoint takes HEAD too, and says so (RFC 9110 §10.2.1).
        Some(&("GET", ..)) => Err(Refusal::MethodNotAllowed { allow: "GET, HEAD" }),
        Some((allow, ..)) => Err(Refusal::MethodNotAllowed { allow }),
        None => Err(Refusal::NotFound),
    }
}

/// An answer computed now: never to be stored by a cache.
fn response(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(body)
        .expect("static response parts are valid")
}

fn json_response(status: u16, body: serde_json::Value) -> Response<Vec<u8>> {
    response(status, "application/json", body.to_string().into_bytes())
}

impl AdminApp {
    async fn serve(&self, endpoint: Endpoint) -> Response<Vec<u8>> {
        match endpoint {
            Endpoint::Metrics => {
                self.telemetry
                    .publish(&self.store.current().load(), SystemTime::now());
                let mut out = Vec::new();
                let encoder = TextEncoder::new();
                if let Err(e) = encoder.encode(&self.registry.gather(), &mut out) {
                    return json_response(500, json!({"error": e.to_string()}));
                }
                response(200, encoder.format_type(), out)
            }
            Endpoint::Reload => {
                let store = self.store.clone();
                let report =
                    tokio::task::spawn_blocking(move || store.reload(Trigger::Admin, false)).await;
                match report {
                    Ok(Some(r)) => {
                        let status = if r.result == "success" { 200 } else { 422 };
                        json_response(status, serde_json::to_value(&r).unwrap_or_default())
                    }
                    Ok(None) => json_response(
                        409,
                        json!({"result": "failure", "problems": [{"key": "", "message": "this gateway was not started from a config file"}]}),
                    ),
                    Err(e) => json_response(
                        500,
                        json!({"result": "failure", "problems": [{"key": "", "message": e.to_string()}]}),
                    ),
                }
            }
            Endpoint::V1Usage => {
                let report = self
                    .telemetry
                    .usage
                    .report(&self.store.current().load(), SystemTime::now());
                json_response(200, serde_json::to_value(&report).unwrap_or_default())
            }
            Endpoint::OpenApi => json_response(
                200,
                crate::api::openapi::document(&self.store.current().load()),
            ),
            Endpoint::Config => json_response(200, self.running_config()),
            Endpoint::Board => {
                let snapshot = self.store.current().load_full();
                let now = SystemTime::now();
                let figures = self.board_figures(&snapshot, now).await;
                let mut answer = response(
                    200,
                    "text/html; charset=utf-8",
                    board::page(&observe_board::board(&snapshot, figures, now)).into_bytes(),
                );
                let headers = answer.headers_mut();
                for (name, value) in [
                    ("content-security-policy", board::content_security_policy()),
                    ("x-content-type-options", "nosniff"),
                    ("referrer-policy", "no-referrer"),
                ] {
                    headers.insert(name, http::HeaderValue::from_static(value));
                }
                answer
            }
            Endpoint::Healthz => json_response(200, json!({"status": "ok"})),
            Endpoint::Readyz => {
                let upstream = self.health.reachable();
                let requires_upstream = self
                    .store
                    .current()
                    .load()
                    .startup
                    .readiness_requires_upstream;
                let upstream_text = upstream.err().unwrap_or("reachable");
                // A handover is no drain for the load balancer: the address stays in service,
                // the new process answering on it.
                let draining = self.drain.started() && !self.drain.is_handover();
                match readiness(draining, upstream, requires_upstream) {
                    Ok(()) => {
                        json_response(200, json!({"status": "ready", "upstream": upstream_text}))
                    }
                    Err(reason) => json_response(
                        503,
                        json!({"status": "not_ready", "reason": reason, "upstream": upstream_text}),
                    ),
                }
            }
        }
    }

    /// The board's figures: the fleet's from `retirement.prometheus_url` when it is set and
    /// answers within [`PROMETHEUS_TIMEOUT`], else this gateway's own (saying why).
    async fn board_figures(&self, snapshot: &Snapshot, now: SystemTime) -> Figures {
        let own = |source| {
            let by_version = self.telemetry.requests_by_version();
            let count = |v: &str| by_version.get(v).copied().unwrap_or(0);
            Figures {
                usage: self.telemetry.usage.report(snapshot, now),
                rate_limited: self.telemetry.rate_limited_by_agent(),
                v1_share: observe_board::share(count("v1"), count("v2")),
                source,
            }
        };
        let Some(url) = &snapshot.retirement.prometheus_url else {
            return own(Source::Gateway);
        };
        let fleet = async {
            let options = &snapshot.retirement.prometheus_client;
            let mut api = PrometheusApi::new(url, options).map_err(|e| e.to_string())?;
            let base = api.base();
            let selector = &snapshot.retirement.prometheus_selector;
            observe_board::fleet_figures(&mut api, base, selector)
                .await
                .map_err(|e| e.to_string())
        };
        let error = match tokio::time::timeout(PROMETHEUS_TIMEOUT, fleet).await {
            Ok(Ok(figures)) => return figures,
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} s", PROMETHEUS_TIMEOUT.as_secs()),
        };
        own(Source::GatewayInstead {
            prometheus: url.clone(),
            error,
        })
    }

    /// The endpoint the request's head names, if its caller may call it.
    fn authorized(&self, session: &ServerSession) -> Result<Endpoint, Refusal> {
        let is_loopback = |addr: Option<&pingora::protocols::l4::socket::SocketAddr>| {
            addr.and_then(|a| a.as_inet())
                .is_some_and(|a| a.ip().to_canonical().is_loopback())
        };
        // Both ends: a sidecar proxy relays its network to the pod's address from a loopback
        // one (Istio's 127.0.0.6), kubectl port-forward and this host's own clients connect
        // from loopback to loopback.
        let from_loopback =
            is_loopback(session.client_addr()) && is_loopback(session.server_addr());
        let req = session.req_header();
        let caller = Caller::of(
            |name| req.headers.get(name).map(|v| v.as_bytes()),
            from_loopback,
        );
        let admin = &self.store.current().load().admin;
        let (endpoint, access) = route(req.method.as_str(), req.uri.path())?;
        authorize(access, admin, &caller).map_err(Refusal::Denied)?;
        Ok(endpoint)
    }

    /// `/config`: the running snapshot's effective config ([`dump::effective`]), when it was
    /// loaded and from what.
    fn running_config(&self) -> serde_json::Value {
        let snapshot = self.store.current().load();
        let source = &snapshot.source;
        json!({
            "generation": self.store.generation(),
            "loaded_at": format_time(source.loaded_at),
            "path": self.store.path().map(|p| p.display().to_string()),
            "sha256": source.sha256.map(hex::encode),
            // The config's text and every file read with it, Secrets included: what replicas
            // that run the same configuration agree on.
            "inputs_sha256": source.sha256.map(|_| hex::encode(source.inputs.fingerprint)),
            "config": dump::to_json(&snapshot),
        })
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let endpoint = match self.authorized(session) {
            Ok(endpoint) => endpoint,
            Err(refusal) => {
                // Refused on its head: its body is never read, and the connection is not kept
                // for it (keeping it means reading the body first), so a caller with no right
                // to the listener cannot make it read a body without end.
                if !session.is_body_empty() {
                    session.set_keepalive(None);
                }
                return refusal.response();
            }
        };
        // A body none of the endpoints reads, read before anything is done: one that cannot
        // be (a broken chunk), or is too long for any admin client, is refused, and the
        // connection closed.
        if let Err(refusal) = drain_body(session).await {
            session.set_keepalive(None);
            return refusal.response();
        }
        self.serve(endpoint).await
    }
}

/// No admin endpoint reads a body: what a client that sends one anyway may send (a `{}`).
const BODY_LIMIT: usize = 64 * 1024;

/// Reads the request's body to its end, and no further than [`BODY_LIMIT`].
async fn drain_body(session: &mut ServerSession) -> Result<(), Refusal> {
    let mut read = 0;
    while let Some(chunk) = session
        .read_request_body()
        .await
        .map_err(|_| Refusal::UnreadableBody)?
    {
        read += chunk.len();
        if read > BODY_LIMIT {
            return Err(Refusal::BodyTooLarge);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOWN: Result<(), &str> = Err("no upstream address is reachable");

    #[test]
    fn the_gateway_is_ready_whatever_its_backend_does_until_it_drains() {
        for upstream in [Ok(()), DOWN, Err("upstream addresses not checked yet")] {
            assert_eq!(readiness(false, upstream, false), Ok(()));
            assert_eq!(readiness(true, upstream, false), Err("draining"));
        }
    }

    #[test]
    fn requiring_the_upstream_makes_its_outage_the_reason() {
        assert_eq!(readiness(false, Ok(()), true), Ok(()));
        assert_eq!(readiness(false, DOWN, true), DOWN);
        assert_eq!(readiness(true, DOWN, true), Err("draining"));
    }

    #[test]
    fn every_endpoint_is_routed_and_other_methods_get_405_with_allow() {
        for (method, path, endpoint, access) in ENDPOINTS {
            assert_eq!(route(method, path).unwrap(), (endpoint, access));
        }
        assert_eq!(route("HEAD", "/metrics").unwrap().0, Endpoint::Metrics);
        let refused = route("GET", "/-/reload").unwrap_err();
        assert_eq!(refused, Refusal::MethodNotAllowed { allow: "POST" });
        let answer = refused.response();
        assert_eq!(answer.status(), 405);
        assert_eq!(answer.headers()["allow"], "POST");
        assert_eq!(
            route("POST", "/metrics"),
            Err(Refusal::MethodNotAllowed { allow: "GET, HEAD" })
        );
        assert_eq!(route("GET", "/nothing"), Err(Refusal::NotFound));
    }

    #[test]
    fn the_config_and_reload_are_admin_endpoints() {
        let with = |access| -> Vec<(&str, &str)> {
            ENDPOINTS
                .iter()
                .filter(|(.., a)| *a == access)
                .map(|(method, path, ..)| (*method, *path))
                .collect()
        };
        assert_eq!(
            with(Access::Admin),
            [
                ("GET", "/v1-usage"),
                ("GET", "/openapi.json"),
                ("GET", "/config"),
                ("GET", "/")
            ]
        );
        // Every endpoint that changes something is an action: Basic credentials never open it.
        assert_eq!(with(Access::AdminAction), [("POST", "/-/reload")]);
    }

    #[test]
    fn each_denial_has_its_answer() {
        let answer = |denied| Refusal::Denied(denied).response();
        let challenges = |basic| {
            let answer = answer(Denied::Unauthorized { basic });
            assert_eq!(answer.status(), 401);
            answer
                .headers()
                .get_all("www-authenticate")
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            challenges(true),
            [
                "Bearer",
                "Basic realm=\"agent-gateway admin\", charset=\"UTF-8\""
            ]
        );
        assert_eq!(challenges(false), ["Bearer"]);
        let code = |denied| {
            let answer = answer(denied);
            let body: serde_json::Value = serde_json::from_slice(answer.body()).unwrap();
            (
                answer.status().as_u16(),
                body["message_code"].as_u64().unwrap(),
            )
        };
        assert_eq!(code(Denied::LoopbackOnly), (403, 40300));
        assert_eq!(code(Denied::FromAnotherSite), (403, 40301));
        assert_eq!(code(Denied::NotLoopbackName), (403, 40302));
    }
}
