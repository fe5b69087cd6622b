//! The admin listener, separate from proxy traffic: `/metrics`, `/healthz`, `/readyz`,
//! `POST /-/reload`, `/v1-usage`, `/openapi.json`, `/config`, and at `/` the retirement board
//! ([`super::board`]), from this gateway's counts or, with `retirement.prometheus_url`, the
//! fleet's.
//!
//! Each endpoint is a row of [`ENDPOINTS`]: its method, its path and who may call it
//! ([`Access`]), and every request passes [`authorize`] with its endpoint's access before it
//! is served: that is the one place where admin authorization is decided. With
//! `[admin] token_sha256` set, every endpoint but the probes (and `/metrics`, unless
//! `admin.protect_metrics`) needs `Authorization: Bearer <token>`, or, on those that change
//! nothing, `Basic` credentials with the token as the password: what a browser asks for and
//! keeps, so that the board opens in one. Without a token those endpoints answer only
//! connections from loopback (this host, or a `kubectl port-forward`), so that an
//! admin listener bound to a pod's or a host's address opens no admin action to its network.
//! Both are credentials a browser presents by itself, so neither opens anything to a request
//! the browser says another site's page made ([`FetchedFrom`]).
//!
//! Every answer is computed when it is asked for (a metric, a reload's result, the usage
//! report, the running config), so each carries `Cache-Control: no-store`: a cache between an
//! operator and the gateway must never serve an old `safe_to_block`. pingora adds `Date`.
//!
//! `/readyz` is about the gateway itself ([`readiness`]): it answers 200 while the process
//! serves (its config loaded, its listeners open) and 503 once it drains. A backend outage
//! does not make it unready, since the gateway answers for the backend (502/504 JSON, counted
//! and alerted on) and a pod taken out of its Service could not; `server.readiness_requires_upstream`
//! makes the last health check's result ([`crate::proxy::health`]) part of it again. Every
//! answer also says that result, read from the checker: a probe never causes a check.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use base64::prelude::{Engine as _, BASE64_STANDARD};
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::{Encoder, Registry, TextEncoder};
use serde_json::json;

use crate::app::board;
use crate::app::reload::{ConfigStore, Trigger};
use crate::config::{dump, format_time, AdminConfig, Snapshot, TokenDigest};
use crate::observe::board::{self as observe_board, Figures, Source};
use crate::observe::prometheus::PrometheusApi;
use crate::observe::telemetry::Telemetry;
use crate::policy::auth::matching_digest;
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

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// The probes: a kubelet has no token.
    Open,
    /// `/metrics`: open, unless `admin.protect_metrics` puts it behind the admin token.
    Metrics,
    /// What shows what the gateway knows (its config, every agent id, the retirement board's
    /// plan of every agent): behind the admin token when there is one, and for loopback only
    /// when there is none.
    Admin,
    /// What changes the gateway: as [`Access::Admin`], but only a bearer token opens it, never
    /// the Basic credentials a browser keeps and sends by itself (see [`presented_token`]).
    AdminAction,
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
    /// The endpoint needs the admin token, and the request did not carry a valid one; `basic`:
    /// the endpoint also takes it as Basic credentials.
    Unauthorized {
        basic: bool,
    },
    /// No admin token is configured, and the request came from another host.
    LoopbackOnly,
    /// A request a browser says another site's page made ([`FetchedFrom`]), with only the
    /// credentials the browser presents by itself: Basic ones, or its loopback address.
    FromAnotherSite,
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
            Refusal::Unauthorized { basic } => {
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
            Refusal::FromAnotherSite => json_response(
                403,
                json!({"status_code": 403, "message_code": 40301, "message": "this admin endpoint does not answer what another site's page made a browser ask for with the browser's own credentials (Basic, or a loopback address): open it directly, or send Authorization: Bearer <token>"}),
            ),
            Refusal::LoopbackOnly => json_response(
                403,
                json!({"status_code": 403, "message_code": 40300, "message": "without an admin token (admin.token_sha256) this admin endpoint answers only connections from loopback"}),
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
        Some((allow, ..)) => Err(Refusal::MethodNotAllowed { allow }),
        None => Err(Refusal::NotFound),
    }
}

/// What [`authorize`] knows of a request.
#[derive(Debug, Clone, Copy)]
struct Caller<'a> {
    /// Its `Authorization` header.
    authorization: Option<&'a [u8]>,
    from_loopback: bool,
    /// Where a browser says it comes from.
    fetched_from: FetchedFrom,
}

