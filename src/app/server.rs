//! Assembles the gateway: [`build`] makes every part of it from a config store into a
//! [`Gateway`], which [`crate::app::serve::serve`] runs on its listeners. The binary runs that
//! inside pingora's [`Server`] ([`run`]), which gives it its runtimes, its signal handling
//! ([`crate::app::signals`]) and the SIGQUIT handover of the listening sockets.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::listeners::tls::TlsSettings;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{ListenFds, RunArgs, Server, ShutdownWatch};
use pingora::services::background::BackgroundService;
use pingora::services::Service;

use crate::app::admin::AdminApp;
use crate::app::listeners::Listeners;
use crate::app::logging::{LogFormat, Logs};
use crate::app::reload::{ConfigStore, ConfigWatcher};
use crate::app::serve::{serve, BeforeExit, Gateway};
use crate::app::served_cert::ServedCert;
use crate::app::signals::Signals;
use crate::config::Snapshot;
use crate::observe::backend::AddressGauges;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::{ExportError, Tracer};
use crate::policy::rate_limit::RateLimits;
use crate::proxy::backends::Backends;
use crate::proxy::connect::{BackendConnector, Connect};
use crate::proxy::health::{HealthChecker, UpstreamHealth};
use crate::proxy::names::{resolve_at_start, NameFollower};
use crate::proxy::pool::{PoolSweeper, UpstreamPool};
use crate::proxy::upstream::address_views;
use crate::proxy::upstream::Upstream;
use crate::proxy::{Drain, ProxyApp};
use crate::tools::mock_backend::MockBackend;

