//! Assembles the pingora [`Server`]: the proxy listener, the admin listener, background tasks.
//!
//! [`build`] returns a [`Gateway`]; the binary calls [`Gateway::run_forever`], which runs the
//! server with the gateway's own signal handling ([`crate::app::signals`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pingora::apps::http_app::HttpServer;
use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::app::admin::AdminApp;
use crate::app::logging::{LogFormat, Logs};
use crate::app::reload::{ConfigStore, ConfigWatcher};
use crate::app::signals::{BeforeExit, Signals};
use crate::config::{BasePath, Snapshot};
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::{ExportError, Tracer};
use crate::policy::rate_limit::RateLimits;
use crate::proxy::connect::Connect;
use crate::proxy::health::{HealthChecker, UpstreamHealth};
use crate::proxy::pool::{PoolSweeper, UpstreamPool};
use crate::proxy::upstream::Upstream;
use crate::proxy::{Drain, ProxyApp};
use crate::tools::mock_backend::MockBackend;

/// Why the server could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot set up the TLS listener: {0}")]
    Tls(#[from] Box<pingora::Error>),
    #[error("cannot start tracing: {0}")]
    Tracing(#[from] ExportError),
}

/// What `build` needs besides the config.
#[derive(Default)]
pub struct BuildOptions {
    /// pingora's own command-line options (`--upgrade`, `--daemon`); `None` in tests.
    pub pingora_opt: Option<Opt>,
    /// Also serve the mock v2 backend on this address, in the same process (the demo).
    pub mock_backend: Option<SocketAddr>,
    /// The process's logs ([`logging::init`]): the access log writes into them, and they are
    /// flushed at exit. `None` in tests.
    pub logs: Option<Logs>,
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
        upgrade_sock: s.upgrade_sock.clone(),
        ..Default::default()
    }
}

/// The assembled gateway: a pingora server, the signal handling it runs with, and the tracer
/// whose queued spans go out before it exits.
pub struct Gateway {
    pub server: Server,
    pub signals: Signals,
    pub before_exit: Arc<BeforeExit>,
}

impl Gateway {
    /// Runs until a signal ends the process.
    pub fn run_forever(self) -> ! {
        self.server.run(RunArgs {
            shutdown_signal: Box::new(self.signals),
        });
        self.before_exit.flush();
        std::process::exit(0)
    }
}

/// Builds a ready-to-run gateway serving `store`'s config, exporting metrics into `registry`.
pub fn build(
    mut store: ConfigStore,
    registry: &prometheus::Registry,
    options: BuildOptions,
) -> Result<Gateway, ServerError> {
    let snapshot = store.current().load_full();
    let startup = snapshot.startup.clone();
    let mut server = Server::new_with_opt_and_conf(options.pingora_opt, server_conf(&snapshot));
    server.bootstrap();

    let mut telemetry = Telemetry::register(registry)?;
    if let Some(logs) = &options.logs {
        telemetry =
            telemetry.logging_to(logs.sink.clone(), logs.format == LogFormat::Json, registry)?;
    }
    let telemetry = Arc::new(telemetry);
    // State that lives beside the snapshot follows it on every reload: the rate limiter's
    // Redis connection (a new URL reconnects) and the span export pipeline, both built from
    // the config rather than read per request.
    let rate_limits = Arc::new(RateLimits::new(&snapshot.rate_limit));
    let following = rate_limits.clone();
    store.on_apply(move |snap| following.configure(&snap.rate_limit));
    let tracer = Arc::new(Tracer::register(registry)?);
    tracer.configure(snapshot.tracing.as_ref())?;
    let reconfigured = tracer.clone();
    store.on_apply(move |snap| {
        if let Err(e) = reconfigured.configure(snap.tracing.as_ref()) {
            tracing::error!(error = %e, "tracing keeps its previous settings");
        }
    });
    let store = Arc::new(store);
    let config = store.current().clone();

    let health = Arc::new(UpstreamHealth::default());
    let pool = Arc::new(UpstreamPool::new(startup.upstream_keepalive_pool_size));
    // Makes new backend connections (connect timeout, TLS); reuse is the pool's.
    let connector: Arc<dyn Connect> =
        Arc::new(TransportConnector::new(Some(ConnectorOptions::new(0))));
    let upstream = Upstream::new(connector.clone(), pool.clone(), health.clone());
    let drain = Drain::default();
    let proxy_app = ProxyApp::new(
        config.clone(),
        telemetry.clone(),
        tracer.clone(),
        upstream,
        rate_limits,
        drain.clone(),
    );
    let mut proxy = Service::new("agent-gateway proxy".into(), proxy_app);
    // The proxy buffers what it reads itself (src/proxy/h1.rs): pingora's 64 KiB read buffer per
    // connection would only add a copy and 64 MiB of memory per 1000 clients.
    let mut listener = ListenerConfig::tcp(startup.proxy_listen.to_string())
        .l4_buffer(L4BufferSettings::unbuffered());
    if let Some((cert, key)) = &startup.proxy_tls {
        let mut tls = TlsSettings::intermediate(cert, key)?;
        if startup.http2 {
            // Offers h2 then http/1.1: a client that speaks both gets HTTP/2.
            tls.enable_h2();
        }
        listener = listener.tls(tls);
    }
    proxy.add_listener(listener);
    server.add_service(proxy);

    server.add_service(background_service(
        "upstream pool sweeper",
        PoolSweeper {
            pool,
            config: config.clone(),
        },
    ));
    server.add_service(background_service(
        "upstream health checks",
        HealthChecker {
            config: config.clone(),
            health: health.clone(),
            connector,
        },
    ));
    if startup.watch_config {
        server.add_service(background_service(
            "config watcher",
            ConfigWatcher {
                store: store.clone(),
            },
        ));
    }
    if let Some(addr) = startup.admin_listen {
        let app = HttpServer::new_app(AdminApp {
            registry: registry.clone(),
            health: health.clone(),
            store: store.clone(),
            telemetry: telemetry.clone(),
        });
        let mut admin = Service::new("agent-gateway admin".into(), app);
        admin.add_tcp(&addr.to_string());
        server.add_service(admin);
    }

    if let Some(addr) = options.mock_backend {
        server.add_service(mock_backend_service(addr, snapshot.bases.upstream.clone()));
    }
    let before_exit = Arc::new(BeforeExit {
        tracer,
        logs: options.logs.map(|logs| logs.sink),
    });
    let signals = Signals {
        store,
        in_flight: telemetry.in_flight.clone(),
        drain,
        before_exit: before_exit.clone(),
        grace: Duration::from_secs(startup.grace_period_seconds),
    };
    Ok(Gateway {
        server,
        signals,
        before_exit,
    })
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
