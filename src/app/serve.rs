//! The gateway as one future: [`serve`] runs an assembled [`Gateway`] on the [`Listeners`] it
//! is given (accepting, the background tasks beside), and on shutdown stops accepting and
//! drains. The binary runs it inside
//! pingora's server ([`crate::app::server`]); tests run it in-process on port-0 listeners.

use std::future::Future;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use pingora::apps::ServerApp;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use pingora::apps::http_app::HttpServer;
use pingora::services::background::BackgroundService;

use crate::app::admin::AdminApp;
use crate::app::head_deadline::HeadDeadline;
use crate::app::listeners::Listeners;
use crate::app::proxy_protocol;
use crate::app::reload::ConfigStore;
use crate::config::Snapshot;
use crate::observe::in_flight::InFlight;
use crate::observe::log_sink::LineSink;
use crate::observe::trace::Tracer;
use crate::proxy::tcp::TcpConn;
use crate::proxy::Drain;
use crate::proxy::ProxyApp;
use crate::tools::mock_backend::MockBackend;

/// How long a stopping gateway waits for its queued spans to be sent.
pub const SPAN_FLUSH: Duration = Duration::from_secs(2);
/// How long a stopping gateway waits for its queued log lines to be written.
pub const LOG_FLUSH: Duration = Duration::from_secs(2);

/// What a stopping gateway sends out before it goes, whichever way it stops.
pub struct BeforeExit {
    pub tracer: Arc<Tracer>,
    /// `None` in tests, which install no logs of their own.
    pub logs: Option<Arc<LineSink>>,
}

impl BeforeExit {
    /// Sends the queued spans, then writes the queued log lines (the last ones included).
    pub fn flush(&self) {
        self.tracer.shutdown(SPAN_FLUSH);
        if let Some(logs) = &self.logs {
            logs.flush(LOG_FLUSH);
        }
    }
}

/// How often a draining gateway looks whether its last request has ended.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// The assembled gateway ([`crate::app::server::build`]), ready to [`serve`]: the services for each listener, the tasks
/// that run beside them, and what a stopping gateway waits for and sends out.
pub struct Gateway {
    pub(crate) proxy: Arc<ProxyApp>,
    /// The proxy listener's TLS, when `listen.tls_cert` is set.
    pub(crate) tls: Option<Arc<Acceptor>>,
    pub(crate) admin: Option<Arc<HttpServer<AdminApp>>>,
    pub(crate) mock_backend: Option<Arc<HttpServer<MockBackend>>>,
    /// The pool sweeper, the health checks and the config watcher.
    pub(crate) background: Vec<Arc<dyn BackgroundService + Send + Sync>>,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) drain: Drain,
    /// `server.grace_period_seconds`: the longest a stopping gateway waits for its requests.
    pub(crate) grace: Duration,
    pub(crate) before_exit: Arc<BeforeExit>,
    pub(crate) store: Arc<ConfigStore>,
}

