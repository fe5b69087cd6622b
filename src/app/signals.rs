//! Process signals: SIGHUP reloads the config; SIGTERM drains; SIGQUIT hands the listening
//! sockets to a new process started with `--upgrade` (only when a socket of this process's
//! user waits at `server.upgrade_sock`: else it is logged and the process goes on serving);
//! SIGINT exits at once.
//!
//! pingora's own watcher knows no SIGHUP (whose default action would kill the process). This
//! one reloads on SIGHUP and otherwise tells pingora which shutdown to make; the drain itself
//! (stop accepting, wait for the requests in flight, at most `grace_period_seconds`, then
//! write out what is queued) is [`crate::app::serve::serve`]'s, and the
//! process exits as soon as it is done.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use nix::sys::signal::{SigHandler, Signal};
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};

use crate::app::listeners::may_hand_over_to;
use crate::app::reload::{ConfigStore, Trigger};
use crate::proxy::Drain;

/// Ignores SIGHUP until [`Signals`] handles it: its default action ends the process, and a
/// reload asked for while the gateway starts (binding, looking its backend's names up,
/// waiting for a handover's listeners) must not. What such a reload was for is read anyway
/// by the config watcher's first look, unless `server.watch_config = false`.
pub fn ignore_sighup_until_handled() {
    // SAFETY: SIG_IGN runs no code when the signal comes; tokio's handler, installed in
    // `Signals::recv`, replaces it.
    #[allow(unsafe_code)]
    let ignored = unsafe { nix::sys::signal::signal(Signal::SIGHUP, SigHandler::SigIgn) };
    if let Err(e) = ignored {
        tracing::warn!(error = %e, "cannot ignore SIGHUP while starting");
    }
}

/// What the process does on each signal.
pub struct Signals {
    pub store: Arc<ConfigStore>,
    /// Started at once on SIGQUIT, while the listeners are still handed over.
    pub drain: Drain,
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
                    let sock = self.store.current().load().startup.upgrade_sock.clone();
                    if let Err(reason) = may_hand_over_to(Path::new(&sock)) {
                        tracing::error!(upgrade_sock = %sock, %reason, "SIGQUIT: the listeners are not handed over; still serving");
                        continue;
                    }
                    tracing::info!("SIGQUIT: handing the listeners to the upgraded process");
                    self.drain.hand_over();
                    return ShutdownSignal::GracefulUpgrade;
                }
                _ = term.recv() => {
                    tracing::info!("SIGTERM: draining in-flight requests");
                    return ShutdownSignal::GracefulTerminate;
                }
                _ = int.recv() => return ShutdownSignal::FastShutdown,
            }
        }
    }
}