/// Where a browser says a request comes from, by its Fetch Metadata headers. Browsers send
/// them only to `https://` and loopback addresses; elsewhere, and from clients other than
/// browsers, [`FetchedFrom::NotSaid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchedFrom {
    NotSaid,
    /// The listener's own page (`Sec-Fetch-Site: same-origin`), or typed or bookmarked (`none`).
    OwnPage,
    /// Another site's page, as a link a person followed: a top-level navigation the user made
    /// (`Sec-Fetch-Mode: navigate`, `Sec-Fetch-Dest: document`, `Sec-Fetch-User: ?1`).
    LinkFollowed,
    /// Another site's page, by itself: an image, a frame, a fetch, a script's navigation.
    AnotherSite,
}

impl FetchedFrom {
    fn of(
        site: Option<&[u8]>,
        mode: Option<&[u8]>,
        dest: Option<&[u8]>,
        user: Option<&[u8]>,
    ) -> Self {
        match site {
            None => FetchedFrom::NotSaid,
            Some(b"same-origin" | b"none") => FetchedFrom::OwnPage,
            Some(_)
                if mode == Some(b"navigate")
                    && dest == Some(b"document")
                    && user == Some(b"?1") =>
            {
                FetchedFrom::LinkFollowed
            }
            Some(_) => FetchedFrom::AnotherSite,
        }
    }

    /// Whether credentials a browser presents by itself (Basic ones, its loopback address) may
    /// open an endpoint of `access` for a request from here. Such a request reads nothing,
    /// but it may act (a reload, from a form another site's page submits), and each board it
    /// loads may query Prometheus for seconds. A link followed opens what changes nothing.
    fn lets_a_browser_s_own_credentials_open(self, access: Access) -> bool {
        match self {
            FetchedFrom::NotSaid | FetchedFrom::OwnPage => true,
            FetchedFrom::LinkFollowed => access != Access::AdminAction,
            FetchedFrom::AnotherSite => false,
        }
    }
}

/// Whether `caller` may reach an endpoint of `access`, under `admin`: the one place where
/// admin authorization is decided. No token configured: the admin endpoints answer loopback
/// only, the others everyone. The token is compared as a digest, against every configured one
/// in constant time (a rotation lists the old and the new).
fn authorize(access: Access, admin: &AdminConfig, caller: &Caller) -> Result<(), Refusal> {
    let needs_token = match access {
        Access::Open => false,
        Access::Metrics => admin.protect_metrics,
        Access::Admin | Access::AdminAction => true,
    };
    if !needs_token {
        return Ok(());
    }
    let browser_may = caller
        .fetched_from
        .lets_a_browser_s_own_credentials_open(access);
    if admin.tokens.is_empty() {
        return match access {
            Access::Admin | Access::AdminAction if !caller.from_loopback => {
                Err(Refusal::LoopbackOnly)
            }
            Access::Admin | Access::AdminAction if !browser_may => Err(Refusal::FromAnotherSite),
            _ => Ok(()),
        };
    }
    // Basic credentials open what changes nothing (see `presented_token`).
    let basic = access != Access::AdminAction;
    let refused = Refusal::Unauthorized { basic };
    let presented = caller
        .authorization
        .and_then(|value| presented_token(value, basic))
        .ok_or(refused)?;
    let (Presented::Bearer(digest) | Presented::Basic(digest)) = &presented;
    matching_digest(digest, &admin.tokens).ok_or(refused)?;
    // After the token: a wrong one is a 401 however it came.
    match presented {
        Presented::Basic(_) if !browser_may => Err(Refusal::FromAnotherSite),
        _ => Ok(()),
    }
}

/// An admin token as a request presents it, by its digest.
enum Presented {
    Bearer(TokenDigest),
    /// Basic credentials with the token as the password: a browser's, which it sends by itself.
    Basic(TokenDigest),
}

/// The admin token an `Authorization` header presents: `Bearer <token>`, or, where `basic`,
/// `Basic` credentials with the token as the password (any user name). A browser asks for
/// those on a 401 and then sends them to the listener with every request, those a page on
/// another site makes it send included (cross-site request forgery): so they are taken only
/// where the answer changes nothing, which another site cannot read, and not at all for what
/// a browser says another site's page made ([`FetchedFrom`]).
fn presented_token(value: &[u8], basic: bool) -> Option<Presented> {
    if let Some(token) = bearer_token(value) {
        return Some(Presented::Bearer(TokenDigest::of(token)));
    }
    if !basic {
        return None;
    }
    basic_password(value).map(|password| Presented::Basic(TokenDigest::of(&password)))
}

/// The token of `Bearer <token>` (the scheme in any case, RFC 9110 11.1).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    let token = token.trim_ascii();
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
}

