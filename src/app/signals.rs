//! Process signals: SIGHUP reloads the config; SIGTERM drains; SIGQUIT hands the listening
//! sockets to a new process started with `--upgrade`; SIGINT exits at once.
//!
//! pingora's own watcher knows no SIGHUP (whose default action would kill the process), and on
//! SIGTERM it always sleeps the whole grace period. This watcher reloads on SIGHUP, and after
//! SIGTERM exits as soon as no request is in flight, at most `grace_period_seconds` later,
//! once the spans and log lines still queued are written ([`BeforeExit`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};

use crate::app::reload::{ConfigStore, Trigger};
use crate::observe::in_flight::InFlight;
use crate::observe::log_sink::LineSink;
use crate::observe::trace::Tracer;
use crate::proxy::Drain;

/// Time for the listeners to close after SIGTERM before in-flight requests are counted.
const LISTENER_CLOSE: Duration = Duration::from_millis(200);

/// How long an exiting process waits for its queued spans to be sent.
pub const SPAN_FLUSH: Duration = Duration::from_secs(2);
/// How long an exiting process waits for its queued log lines to be written.
pub const LOG_FLUSH: Duration = Duration::from_secs(2);

/// What an exiting process sends out before it goes, whichever way it exits.
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

pub struct Signals {
    pub store: Arc<ConfigStore>,
    pub in_flight: Arc<InFlight>,
    pub drain: Drain,
    pub before_exit: Arc<BeforeExit>,
    pub grace: Duration,
}

impl Signals {
    /// Exits the process once nothing is in flight; pingora's grace sleep is the upper bound.
    fn exit_when_drained(&self) {
        let (in_flight, before_exit) = (self.in_flight.clone(), self.before_exit.clone());
        let deadline = Instant::now() + self.grace;
        std::thread::spawn(move || {
            std::thread::sleep(LISTENER_CLOSE);
            while Instant::now() < deadline {
                if in_flight.count() == 0 {
                    tracing::info!("drained: no request in flight, exiting");
                    before_exit.flush();
                    std::process::exit(0);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let mut hup = signal(SignalKind::hangup()).expect("installing the SIGHUP handler");
        let mut quit = signal(SignalKind::quit()).expect("installing the SIGQUIT handler");
        let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    let store = self.store.clone();
                    let _ = tokio::task::spawn_blocking(move || store.reload(Trigger::Sighup, false)).await;
                }
                _ = quit.recv() => {
                    tracing::info!("SIGQUIT: handing the listeners to the upgraded process");
                    self.drain.start();
                    return ShutdownSignal::GracefulUpgrade;
                }
                _ = term.recv() => {
                    tracing::info!(grace_seconds = self.grace.as_secs(), "SIGTERM: draining in-flight requests");
                    self.drain.start();
                    self.exit_when_drained();
                    return ShutdownSignal::GracefulTerminate;
                }
                _ = int.recv() => return ShutdownSignal::FastShutdown,
            }
        }
    }
}
