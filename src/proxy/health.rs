//! Active health checks of the upstream addresses, and readiness derived from them.
//!
//! [`HealthChecker`] probes every address of the current snapshot each
//! `upstream.health_check_interval_ms`: a connect (TCP, and TLS when `upstream.tls`), then,
//! when `upstream.health_check_path` is set, a `GET` of it answered 2xx or 3xx, over the
//! same connector and HTTP/1.1 client the proxy uses. The checks of a round run at once
//! (at most [`MAX_CHECKS_AT_ONCE`]), and each verdict counts as it comes: an address whose
//! check hangs until its limit delays only its own next check, as each server's or host's
//! own schedule does in HAProxy and Envoy. An address that fails leaves the
//! rotation until it passes again; an address ejected by failures since the check began
//! comes back when it passes. The addresses checked are the set of the moment
//! ([`Backends`]), as DNS moves it. Requests and `/readyz` only read the last result: a
//! probe of `/readyz` never causes a check.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, Peer};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use super::backends::{Address, Backends};
use super::connect::Connect;
use crate::config::Snapshot;
use crate::http1::client;

/// The last result of the health checks.
#[derive(Default)]
pub struct UpstreamHealth {
    probed: AtomicBool,
    /// Addresses that failed their last check (usually empty).
    down: ArcSwap<Vec<SocketAddr>>,
    any_up: AtomicBool,
}

impl UpstreamHealth {
    /// Whether `addr` passed its last check (or has not been checked yet).
    pub fn is_up(&self, addr: &SocketAddr) -> bool {
        !self.down.load().contains(addr)
    }

    /// `Ok` when an address passed its last check, else the reason.
    pub fn reachable(&self) -> Result<(), &'static str> {
        if !self.probed.load(Ordering::Acquire) {
            return Err("upstream addresses not checked yet");
        }
        if !self.any_up.load(Ordering::Acquire) {
            return Err("no upstream address is reachable");
        }
        Ok(())
    }

    /// Notes the addresses of the set `down` at their last check, whether any passed its
    /// last, and whether every address of the set has been checked. While none passed and
    /// some are still to be checked (at start, or after DNS or a reload brought new ones),
    /// the last verdict on reachability stands.
    fn store(&self, down: Vec<SocketAddr>, any_up: bool, all_checked: bool) {
        self.down.store(Arc::new(down));
        if any_up || all_checked {
            self.any_up.store(any_up, Ordering::Release);
            self.probed.store(true, Ordering::Release);
        }
    }
}

/// The most of a health-check answer that is read.
const MAX_CHECK_ANSWER: usize = 64 * 1024;

/// Whether `peer` answers: a connect, or a GET of `path` with a 2xx/3xx status.
async fn check(
    connector: &dyn Connect,
    peer: &HttpPeer,
    path: Option<&str>,
    connect_limit: Duration,
    limit: Duration,
) -> bool {
    let attempt = async {
        let mut stream = connector.connect(peer, connect_limit).await.ok()?;
        let Some(path) = path else { return Some(true) };
        let host = peer.sni().to_owned();
        let host = if host.is_empty() {
            peer.address().to_string()
        } else {
            host
        };
        let answer = client::get(&mut stream, &host, path, MAX_CHECK_ANSWER)
            .await
            .ok()?;
        Some((200..400).contains(&answer.status()))
    };
    matches!(tokio::time::timeout(limit, attempt).await, Ok(Some(true)))
}

/// Checks running at once, at most: a round with more addresses due starts the rest as
/// these end.
const MAX_CHECKS_AT_ONCE: usize = 32;

/// A check that ended: of which address, when it started, whether it passed, and whether
/// it was of an answer (`upstream.health_check_path`) or a connect.
struct Checked {
    address: Arc<Address>,
    started: Instant,
    ok: bool,
    of_answer: bool,
}