/// The password of `Basic <base64 of user:password>` (RFC 7617; the scheme in any case), when
/// there is one.
fn basic_password(value: &[u8]) -> Option<Vec<u8>> {
    let (scheme, encoded) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let pair = BASE64_STANDARD.decode(encoded.trim_ascii()).ok()?;
    let colon = memchr::memchr(b':', &pair)?;
    let password = &pair[colon + 1..];
    (!password.is_empty()).then(|| password.to_vec())
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
                match readiness(self.drain.started(), upstream, requires_upstream) {
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
            observe_board::fleet_figures(&mut api, base)
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
            "config": dump::to_json(&snapshot),
        })
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let _ = session.drain_request_body().await;
        let req = session.req_header();
        let header = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let caller = Caller {
            authorization: header("authorization"),
            from_loopback: match session.client_addr() {
                Some(pingora::protocols::l4::socket::SocketAddr::Inet(peer)) => {
                    peer.ip().to_canonical().is_loopback()
                }
                _ => false,
            },
            fetched_from: FetchedFrom::of(
                header("sec-fetch-site"),
                header("sec-fetch-mode"),
                header("sec-fetch-dest"),
                header("sec-fetch-user"),
            ),
        };
        let admin = &self.store.current().load().admin;
        let routed = route(req.method.as_str(), req.uri.path())
            .and_then(|(endpoint, access)| authorize(access, admin, &caller).map(|()| endpoint));
        match routed {
            Ok(endpoint) => self.serve(endpoint).await,
            Err(refusal) => refusal.response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOWN: Result<(), &str> = Err("no upstream address is reachable");

    /// A request with `authorization`, from loopback or not, that no browser says another
    /// site made.
    fn caller(authorization: Option<&[u8]>, from_loopback: bool) -> Caller<'_> {
        Caller {
            authorization,
            from_loopback,
            fetched_from: FetchedFrom::NotSaid,
        }
    }

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
    fn admin_endpoints_need_the_token_or_without_one_loopback() {
        let open = AdminConfig::default();
        let closed = AdminConfig {
            tokens: vec![TokenDigest::of(b"old"), TokenDigest::of(b"new")],
            protect_metrics: false,
        };
        let metrics_too = AdminConfig {
            protect_metrics: true,
            ..closed.clone()
        };
        for access in [
            Access::Open,
            Access::Metrics,
            Access::Admin,
            Access::AdminAction,
        ] {
            assert_eq!(authorize(access, &open, &caller(None, true)), Ok(()));
        }
        // Without a token, from another host: the probes and metrics, nothing else.
        assert_eq!(authorize(Access::Open, &open, &caller(None, false)), Ok(()));
        assert_eq!(
            authorize(Access::Metrics, &open, &caller(None, false)),
            Ok(())
        );
        for admin in [Access::Admin, Access::AdminAction] {
            assert_eq!(
                authorize(admin, &open, &caller(Some(b"Bearer any"), false)),
                Err(Refusal::LoopbackOnly)
            );
        }
        assert_eq!(Refusal::LoopbackOnly.response().status(), 403);
        assert_eq!(
            authorize(Access::Open, &metrics_too, &caller(None, false)),
            Ok(())
        );
        assert_eq!(
            authorize(Access::Metrics, &closed, &caller(None, false)),
            Ok(())
        );
        let refused = Err(Refusal::Unauthorized { basic: true });
        assert_eq!(
            authorize(Access::Metrics, &metrics_too, &caller(None, true)),
            refused
        );
        // With a token, loopback is no exception.
        assert_eq!(
            authorize(Access::Admin, &closed, &caller(None, true)),
            refused
        );
        // A bearer token opens everything; Basic, the token as the password and any user
        // name, only what changes nothing.
        for (good, opens_actions) in [
            (&b"Bearer old"[..], true),
            (b"Bearer new", true),
            (b"bearer new", true),
            (b"BEARER  new ", true),
            (b"Basic YWRtaW46bmV3", false), // admin:new
            (b"BASIC  Om9sZA== ", false),   // :old
            (b"basic dTpuZXc=", false),     // u:new
        ] {
            assert_eq!(
                authorize(Access::Admin, &closed, &caller(Some(good), false)),
                Ok(())
            );
            assert_eq!(
                authorize(Access::Metrics, &metrics_too, &caller(Some(good), false)),
                Ok(())
            );
            let action = match opens_actions {
                true => Ok(()),
                false => Err(Refusal::Unauthorized { basic: false }),
            };
            assert_eq!(
                authorize(Access::AdminAction, &closed, &caller(Some(good), false)),
                action,
                "{good:?}"
            );
        }
        for bad in [
            &b"Bearer wrong"[..],
            b"Bearer ",
            b"Basic b2xkOg==", // old: (the token as the user name, no password)
            b"Basic OmJsZA==", // :bld
            b"Basic bmV3",     // new (no colon)
            b"Basic Om5ldw=",  // :new, but not base64 (one pad short)
            b"Basic ",
            b"Basic",
            b"old",
            b"Bearerold",
        ] {
            assert_eq!(
                authorize(Access::Admin, &closed, &caller(Some(bad), true)),
                refused,
                "{bad:?}"
            );
        }
        let challenges = |basic| {
            let answer = Refusal::Unauthorized { basic }.response();
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
    }

    #[test]
    fn a_browser_s_own_credentials_open_nothing_another_site_s_page_asks_for() {
        let closed = AdminConfig {
            tokens: vec![TokenDigest::of(b"new")],
            protect_metrics: true,
        };
        let open = AdminConfig::default();
        let by = |authorization: Option<&'static [u8]>, from_loopback, fetched_from| Caller {
            authorization,
            from_loopback,
            fetched_from,
        };
        let basic = Some(&b"Basic dTpuZXc="[..]); // u:new
        for access in [Access::Admin, Access::Metrics] {
            assert_eq!(
                authorize(access, &closed, &by(basic, false, FetchedFrom::AnotherSite)),
                Err(Refusal::FromAnotherSite)
            );
            assert_eq!(
                authorize(
                    access,
                    &closed,
                    &by(basic, false, FetchedFrom::LinkFollowed)
                ),
                Ok(())
            );
            // A wrong token is refused as everywhere; a bearer token no browser sends by itself.
            let wrong = by(Some(b"Basic dTpvbGQ="), false, FetchedFrom::AnotherSite); // u:old
            assert_eq!(
                authorize(access, &closed, &wrong),
                Err(Refusal::Unauthorized { basic: true })
            );
            let bearer = by(Some(b"Bearer new"), false, FetchedFrom::AnotherSite);
            assert_eq!(authorize(access, &closed, &bearer), Ok(()));
        }
        // Without a token, a loopback address is what a browser presents by itself.
        for (access, fetched_from, answer) in [
            (
                Access::Admin,
                FetchedFrom::AnotherSite,
                Err(Refusal::FromAnotherSite),
            ),
            (Access::Admin, FetchedFrom::LinkFollowed, Ok(())),
            (Access::Admin, FetchedFrom::OwnPage, Ok(())),
            (
                Access::AdminAction,
                FetchedFrom::AnotherSite,
                Err(Refusal::FromAnotherSite),
            ),
            // A form another site's page submits, by a person's click.
            (
                Access::AdminAction,
                FetchedFrom::LinkFollowed,
                Err(Refusal::FromAnotherSite),
            ),
            (Access::AdminAction, FetchedFrom::OwnPage, Ok(())),
            (Access::Metrics, FetchedFrom::AnotherSite, Ok(())),
        ] {
            let caller = by(None, true, fetched_from);
            assert_eq!(
                authorize(access, &open, &caller),
                answer,
                "{access:?} {fetched_from:?}"
            );
        }
        assert_eq!(Refusal::FromAnotherSite.response().status(), 403);
    }

    #[test]
    fn fetch_metadata_says_where_a_request_comes_from() {
        use FetchedFrom::*;
        // Sec-Fetch-Site, -Mode, -Dest and -User ("": absent).
        for (site, mode, dest, user, from) in [
            ("", "", "", "", NotSaid),
            ("same-origin", "cors", "empty", "", OwnPage),
            ("none", "navigate", "document", "?1", OwnPage),
            // A link from a dashboard on another site to the board, clicked.
            ("cross-site", "navigate", "document", "?1", LinkFollowed),
            ("same-site", "navigate", "document", "?1", LinkFollowed),
            // The same navigation by the page's script, with no click.
            ("cross-site", "navigate", "document", "", AnotherSite),
            ("cross-site", "no-cors", "image", "", AnotherSite),
            ("cross-site", "navigate", "iframe", "?1", AnotherSite),
            ("same-site", "cors", "empty", "", AnotherSite),
            ("cross-site", "", "", "", AnotherSite),
        ] {
            let header = |value: &'static str| (!value.is_empty()).then_some(value.as_bytes());
            assert_eq!(
                FetchedFrom::of(header(site), header(mode), header(dest), header(user)),
                from,
                "{site} {mode} {dest} {user}"
            );
        }
    }
}