/// Why the gateway could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot set up the TLS listener: {0}")]
    Tls(#[from] Box<pingora::Error>),
    #[error("cannot start tracing: {0}")]
    Tracing(#[from] ExportError),
    #[error("{0}")]
    Unresolved(String),
}

/// What `build` needs besides the config.
#[derive(Default)]
pub struct BuildOptions {
    /// Also serve the mock v2 backend (the demo), on the listener given for it.
    pub mock_backend: bool,
    /// The process's logs ([`crate::app::logging`]): the access log writes into them, and they
    /// are flushed when the gateway stops. `None`: no access log.
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

/// Builds a gateway serving `store`'s config, exporting metrics into `registry`.
pub fn build(
    mut store: ConfigStore,
    registry: &prometheus::Registry,
    options: BuildOptions,
) -> Result<Gateway, ServerError> {
    let snapshot = store.current().load_full();
    let startup = &snapshot.startup;

    let mut telemetry = Telemetry::register(registry)?;
    if let Some(logs) = &options.logs {
        telemetry =
            telemetry.logging_to(logs.sink.clone(), logs.format == LogFormat::Json, registry)?;
    }
    let telemetry = Arc::new(telemetry);
    let in_flight = telemetry.in_flight.clone();
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
    let health = Arc::new(UpstreamHealth::default());
    let pool = Arc::new(UpstreamPool::new(startup.upstream_keepalive_pool_size));
    // The backend's addresses: its names looked up before the first request, and the set
    // following every reload.
    let backends = Arc::new(Backends::new(telemetry.backends.clone()));
    resolve_at_start(&backends, &snapshot.upstream, &snapshot.bases.upstream)
        .map_err(ServerError::Unresolved)?;
    let following = backends.clone();
    store.on_apply(move |snap| following.follow(&snap.upstream, &snap.bases.upstream));
    let gauges = (backends.clone(), pool.clone(), health.clone());
    AddressGauges::register(
        registry,
        Box::new(move || address_views(&gauges.0, &gauges.1, &gauges.2)),
    )?;
    // The listener's certificate, following reloads.
    let tls = match (startup.proxy_tls, &snapshot.server_cert) {
        (true, Some(cert)) => {
            let served = Arc::new(ServedCert::new(cert));
            let following = served.clone();
            store.on_apply(move |snap| following.follow(snap.server_cert.as_ref()));
            // The files are the resolver's now: the settings' own are never read.
            let mut tls = TlsSettings::intermediate(&cert.cert_file, &cert.key_file)?;
            tls.set_cert_resolver(served);
            if startup.http2 {
                // Offers h2 then http/1.1: a client that speaks both gets HTTP/2.
                tls.enable_h2();
            }
            Some(Arc::new(tls.build()))
        }
        _ => None,
    };
    let store = Arc::new(store);
    let config = store.current().clone();

    // Makes new backend connections (connect timeout, TLS); reuse is the pool's.
    let connector: Arc<dyn Connect> = Arc::new(BackendConnector::default());
    let upstream = Upstream::new(
        connector.clone(),
        pool.clone(),
        health.clone(),
        backends.clone(),
    );
    let drain = Drain::default();
    let proxy = Arc::new(ProxyApp::new(
        config.clone(),
        telemetry.clone(),
        tracer.clone(),
        upstream,
        rate_limits,
        drain.clone(),
    ));

    let mut background: Vec<Arc<dyn BackgroundService + Send + Sync>> = vec![
        Arc::new(PoolSweeper {
            pool,
            backends: backends.clone(),
            config: config.clone(),
        }),
        Arc::new(HealthChecker {
            config: config.clone(),
            health: health.clone(),
            connector,
            backends: backends.clone(),
        }),
        Arc::new(NameFollower { backends }),
    ];
    if startup.watch_config {
        background.push(Arc::new(ConfigWatcher {
            store: store.clone(),
        }));
    }
    let admin = startup.admin_listen.map(|_| {
        Arc::new(HttpServer::new_app(AdminApp {
            registry: registry.clone(),
            health,
            store: store.clone(),
            telemetry,
            drain: drain.clone(),
        }))
    });
    let mock_backend = options.mock_backend.then(|| {
        Arc::new(HttpServer::new_app(MockBackend::new(
            snapshot.bases.upstream.clone(),
        )))
    });
    Ok(Gateway {
        proxy,
        tls,
        admin,
        mock_backend,
        background,
        in_flight: in_flight.clone(),
        drain: drain.clone(),
        grace: Duration::from_secs(startup.grace_period_seconds),
        before_exit: Arc::new(BeforeExit {
            tracer,
            logs: options.logs.map(|logs| logs.sink),
        }),
        store,
    })
}

/// Runs `gateway` on `listeners` until a signal ends the process, inside pingora's server:
/// its runtimes (`server.threads`, `server.work_stealing`), the gateway's signal handling,
/// and on SIGQUIT the handover of the listeners to a process started with `--upgrade`.
pub fn run(gateway: Gateway, listeners: Listeners) -> ! {
    let snapshot = gateway.store.current().load_full();
    // The listeners are already open (bound, or taken over by `Listeners::inherit`): pingora
    // has no sockets of its own to receive.
    let opt = Opt {
        upgrade: false,
        daemon: false,
        nocapture: false,
        test: false,
        conf: None,
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), server_conf(&snapshot));
    server.bootstrap();
    let signals = Signals {
        store: gateway.store.clone(),
        drain: gateway.drain.clone(),
    };
    let before_exit = gateway.before_exit.clone();
    server.add_service(GatewayService {
        name: "agent-gateway".into(),
        serving: Some((gateway, listeners)),
    });
    server.run(RunArgs {
        shutdown_signal: Box::new(signals),
    });
    // A fast shutdown (SIGINT) ends the runtimes without a drain.
    before_exit.flush();
    std::process::exit(0)
}

/// The gateway as pingora's one service.
struct GatewayService {
    name: String,
    serving: Option<(Gateway, Listeners)>,
}

#[async_trait]
impl Service for GatewayService {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let (gateway, listeners) = self.serving.take().expect("the service starts once");
        if let Some(fds) = fds {
            if let Err(e) = listeners.register_for_upgrade(&mut fds.lock()) {
                tracing::error!(error = %e, "the listeners cannot be handed over on SIGQUIT");
            }
        }
        let mut shutdown = shutdown;
        serve(listeners, gateway, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
        // Drained (or out of grace), and what was queued is sent: nothing is left to wait for.
        std::process::exit(0);
    }

    fn name(&self) -> &str {
        &self.name
    }
}