/// What the checker keeps between rounds.
#[derive(Default)]
struct Rounds {
    /// Addresses due or being checked: one whose check still runs when a round comes is not
    /// checked twice at once.
    busy: HashSet<SocketAddr>,
    /// Those due and not started yet (more than [`MAX_CHECKS_AT_ONCE`] were), oldest first;
    /// held weakly, as the set they came from may drop them meanwhile.
    due: VecDeque<(SocketAddr, Weak<Address>)>,
    running: JoinSet<Checked>,
    /// The address of each check running, to know it by should its task fail.
    running_ids: HashMap<tokio::task::Id, SocketAddr>,
    /// The last verdict of each address of the set checked so far.
    verdicts: HashMap<SocketAddr, bool>,
}

/// Background task that keeps [`UpstreamHealth`] current.
pub struct HealthChecker {
    pub config: Arc<ArcSwap<Snapshot>>,
    pub health: Arc<UpstreamHealth>,
    pub connector: Arc<dyn Connect>,
    pub backends: Arc<Backends>,
}

impl HealthChecker {
    /// Begins a round: every address of the set of the moment not being checked is due, and
    /// checks start up to [`MAX_CHECKS_AT_ONCE`]; the interval to the next round.
    fn round(&self, rounds: &mut Rounds) -> Duration {
        for address in &self.backends.current().addresses {
            if rounds.busy.insert(address.addr) {
                rounds
                    .due
                    .push_back((address.addr, Arc::downgrade(address)));
            }
        }
        self.start_due(rounds);
        // The set may have changed since the last: the verdicts follow it.
        self.publish(rounds);
        self.config.load().upstream.health_check_interval
    }

    /// Starts the checks that are due, up to [`MAX_CHECKS_AT_ONCE`] running.
    fn start_due(&self, rounds: &mut Rounds) {
        let snap = self.config.load_full();
        let up = &snap.upstream;
        let limit = up.connect_timeout + up.read_timeout.min(Duration::from_secs(2));
        while rounds.running.len() < MAX_CHECKS_AT_ONCE {
            let Some((addr, address)) = rounds.due.pop_front() else {
                return;
            };
            // Each address is held strongly only while it is checked: one that leaves the set
            // meanwhile does not count as connected for longer (`backends::Retired`), and one
            // that has left is not checked.
            let Some(address) = address.upgrade().filter(|a| !a.is_retired()) else {
                rounds.busy.remove(&addr);
                continue;
            };
            let connector = self.connector.clone();
            let path = up.health_check_path.clone();
            let connect_limit = up.connect_timeout;
            let task = rounds.running.spawn(async move {
                let started = Instant::now();
                let ok = check(
                    &*connector,
                    &address.peer,
                    path.as_deref(),
                    connect_limit,
                    limit,
                )
                .await;
                Checked {
                    address,
                    started,
                    ok,
                    of_answer: path.is_some(),
                }
            });
            rounds.running_ids.insert(task.id(), addr);
        }
    }

    /// Takes in the verdict of a check that ended, and starts one that was due in its place.
    fn ended(&self, rounds: &mut Rounds, ended: Result<(tokio::task::Id, Checked), JoinError>) {
        let id = match &ended {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        if let Some(addr) = rounds.running_ids.remove(&id) {
            rounds.busy.remove(&addr);
        }
        match ended {
            Ok((_, checked)) => self.take_verdict(rounds, checked),
            Err(e) => tracing::error!(error = %e, "an upstream health check failed to run"),
        }
        self.start_due(rounds);
    }

    fn take_verdict(&self, rounds: &mut Rounds, checked: Checked) {
        let Checked {
            address,
            started,
            ok,
            of_answer,
        } = checked;
        // Left the set meanwhile (or reached another way now): the verdict is of no address of
        // the rotation.
        if address.is_retired() {
            return;
        }
        let addr = &address.addr;
        // Only a check of an answer (`health_check_path`) ends an ejection: an address that
        // accepts connections and resets every request passes one that connects.
        if ok && of_answer && address.check_passed(started) {
            tracing::info!(%addr, "upstream address passed its check; its ejection ends early");
        }
        let was_up = rounds.verdicts.insert(*addr, ok).unwrap_or(true);
        if ok != was_up {
            if ok {
                tracing::info!(%addr, "upstream address is back in rotation");
            } else {
                tracing::warn!(%addr, "upstream address failed its health check; out of rotation");
            }
        }
        self.publish(rounds);
    }

    /// Stores the verdicts of the addresses of the set of the moment; those of addresses
    /// that left it are forgotten.
    fn publish(&self, rounds: &mut Rounds) {
        let set: HashSet<SocketAddr> = self
            .backends
            .current()
            .addresses
            .iter()
            .map(|a| a.addr)
            .collect();
        rounds.verdicts.retain(|addr, _| set.contains(addr));
        let down = rounds
            .verdicts
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(addr, _)| *addr)
            .collect();
        let any_up = rounds.verdicts.values().any(|ok| *ok);
        let all_checked = rounds.verdicts.len() == set.len();
        self.health.store(down, any_up, all_checked);
    }
}