/// Serves `gateway` on `listeners` until `shutdown` resolves, then drains: stops accepting
/// clients, tells client connections to wind down (HTTP/2 GOAWAY, HTTP/1.1 `Connection:
/// close`), waits for the requests in flight and the first request of each HTTP/1.1
/// connection it accepted (at most `server.grace_period_seconds`) and
/// sends out the spans and log lines still queued. The admin listener serves until the drain
/// is over: a probe reads `/readyz` 503 (draining), a scrape sees the last requests end;
/// after a handover it stops with the proxy listener, whose sockets another process serves.
/// Must run inside a tokio runtime.
pub async fn serve(listeners: Listeners, gateway: Gateway, shutdown: impl Future<Output = ()>) {
    match listeners.local_addrs() {
        Ok(at) => tracing::info!(
            proxy = %at.proxy,
            admin = at.admin.map(tracing::field::display),
            mock_backend = at.mock_backend.map(tracing::field::display),
            "listening"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot tell where the listeners are"),
    }
    let (stop, stopped) = watch::channel(false);
    let (stop_admin, admin_stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let Gateway {
        proxy,
        tls,
        admin,
        mock_backend,
        background,
        in_flight,
        drain,
        grace,
        before_exit,
        store,
    } = gateway;

    // Connections accepted whose first request has not begun: a connection the gateway took
    // from the listener's queue is its own to answer, not the next process's.
    let unanswered = Arc::new(InFlight::default());
    let accepting = tokio::spawn(accept_proxy(
        listener_of(listeners.proxy),
        proxy,
        tls,
        store.current().clone(),
        unanswered.clone(),
        stopped.clone(),
    ));
    if let Some((l, app)) = paired("admin", listeners.admin, admin) {
        let config = store.current().clone();
        tasks.spawn(accept_admin(listener_of(l), app, config, admin_stopped));
    }
    if let Some((l, app)) = paired("mock backend", listeners.mock_backend, mock_backend) {
        tasks.spawn(accept_app(listener_of(l), app, stopped.clone()));
    }
    for task in background {
        let stopped = stopped.clone();
        tasks.spawn(async move { task.start(stopped).await });
    }

    shutdown.await;
    tracing::info!(
        grace_seconds = grace.as_secs(),
        "stopping: no new connections, draining the requests in flight"
    );
    drain.start();
    stop.send_replace(true);
    if drain.is_handover() {
        // The admin listener is the new process's too: a probe or a scrape that reached this
        // one now would read a process on its way out (its counters, soon gone).
        stop_admin.send_replace(true);
    }
    let deadline = Instant::now() + grace;
    // Once the accept loop has stopped, every connection it took is counted.
    let _ = accepting.await;
    // A connection accepted just before the stop may hold its request unread yet (its task
    // not run, or the request still arriving): it is served too, its head within
    // `limits.client_header_timeout_ms` as always.
    while in_flight.count() + unanswered.count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    tracing::info!(
        in_flight = in_flight.count(),
        unanswered_connections = unanswered.count(),
        "drained"
    );
    stop_admin.send_replace(true);
    // The accept loops and background tasks have seen the stop; idle connections end with
    // the runtime (or the process).
    drop(tasks);
    let flushed = tokio::task::spawn_blocking(move || before_exit.flush()).await;
    if let Err(e) = flushed {
        tracing::error!(error = %e, "flushing spans and logs failed");
    }
}

/// A listener and the service to serve on it; a listener without its service, or a service
/// without its listener, is a mistake of the caller's, logged and not served.
fn paired<A>(
    name: &str,
    listener: Option<StdListener>,
    app: Option<A>,
) -> Option<(StdListener, A)> {
    match (listener, app) {
        (Some(l), Some(app)) => Some((l, app)),
        (None, None) => None,
        (l, _) => {
            tracing::error!(
                name,
                listener = l.is_some(),
                "a listener and its service must go together: not served"
            );
            None
        }
    }
}

/// A listener of the runtime this runs on.
fn listener_of(l: StdListener) -> TcpListener {
    TcpListener::from_std(l).expect("a listener registers with the runtime")
}

/// Accepts client connections until the gateway stops, each served in a task of its own:
/// its PROXY protocol header read first when `listen.proxy_protocol` (in the snapshot of
/// `config` when it connects), then TLS, then HTTP. Each is counted in `unanswered` from its
/// accept until its first request is over (or it ends without one).
async fn accept_proxy(
    listener: TcpListener,
    app: Arc<ProxyApp>,
    tls: Option<Arc<Acceptor>>,
    config: Arc<ArcSwap<Snapshot>>,
    unanswered: Arc<InFlight>,
    stopped: ShutdownWatch,
) {
    accept_until_stopped(&listener, stopped.clone(), |stream, peer| {
        let (app, tls, stopped) = (app.clone(), tls.clone(), stopped.clone());
        let first_request = unanswered.hold();
        let snap = config.load_full();
        // The stream is boxed now, as it will be served: what the task holds from the accept
        // stays small for the connection's whole life, and so do the PROXY header's read and
        // the TLS handshake, boxed while they run.
        let mut stream = Box::new(stream);
        async move {
            let mut client = Some(peer.ip());
            if snap.edge.proxy_protocol {
                let timeout = snap.limits.client_header_timeout;
                match Box::pin(proxy_protocol::accept(&mut stream, peer, &snap.edge, timeout)).await {
                    Ok(source) => client = source,
                    Err(e) => {
                        tracing::debug!(peer = %peer, error = %e, "connection closed at its PROXY protocol header");
                        return;
                    }
                }
            }
            // The handshake is bounded as a request head is: a client that sends its
            // ClientHello a byte now and then (or nothing) holds its connection no longer
            // than a slowloris on a plain listener.
            let handshake_timeout = snap.limits.client_header_timeout;
            drop(snap);
            // An IPv4 client on a dual-stack (`[::]`) listener, or named so by a PROXY header,
            // arrives as `::ffff:a.b.c.d`: every later layer (the log, the throttle, the
            // forwarded `X-Forwarded-For`) sees its IPv4 address.
            let client = client.map(|ip| ip.to_canonical());
            let stream = match tls {
                Some(tls) => match handshake(&tls, *stream, peer, handshake_timeout).await {
                    Some(stream) => stream,
                    None => return,
                },
                None => stream as Stream,
            };
            app.serve_connection(stream, client, Some(first_request), &stopped)
                .await;
        }
    })
    .await;
}

/// The TLS handshake of a client connection from `peer`, within `timeout`
/// (`limits.client_header_timeout`); `None` (logged) when it fails or stalls.
async fn handshake(
    tls: &Acceptor,
    stream: TcpConn,
    peer: SocketAddr,
    timeout: Duration,
) -> Option<Stream> {
    // Boxed: the handshake's state would otherwise size the connection's task for its whole
    // life, long after the handshake is over.
    match tokio::time::timeout(timeout, Box::pin(tls.tls_handshake(stream))).await {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(e)) => {
            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(peer = %peer, "TLS handshake timed out");
            None
        }
    }
}

/// Serves a pingora app alone on `listener` until `shutdown` resolves: the mock backend's
/// command, and tests' backends.
pub async fn serve_app<A>(listener: StdListener, app: Arc<A>, shutdown: impl Future<Output = ()>)
where
    A: ServerApp + Send + Sync + 'static,
{
    match listener.local_addr() {
        Ok(at) => tracing::info!(address = %at, "listening"),
        Err(e) => tracing::warn!(error = %e, "cannot tell where the listener is"),
    }
    let (stop, stopped) = watch::channel(false);
    let accepting = tokio::spawn(accept_app(listener_of(listener), app, stopped));
    shutdown.await;
    stop.send_replace(true);
    let _ = accepting.await;
}

/// Accepts connections for a pingora app (the mock backend, tests' backends), serving each
/// kept-alive connection's requests one after another.
async fn accept_app<A>(listener: TcpListener, app: Arc<A>, stopped: ShutdownWatch)
where
    A: ServerApp + Send + Sync + 'static,
{
    accept_app_with(listener, app, stopped, |stream| Box::new(stream)).await;
}

/// Accepts the admin listener's connections: as [`accept_app`], each request head within
/// `limits.client_header_timeout` (of the snapshot current at the accept), since the admin
/// listener answers its probes to anyone who reaches it ([`HeadDeadline`]).
async fn accept_admin<A>(
    listener: TcpListener,
    app: Arc<A>,
    config: Arc<ArcSwap<Snapshot>>,
    stopped: ShutdownWatch,
) where
    A: ServerApp + Send + Sync + 'static,
{
    accept_app_with(listener, app, stopped, move |stream| {
        let timeout = config.load().limits.client_header_timeout;
        Box::new(HeadDeadline::new(stream, timeout))
    })
    .await;
}

/// Accepts connections for `app`, each stream made by `wrap` of the accepted connection.
async fn accept_app_with<A>(
    listener: TcpListener,
    app: Arc<A>,
    stopped: ShutdownWatch,
    wrap: impl Fn(TcpConn) -> Stream,
) where
    A: ServerApp + Send + Sync + 'static,
{
    accept_until_stopped(&listener, stopped.clone(), |stream, _peer| {
        let (app, stopped) = (app.clone(), stopped.clone());
        let stream = wrap(stream);
        async move {
            let mut next = app.process_new(stream, &stopped).await;
            while let Some(stream) = next {
                next = app.process_new(stream, &stopped).await;
            }
        }
    })
    .await;
}

/// The accept loop: each connection's future `serve` makes (of the stream and its peer) runs
/// in a task of its own, on one of the runtime's threads (pingora's runtimes spread them over
/// their threads).
async fn accept_until_stopped<F, Fut>(listener: &TcpListener, mut stopped: ShutdownWatch, serve: F)
where
    F: Fn(TcpConn, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            // A stopped loop takes no more: what is still queued is the next process's (a
            // handover) or refused with the listener.
            biased;
            _ = stopped.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                }
                pingora_runtime::current_handle().spawn(serve(TcpConn::new(tcp), peer));
            }
            Err(e) => {
                tracing::error!(error = %e, "accept failed");
                // Out of file descriptors: accept fails at once until some are released.
                if e.raw_os_error() == Some(nix::libc::EMFILE) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
