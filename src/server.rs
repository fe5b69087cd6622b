//! Assembles the pingora [`Server`]: the proxy listener, the admin listener, background tasks.
//!
//! The caller owns the server's lifecycle: the binary calls `run_forever()` (pingora then
//! handles SIGTERM, SIGQUIT upgrades and SIGINT); an embedder can call `run()` instead.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::{AdminApp, Readiness, UpstreamProbe};
use crate::config::{BasePath, Snapshot};
use crate::mock_backend::MockBackend;
use crate::proxy::ProxyApp;
use crate::telemetry::Telemetry;

/// Why the server could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What `build` needs besides the config.
#[derive(Default)]
pub struct BuildOptions {
    /// pingora's own command-line options (`--upgrade`, `--daemon`); `None` in tests.
    pub pingora_opt: Option<Opt>,
    /// Also serve the mock v2 backend on this address, in the same process (the demo).
    pub mock_backend: Option<SocketAddr>,
}

/// The pingora server configuration derived from a snapshot's start-up settings.
fn server_conf(snap: &Snapshot) -> ServerConf {
    let s = &snap.startup;
    ServerConf {
        threads: s.threads,
        work_stealing: s.work_stealing,
        grace_period_seconds: Some(s.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(s.grace_period_seconds.max(1)),
        upstream_keepalive_pool_size: s.upstream_keepalive_pool_size,
        ..Default::default()
    }
}

/// Builds a ready-to-run server for `snapshot`, exporting metrics into `registry`.
pub fn build(
    snapshot: Snapshot,
    registry: &prometheus::Registry,
    options: BuildOptions,
) -> Result<Server, ServerError> {
    let mut server = Server::new_with_opt_and_conf(options.pingora_opt, server_conf(&snapshot));
    server.bootstrap();

    let startup = snapshot.startup.clone();
    let config = Arc::new(ArcSwap::from_pointee(snapshot));
    let telemetry = Arc::new(Telemetry::register(registry)?);

    let proxy_app = ProxyApp::new(
        config.clone(),
        telemetry,
        startup.upstream_keepalive_pool_size,
    );
    let mut proxy = Service::new("agent-gateway proxy".into(), proxy_app);
    proxy.add_tcp(&startup.proxy_listen.to_string());
    server.add_service(proxy);

    let readiness = Arc::new(Readiness::default());
    server.add_service(background_service(
        "upstream probe",
        UpstreamProbe {
            config: config.clone(),
            readiness: readiness.clone(),
        },
    ));
    if let Some(addr) = startup.admin_listen {
        let app = HttpServer::new_app(AdminApp {
            registry: registry.clone(),
            readiness,
        });
        let mut admin = Service::new("agent-gateway admin".into(), app);
        admin.add_tcp(&addr.to_string());
        server.add_service(admin);
    }

    if let Some(addr) = options.mock_backend {
        let base = config.load().bases.upstream.clone();
        server.add_service(mock_backend_service(addr, base));
    }
    Ok(server)
}

/// The mock v2 backend as a pingora service on `addr`.
pub fn mock_backend_service(addr: SocketAddr, base: BasePath) -> Service<HttpServer<MockBackend>> {
    let mut svc = Service::new(
        "mock v2 backend".into(),
        HttpServer::new_app(MockBackend::new(base)),
    );
    svc.add_tcp(&addr.to_string());
    svc
}

/// A server that runs only the mock backend.
pub fn build_mock_backend(addr: SocketAddr, base: BasePath, threads: usize) -> Server {
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    server.add_service(mock_backend_service(addr, base));
    server
}