/// Each round checks the addresses at once, each on its own connection, so that one whose
/// check hangs until its limit delays no other; it is checked again at the first round after
/// its check has ended.
#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut rounds = Rounds::default();
        let mut next_round = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep_until(next_round) => {
                    next_round = Instant::now() + self.round(&mut rounds);
                }
                Some(ended) = rounds.running.join_next_with_id() => {
                    self.ended(&mut rounds, ended);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;
    use crate::observe::telemetry::Telemetry;
    use crate::proxy::connect::ConnectFuture;
    use pingora::protocols::Stream;
    use pingora::{Error, ErrorType};

    /// Connects to `hanging` never (its check runs until its limit), to the others while
    /// `up` says so.
    struct Connector {
        hanging: SocketAddr,
        up: AtomicBool,
    }

    impl Connect for Connector {
        fn connect<'a>(&'a self, peer: &'a HttpPeer, _limit: Duration) -> ConnectFuture<'a> {
            let hangs = peer.address().as_inet() == Some(&self.hanging);
            let up = self.up.load(Ordering::SeqCst);
            Box::pin(async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                if !up {
                    return Err(Error::new(ErrorType::ConnectRefused));
                }
                let (gateway_end, _backend_end) = tokio::io::duplex(64);
                Ok(Box::new(gateway_end) as Stream)
            })
        }
    }

    /// While no address passed and some are still to be checked, the last verdict on
    /// reachability stands: at start, "not checked yet"; after DNS or a reload brought new
    /// addresses, the old set's.
    #[test]
    fn reachability_stands_until_an_address_passes_or_all_are_checked() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        let health = UpstreamHealth::default();
        health.store(vec![a], false, false);
        assert!(!health.is_up(&a) && health.is_up(&b));
        assert_eq!(
            health.reachable(),
            Err("upstream addresses not checked yet")
        );
        health.store(vec![a], true, true);
        assert_eq!(health.reachable(), Ok(()));
        health.store(vec![], false, false);
        assert_eq!(health.reachable(), Ok(()), "a new set, not checked yet");
        health.store(vec![a, b], false, true);
        assert_eq!(health.reachable(), Err("no upstream address is reachable"));
    }

    /// A check that hangs until its limit (3 s here) delays the checks of no other address:
    /// one that comes back is in rotation at the next round, 100 ms on.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_check_that_hangs_delays_no_other_address() {
        let hanging: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let returning: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[hanging, returning]);
        cfg.upstream.health_check_interval_ms = 100;
        let snapshot = cfg.snapshot();
        let telemetry = Telemetry::register(&prometheus::Registry::new()).unwrap();
        let backends = Arc::new(Backends::new(telemetry.backends.clone()));
        backends.follow(&snapshot.upstream, &snapshot.bases.upstream);
        let connector = Arc::new(Connector {
            hanging,
            up: AtomicBool::new(false),
        });
        let health = Arc::new(UpstreamHealth::default());
        let checker = HealthChecker {
            config: Arc::new(ArcSwap::from_pointee(snapshot)),
            health: health.clone(),
            connector: connector.clone(),
            backends,
        };
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(async move { checker.start(shutdown).await });

        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!health.is_up(&returning), "down at its first check");
        assert_eq!(
            health.reachable(),
            Err("upstream addresses not checked yet")
        );
        connector.up.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(health.is_up(&returning), "back at the next round");
        assert_eq!(health.reachable(), Ok(()));
        // The hanging address's check ends at its limit, once.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!health.is_up(&hanging));
        assert!(health.is_up(&returning));
    }
}
