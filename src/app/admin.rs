//! The admin listener, separate from proxy traffic: `/metrics`, `/healthz`, `/readyz`,
//! `POST /-/reload`, `/v1-usage` and `/openapi.json`.
//!
//! `/readyz` reads the last result of [`crate::proxy::health`]'s checks: a scrape never causes a probe.

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

/// The admin HTTP service.
pub struct AdminApp {
    pub registry: Registry,
    pub health: Arc<UpstreamHealth>,
    pub store: Arc<ConfigStore>,
    pub telemetry: Arc<Telemetry>,
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
            ("GET", "/readyz") => match self.health.readiness() {
                Ok(()) => json_response(200, json!({"status": "ready"})),
                Err(reason) => json_response(503, json!({"status": "not_ready", "reason": reason})),
            },
            _ => json_response(
                404,
                json!({"status_code": 404, "message_code": 40400, "message": "no such admin endpoint"}),
            ),
        }
    }
}
