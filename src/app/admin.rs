//! The admin listener, separate from proxy traffic: `/metrics`, `/healthz`, `/readyz`,
//! `POST /-/reload`, `/v1-usage` and `/openapi.json`.
//!
//! `/readyz` is about the gateway itself ([`readiness`]): it answers 200 while the process
//! serves (its config loaded, its listeners open) and 503 once it drains. A backend outage
//! does not make it unready, since the gateway answers for the backend (502/504 JSON, counted
//! and alerted on) and a pod taken out of its Service could not; `server.readiness_requires_upstream`
//! makes the last health check's result ([`crate::proxy::health`]) part of it again. Every
//! answer also says that result, read from the checker: a probe never causes a check.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::{Encoder, Registry, TextEncoder};
use serde_json::json;

use crate::app::reload::{ConfigStore, Trigger};
use crate::observe::telemetry::Telemetry;
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

fn json_response(status: u16, body: serde_json::Value) -> Response<Vec<u8>> {
    let body = body.to_string().into_bytes();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts are valid")
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let _ = session.drain_request_body().await;
        let req = session.req_header();
        match (req.method.as_str(), req.uri.path()) {
            ("GET", "/metrics") => {
                self.telemetry
                    .publish(&self.store.current().load(), SystemTime::now());
                let mut out = Vec::new();
                let encoder = TextEncoder::new();
                if let Err(e) = encoder.encode(&self.registry.gather(), &mut out) {
                    return json_response(500, json!({"error": e.to_string()}));
                }
                Response::builder()
                    .status(200)
                    .header(http::header::CONTENT_TYPE, encoder.format_type())
                    .header(http::header::CONTENT_LENGTH, out.len())
                    .body(out)
                    .expect("static response parts are valid")
            }
            ("POST", "/-/reload") => {
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
            ("GET", "/v1-usage") => {
                let report = self
                    .telemetry
                    .usage
                    .report(&self.store.current().load(), SystemTime::now());
                json_response(200, serde_json::to_value(&report).unwrap_or_default())
            }
            ("GET", "/openapi.json") => json_response(
                200,
                crate::api::openapi::document(&self.store.current().load()),
            ),
            ("GET", "/healthz") => json_response(200, json!({"status": "ok"})),
            ("GET", "/readyz") => {
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
            _ => json_response(
                404,
                json!({"status_code": 404, "message_code": 40400, "message": "no such admin endpoint"}),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::readiness;

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
}
