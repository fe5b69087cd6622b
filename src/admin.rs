//! The admin listener: `/metrics`, `/healthz`, `/readyz`, `POST /-/reload`, separate from
//! proxy traffic.
//!
//! Readiness is a cached answer: [`UpstreamProbe`] connects to each upstream address in the
//! background, and `/readyz` only reads its last result, so a scrape never causes a probe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{Encoder, Registry, TextEncoder};
use serde_json::json;

use crate::config::Snapshot;
use crate::reload::{ConfigStore, Trigger};
use crate::telemetry::Telemetry;

/// How often the readiness probe connects to the upstream addresses.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The last result of the upstream probe.
#[derive(Default)]
pub struct Readiness {
    probed: AtomicBool,
    reachable: AtomicBool,
}

impl Readiness {
    /// `Ok` when ready, else the reason.
    pub fn state(&self) -> Result<(), &'static str> {
        if !self.probed.load(Ordering::Acquire) {
            return Err("upstream addresses not probed yet");
        }
        if !self.reachable.load(Ordering::Acquire) {
            return Err("no upstream address is reachable");
        }
        Ok(())
    }
}

/// Background task that keeps [`Readiness`] current.
pub struct UpstreamProbe {
    pub config: Arc<ArcSwap<Snapshot>>,
    pub readiness: Arc<Readiness>,
}

impl UpstreamProbe {
    async fn probe_once(&self) {
        let snap = self.config.load_full();
        let mut any = false;
        for addr in &snap.upstream.addresses {
            let attempt = tokio::time::timeout(
                snap.upstream.connect_timeout,
                tokio::net::TcpStream::connect(addr),
            );
            if matches!(attempt.await, Ok(Ok(_))) {
                any = true;
                break;
            }
        }
        self.readiness.reachable.store(any, Ordering::Release);
        self.readiness.probed.store(true, Ordering::Release);
    }
}

#[async_trait]
impl BackgroundService for UpstreamProbe {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.probe_once().await;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(PROBE_INTERVAL) => {}
            }
        }
    }
}

/// The admin HTTP service.
pub struct AdminApp {
    pub registry: Registry,
    pub readiness: Arc<Readiness>,
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
            ("GET", "/healthz") => json_response(200, json!({"status": "ok"})),
            ("GET", "/readyz") => match self.readiness.state() {
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
