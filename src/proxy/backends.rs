//! The backend's addresses as the proxy follows them: the set a request picks from, rebuilt
//! when a reload changes `upstream.addresses` or DNS answers a name differently
//! ([`crate::policy::backend::rotation`]), each address with its connection budget, its
//! waiting requests and its ejection state.
//!
//! An address that stays in the set keeps its state (connections, budget, failures); one that
//! leaves is retired: its idle connections are closed by the pool's sweeper at once, its busy ones
//! when their request is done, and none is handed to a new request. One that comes back while
//! connections to it are still open (a name whose answers rotate) takes up its state again, so
//! that those connections still count against its budget. A reload that lowers the budget
//! closes the connections past it the same way: idle ones at once, busy ones when their
//! request is done.
//!
//! A set also carries the base its addresses serve v2 under (`upstream.base_path` of the
//! config it was followed from): a request is sent under the base of the set it is sent to,
//! not of its own snapshot, so that a reload moving the backend and its base at once never
//! sends the new addresses the old base ([`crate::api::route::rebased`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora::upstreams::peer::{HttpPeer, Peer};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::api::failure::OverflowReason;
use crate::config::{BasePath, BudgetConfig, UpstreamConfig};
use crate::observe::backend::BackendMetrics;
use crate::policy::backend::budget::{self, Admission, Queue};
use crate::policy::backend::dns::NameRecord;
use crate::policy::backend::outlier::Outlier;
use crate::policy::backend::rotation;

/// The backend as a request is sent to it: the addresses of the rotation, in its order, and
/// the base they serve v2 under, taken from one config (and the DNS answers of the moment)
/// and swapped in together.
#[derive(Default)]
pub struct AddressSet {
    pub addresses: Vec<Arc<Address>>,
    /// `upstream.base_path` of the config followed; `None` before the first.
    pub base: Option<BasePath>,
    /// The connection budget of the config followed; `None` before the first. A request
    /// waiting for a connection follows the budget of the set of the moment, not of its own
    /// snapshot: the budget is the backend's, shared by every request.
    pub budget: Option<BudgetConfig>,
}

/// One address of the rotation and its state.
pub struct Address {
    pub addr: SocketAddr,
    /// How it is reached (TLS, SNI, timeouts).
    pub peer: HttpPeer,
    /// The pool key of its connections (the peer's reuse hash).
    pub key: u64,
    /// Left the set: its connections close instead of going back to the pool.
    retired: AtomicBool,
    /// `upstream.max_connections_per_address` of the set it is in ([`UNLIMITED`]: none):
    /// connections past it (a reload lowered it) close instead of going back to the pool.
    cap: AtomicUsize,
    slots: Mutex<Slots>,
    /// The requests waiting for a connection, all addresses together.
    pending: Arc<Pending>,
    /// Failures in a row (connect, reset, protocol), reset by a success.
    failures: AtomicU32,
    /// Set while an ejection may be running, so that a request checks the clock only then.
    ejected: AtomicBool,
    outlier: Mutex<Outlier>,
}

/// Connections open to an address (idle ones included) and the requests waiting for one.
#[derive(Default)]
struct Slots {
    open: usize,
    queue: Queue<oneshot::Sender<()>>,
}

/// The requests waiting for a connection at the addresses of a backend, all together.
#[derive(Default)]
struct Pending {
    /// How many (`upstream.max_pending`).
    count: AtomicUsize,
    /// Told when a connection comes back, or a place frees, at an address nobody waits for
    /// while requests wait at others: the request that has listened longest (one with another
    /// address to look at) looks for it, as the head of HAProxy's backend queue goes to the
    /// first server with a connection free. A hint, not a hand-over: a newcomer may take that
    /// connection first, and the request then waits on, its place in its queue kept.
    room: Notify,
}

impl Pending {
    /// An address nobody waits for has a connection or a place free: tells a request waiting
    /// at another, if any does. No lock when none waits.
    fn room_freed(&self) {
        if self.count.load(Ordering::Relaxed) > 0 {
            self.room.notify_one();
        }
    }
}

/// [`Address::cap`] of no budget.
const UNLIMITED: usize = usize::MAX;

/// One open connection's place in its address's count; dropped with the connection, it
/// frees the place and wakes the oldest waiting request.
pub struct Slot {
    address: Arc<Address>,
    /// Freed already, by [`Slot::free_past_budget`].
    freed: bool,
}

impl Slot {
    pub fn address(&self) -> &Arc<Address> {
        &self.address
    }

    /// Frees the place now when its address has more connections open than its budget
    /// allows (a reload lowered it); whether it did, and its connection is then to close.
    /// Decided under the address's lock, so that connections that come back at once close
    /// only as many as are past the budget.
    pub fn free_past_budget(&mut self) -> bool {
        let cap = self.address.cap.load(Ordering::Relaxed);
        if self.freed || cap == UNLIMITED {
            return false;
        }
        let mut slots = self.address.slots();
        if budget::excess(slots.open, Some(cap)) == 0 {
            return false;
        }
        // No request waiting is woken: the address is at its budget still.
        slots.open -= 1;
        self.freed = true;
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        let mut slots = self.address.slots();
        slots.open -= 1;
        self.address.offer(slots);
    }
}

/// Wakes the oldest request still waiting; whether there was one.
fn wake_oldest(slots: &mut Slots) -> bool {
    while let Some(waiter) = slots.queue.pop() {
        if waiter.send(()).is_ok() {
            return true;
        }
    }
    false
}

/// What a request that may not reuse a connection is told by [`Address::admit`].
pub enum Admit {
    /// Open a connection: its place is taken.
    Connect(Slot),
    /// Wait for a connection to come back or close.
    Wait(Waiter),
}

/// A request's place in an address's queue; dropped (answered, timed out, or its client
/// gone), it leaves the queue.
pub struct Waiter {
    address: Arc<Address>,
    id: u64,
    woken: oneshot::Receiver<()>,
}

impl Waiter {
    /// Waits until a connection came back or closed.
    pub async fn woken(&mut self) {
        // The sender lives in the queue until it wakes this waiter; it is dropped unsent only
        // when the waiter has left, so an error cannot be seen here.
        let _ = (&mut self.woken).await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut slots = self.address.slots();
        slots.queue.remove(self.id);
        self.address.pending.count.fetch_sub(1, Ordering::Relaxed);
        // Woken but gone before it acted (its wait ran out as the wake came, its client
        // left, or it took a connection at another address): the wake is the next request's,
        // else the connection it was for would sit idle while the queue waits for another.
        if self.woken.try_recv().is_ok() {
            self.address.offer(slots);
        }
    }
}

impl Address {
    fn new(peer: HttpPeer, pending: Arc<Pending>) -> Self {
        Address {
            addr: *peer
                .address()
                .as_inet()
                .expect("an upstream address is an IP address"),
            key: peer.reuse_hash(),
            peer,
            retired: AtomicBool::new(false),
            cap: AtomicUsize::new(UNLIMITED),
            slots: Mutex::new(Slots::default()),
            pending,
            failures: AtomicU32::new(0),
            ejected: AtomicBool::new(false),
            outlier: Mutex::new(Outlier::default()),
        }
    }

    /// An address outside any set, for tests of the pool.
    #[cfg(test)]
    pub fn detached(addr: SocketAddr) -> Arc<Self> {
        Arc::new(Address::new(
            HttpPeer::new(addr, false, String::new()),
            Arc::default(),
        ))
    }

    /// Marks the address as having left its set, as a reload that removes it does.
    #[cfg(test)]
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the address is reached the same way as `peer` describes (pingora's reuse hash:
    /// the address, scheme, SNI, certificate checks and, as its `group_key`, the CA): then it
    /// keeps its state (connections counted, queue, ejection) through a rebuild.
    fn reached_as(&self, peer: &HttpPeer) -> bool {
        self.key == peer.reuse_hash()
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Connections open to it now, idle ones included.
    pub fn open(&self) -> usize {
        self.slots().open
    }

    /// Requests waiting in its queue now for a connection.
    pub fn waiting(&self) -> usize {
        self.slots().queue.len()
    }

    /// Follows the budget of the set it is in.
    pub(super) fn follow_budget(&self, max: Option<usize>) {
        self.cap.store(max.unwrap_or(UNLIMITED), Ordering::Relaxed);
    }

    /// The budget it follows, as a number to compare with a later reading: whether a reload
    /// changed it in between.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Whether no request waits for a connection: only then may an idle one be taken.
    pub fn nobody_waiting(&self) -> bool {
        budget::may_reuse(self.slots().queue.len())
    }

    /// Takes a place for a new connection under `budget`, or a place in the queue; `woken`:
    /// the request was waiting already, and goes before those behind it (to open a
    /// connection, or back at the head of the queue).
    pub fn admit(
        self: &Arc<Self>,
        budget: &BudgetConfig,
        woken: bool,
    ) -> Result<Admit, OverflowReason> {
        let mut slots = self.slots();
        let waiting = if woken { 0 } else { slots.queue.len() };
        match budget::admit(slots.open, budget.max_connections_per_address, waiting) {
            Admission::Connect => Ok(Admit::Connect(self.take_place(&mut slots))),
            Admission::Wait => {
                // A woken request had its place among the waiting: it keeps it, whoever came
                // since. Another takes one if one is free, in one step: the count is shared by
                // every address, and this lock is one address's.
                if woken {
                    self.pending.count.fetch_add(1, Ordering::Relaxed);
                } else if self
                    .pending
                    .count
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |pending| {
                        budget::may_wait(pending, budget.max_pending).then_some(pending + 1)
                    })
                    .is_err()
                {
                    return Err(OverflowReason::QueueFull);
                }
                let (tx, rx) = oneshot::channel();
                let id = if woken {
                    slots.queue.push_first(tx)
                } else {
                    slots.queue.push(tx)
                };
                Ok(Admit::Wait(Waiter {
                    address: self.clone(),
                    id,
                    woken: rx,
                }))
            }
        }
    }

    /// Takes a place for a new connection under `budget` when one is free and no request
    /// waits for the address, and never a place in its queue: for a request that looks past
    /// the address it is at for one that takes it at once.
    pub fn admit_at_once(self: &Arc<Self>, budget: &BudgetConfig) -> Option<Slot> {
        let mut slots = self.slots();
        let waiting = slots.queue.len();
        let admission = budget::admit(slots.open, budget.max_connections_per_address, waiting);
        (admission == Admission::Connect).then(|| self.take_place(&mut slots))
    }

    /// One more connection counted in `slots` (its lock held), and its place.
    fn take_place(self: &Arc<Self>, slots: &mut Slots) -> Slot {
        slots.open += 1;
        Slot {
            address: self.clone(),
            freed: false,
        }
    }

    /// A connection went back to the pool: the oldest waiting request may take it, or, with
    /// none waiting here, one waiting at another address.
    pub fn returned(&self) {
        self.offer(self.slots());
    }

    /// A connection or a place is free here (`slots`, its lock, held): the oldest request
    /// waiting here is woken, else, the lock let go, one waiting at another address is told.
    fn offer(&self, mut slots: MutexGuard<'_, Slots>) {
        if !wake_oldest(&mut slots) {
            drop(slots);
            self.pending.room_freed();
        }
    }

    /// Resolves when an address nobody waited for has a connection or a place free while
    /// requests wait ([`Pending::room`]): for a request waiting here to look for it there.
    pub async fn room_elsewhere(&self) {
        self.pending.room.notified().await;
    }

    /// The budget became `max`: wakes as many of the oldest waiting requests as it has room
    /// for now, to open their connections.
    fn budget_changed(&self, max: Option<usize>) {
        let mut slots = self.slots();
        for _ in 0..budget::room(slots.open, max, slots.queue.len()) {
            wake_oldest(&mut slots);
        }
    }

    /// Whether requests may go to it at `now`: not while it is ejected.
    pub fn is_ejected(&self) -> bool {
        if !self.ejected.load(Ordering::Relaxed) {
            return false;
        }
        let outlier = self.outlier.lock().unwrap_or_else(|e| e.into_inner());
        let ejected = outlier.ejected(Instant::now());
        if !ejected {
            self.ejected.store(false, Ordering::Relaxed);
        }
        ejected
    }

    /// A request got an answer's head from it.
    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// An active check that started at `started` passed: an ejection that began before it
    /// ends; whether one did.
    pub fn check_passed(&self, started: Instant) -> bool {
        let mut outlier = self.outlier.lock().unwrap_or_else(|e| e.into_inner());
        let back = outlier.check_passed(started);
        if back {
            self.ejected.store(false, Ordering::Relaxed);
            self.failures.store(0, Ordering::Relaxed);
        }
        back
    }
}

/// What the set is built from, changed together under one lock.
struct Following {
    /// The upstream config followed, and its snapshot's `upstream.base_path`.
    upstream: Option<(UpstreamConfig, BasePath)>,
    names: HashMap<String, NameRecord>,
    retired: Retired,
}

/// Addresses that left the set, each for as long as a connection to it is open.
#[derive(Default)]
struct Retired(Vec<Weak<Address>>);

impl Retired {
    fn add(&mut self, address: &Arc<Address>) {
        address.retired.store(true, Ordering::Relaxed);
        self.0.retain(|a| a.strong_count() > 0);
        self.0.push(Arc::downgrade(address));
    }

    /// The retired address reached as `peer`, if a connection to it is still open: back in
    /// the set.
    fn rejoin(&mut self, peer: &HttpPeer) -> Option<Arc<Address>> {
        self.0.retain(|a| a.strong_count() > 0);
        let at = self
            .0
            .iter()
            .position(|a| a.upgrade().is_some_and(|a| a.reached_as(peer)))?;
        // Its last connection may have closed since: then it starts afresh.
        let address = self.0.swap_remove(at).upgrade()?;
        address.retired.store(false, Ordering::Relaxed);
        Some(address)
    }
}

/// The backend's addresses, followed through reloads and DNS answers.
pub struct Backends {
    set: ArcSwap<AddressSet>,
    following: Mutex<Following>,
    pending: Arc<Pending>,
    metrics: Arc<BackendMetrics>,
    /// Wakes the name follower: a reload brought a name to look up.
    new_names: Notify,
    /// Wakes the pool's sweeper: an address left the set, its idle connections are to close;
    /// idle connections are kept for another time, or fewer of them for the budget.
    sweep: Notify,
}

impl Backends {
    pub fn new(metrics: Arc<BackendMetrics>) -> Self {
        Backends {
            set: ArcSwap::default(),
            following: Mutex::new(Following {
                upstream: None,
                names: HashMap::new(),
                retired: Retired::default(),
            }),
            pending: Arc::default(),
            metrics,
            new_names: Notify::new(),
            sweep: Notify::new(),
        }
    }

    /// Resolves when the pool is to be swept at once: an address has left the set, or the
    /// idle timeout or the connection budget changed, since the last call.
    pub async fn sweep_wanted(&self) {
        self.sweep.notified().await;
    }

    fn following(&self) -> MutexGuard<'_, Following> {
        self.following.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The addresses now, and their base.
    pub fn current(&self) -> arc_swap::Guard<Arc<AddressSet>> {
        self.set.load()
    }

    /// The addresses now, and their base, held for longer (a request being sent, a round of
    /// health checks).
    pub fn current_full(&self) -> Arc<AddressSet> {
        self.set.load_full()
    }

    /// Follows `upstream` and `base` (`upstream.base_path`) of a snapshot being applied:
    /// names it drops are forgotten, names it adds are looked up soon, and the set is rebuilt
    /// from what is known now, under `base`.
    pub fn follow(&self, upstream: &UpstreamConfig, base: &BasePath) {
        let mut following = self.following();
        let names = upstream.names();
        following.names.retain(|name, _| {
            let kept = names.contains(&name.as_str());
            if !kept {
                self.metrics.name_dropped(name);
            }
            kept
        });
        let mut added = false;
        for name in names {
            if !following.names.contains_key(name) {
                following
                    .names
                    .insert(name.to_owned(), NameRecord::unknown(Instant::now()));
                self.metrics.name_configured(name);
                added = true;
            }
        }
        let idle_timeout_changed = following
            .upstream
            .as_ref()
            .is_some_and(|(old, _)| old.idle_timeout != upstream.idle_timeout);
        following.upstream = Some((upstream.clone(), base.clone()));
        self.rebuild(&mut following);
        if idle_timeout_changed {
            // A shorter one closes what it makes expired now, not at the old expiry.
            self.sweep.notify_one();
        }
        if added {
            self.new_names.notify_one();
        }
    }

    /// Builds the set from `following`: addresses that stay keep their state, those that
    /// leave are retired, and those that come back while still connected are taken up again.
    fn rebuild(&self, following: &mut Following) {
        let Following {
            upstream: Some((upstream, base)),
            names,
            retired,
        } = following
        else {
            return;
        };
        let previous = self.set.load_full();
        let old = &previous.addresses;
        let addresses: Vec<Arc<Address>> = rotation(&upstream.targets, names)
            .into_iter()
            .map(|(target, addr)| {
                let peer = upstream.peer(&upstream.targets[target], addr);
                if let Some(stays) = old.iter().find(|a| a.reached_as(&peer)) {
                    return stays.clone();
                }
                self.metrics.address_joined(&addr.to_string());
                retired
                    .rejoin(&peer)
                    .unwrap_or_else(|| Arc::new(Address::new(peer, self.pending.clone())))
            })
            .collect();
        for gone in old
            .iter()
            .filter(|a| !addresses.iter().any(|b| Arc::ptr_eq(a, b)))
        {
            retired.add(gone);
            self.sweep.notify_one();
            // Still in the set, reached another way (another CA, SNI or scheme, or another
            // target's): it keeps its series, and connections made the old way drain.
            if addresses.iter().any(|b| b.addr == gone.addr) {
                tracing::info!(address = %gone.addr, "upstream address is still in the set, reached another way (other TLS settings, or another target); connections made the old way drain and close");
                continue;
            }
            self.metrics.address_left(&gone.addr.to_string());
            tracing::info!(address = %gone.addr, "upstream address left the set; its connections drain and close");
        }
        let max = upstream.budget.max_connections_per_address;
        let budget_changed = previous
            .budget
            .is_some_and(|was| was.max_connections_per_address != max);
        for address in &addresses {
            address.follow_budget(max);
        }
        self.set.store(Arc::new(AddressSet {
            addresses,
            base: Some(base.clone()),
            budget: Some(upstream.budget),
        }));
        if budget_changed {
            // Requests waiting at the old budget look again under the new one (retired
            // addresses' too: those waiting for one still go to it).
            let set = self.set.load();
            let retired = retired.0.iter().filter_map(Weak::upgrade);
            for address in set.addresses.iter().cloned().chain(retired) {
                address.budget_changed(max);
            }
            // A lower one: the idle connections past it close now, not when they expire.
            self.sweep.notify_one();
        }
    }

    /// The names due for a lookup at `now` and the DNS settings, and when the next one is due.
    pub fn due(
        &self,
        now: Instant,
    ) -> (
        Vec<String>,
        Option<crate::config::DnsConfig>,
        Option<Instant>,
    ) {
        let following = self.following();
        let dns = following.upstream.as_ref().map(|(u, _)| u.dns.clone());
        let due = following
            .names
            .iter()
            .filter(|(_, r)| r.next <= now)
            .map(|(n, _)| n.clone())
            .collect();
        let next = following
            .names
            .values()
            .map(|r| r.next)
            .filter(|n| *n > now)
            .min();
        (due, dns, next)
    }

    /// Notes what a lookup of `name` gave; the set follows a changed answer.
    pub fn looked_up(&self, name: &str, answer: Result<(Vec<std::net::IpAddr>, Duration), String>) {
        let mut following = self.following();
        let Some(dns) = following.upstream.as_ref().map(|(u, _)| u.dns.clone()) else {
            return;
        };
        let now = Instant::now();
        let Some(record) = following.names.get_mut(name) else {
            return;
        };
        let changed = match answer {
            Ok((addresses, ttl)) => {
                let changed = record.answered(addresses, ttl, now, &dns);
                if changed {
                    tracing::info!(name, addresses = ?record.addresses, "upstream name answered new addresses");
                }
                changed
            }
            Err(error) => {
                record.failed(now, &dns);
                self.metrics.dns_error(name);
                tracing::warn!(name, %error, kept = ?record.addresses, "upstream name lookup failed; its last good addresses are kept");
                false
            }
        };
        if changed {
            self.rebuild(&mut following);
        }
    }

    /// Waits until a reload brings a name.
    pub async fn new_name(&self) {
        self.new_names.notified().await
    }

    /// Names of the followed config that have no address yet.
    pub fn unresolved(&self) -> Vec<String> {
        self.following()
            .names
            .iter()
            .filter(|(_, r)| r.addresses.is_empty())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Counts a failure of `address` and ejects it when they are enough in a row and another
    /// address of the set now would still take requests: not of the set the request started
    /// with, which DNS or a reload may have changed since (its other addresses gone, the
    /// failing one the last left). An address that has left the set (a
    /// request still in flight to it failed) is in no rotation to be ejected from: ejecting
    /// it would bring back its ejection series, removed when it left, for good.
    pub fn failed(
        &self,
        address: &Address,
        is_up: impl Fn(&Address) -> bool,
        upstream: &UpstreamConfig,
    ) {
        if address.is_retired() {
            return;
        }
        let failures = address.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let config = &upstream.ejection;
        if config.after_failures == 0 || failures < config.after_failures {
            return;
        }
        // Held to the end: a rebuild retires addresses, and drops their series, under it.
        let _following = self.following();
        if address.is_retired() {
            return;
        }
        let others = self
            .current()
            .addresses
            .iter()
            .any(|a| a.addr != address.addr && is_up(a) && !a.is_ejected());
        let now = Instant::now();
        let mut outlier = address.outlier.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(length) = outlier.failed(failures, now, config, others) {
            address.ejected.store(true, Ordering::Relaxed);
            address.failures.store(0, Ordering::Relaxed);
            self.metrics.ejected(&address.addr.to_string());
            tracing::warn!(address = %address.addr, failures, ejected_for_ms = length.as_millis() as u64, "upstream address ejected after failures in a row");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FileConfig, Snapshot};

    /// A budget of one connection to an address, up to `max_pending` requests waiting for
    /// it; the address, and the place of the connection it has open.
    fn one_connection_open(max_pending: usize) -> (BudgetConfig, Arc<Address>, Slot) {
        let budget = BudgetConfig {
            max_connections_per_address: Some(1),
            max_pending,
            pending_timeout: Duration::from_secs(1),
        };
        let address = Address::detached("10.0.0.1:80".parse().unwrap());
        let Ok(Admit::Connect(slot)) = address.admit(&budget, false) else {
            panic!("the first connection is within the budget");
        };
        (budget, address, slot)
    }

    /// A request waits for the one connection, is woken as it comes back, and leaves to take
    /// it: what a woken request does before it asks again.
    async fn wait_and_be_woken(address: &Arc<Address>, budget: &BudgetConfig) {
        let Ok(Admit::Wait(mut waiting)) = address.admit(budget, false) else {
            panic!("a request waits while the connection is busy");
        };
        address.returned();
        waiting.woken().await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_freed_place_wakes_the_oldest_waiter_and_the_queue_is_bounded() {
        let (budget, address, slot) = one_connection_open(2);
        let Ok(Admit::Wait(mut first)) = address.admit(&budget, false) else {
            panic!("the second waits");
        };
        let Ok(Admit::Wait(second)) = address.admit(&budget, false) else {
            panic!("the third waits");
        };
        assert!(matches!(
            address.admit(&budget, false),
            Err(OverflowReason::QueueFull)
        ));
        drop(slot);
        // Woken (else this would never return), and its place is free again.
        first.woken().await;
        assert_eq!(address.open(), 0);
        drop(first);
        // The woken request goes before the one still waiting; a newcomer does not.
        assert!(matches!(address.admit(&budget, false), Ok(Admit::Wait(_))));
        assert!(matches!(
            address.admit(&budget, true),
            Ok(Admit::Connect(_))
        ));
        drop(second);
        assert_eq!(address.pending.count.load(Ordering::Relaxed), 0);
    }

    /// A connection comes back and wakes the one waiting request, but a newcomer, seeing no
    /// one in the queue, takes it first; another newcomer then queues. The woken request,
    /// finding no connection, waits again at the head of the queue, and the next connection
    /// back is its.
    #[tokio::test(flavor = "current_thread")]
    async fn a_woken_request_that_must_wait_again_keeps_its_place() {
        let (budget, address, _slot) = one_connection_open(4);
        wait_and_be_woken(&address, &budget).await;
        // The newcomer took the connection (the pool is not part of this test); the next one
        // finds the connection busy and queues.
        let Ok(Admit::Wait(mut later)) = address.admit(&budget, false) else {
            panic!("a newcomer waits while the connection is busy");
        };
        let Ok(Admit::Wait(mut oldest)) = address.admit(&budget, true) else {
            panic!("the woken request waits again: the one connection is busy");
        };
        address.returned();
        assert!(
            oldest.woken.try_recv().is_ok(),
            "the oldest request is woken first"
        );
        assert!(later.woken.try_recv().is_err(), "the newcomer still waits");
    }

    /// The backends of one address, and its config with an idle timeout.
    fn one_address() -> (Backends, impl Fn(u64) -> Snapshot) {
        let backend: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let config = move |idle_timeout_ms| {
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.upstream.idle_timeout_ms = idle_timeout_ms;
            cfg.snapshot()
        };
        (backends(), config)
    }

    impl Backends {
        /// Follows `snapshot` as a reload applies it.
        fn follow_snapshot(&self, snapshot: &Snapshot) {
            self.follow(&snapshot.upstream, &snapshot.bases.upstream);
        }
    }

    fn backends() -> Backends {
        let telemetry =
            crate::observe::telemetry::Telemetry::register(&prometheus::Registry::new()).unwrap();
        Backends::new(telemetry.backends.clone())
    }

    /// A reload that changes how long idle connections are kept reaches the addresses the
    /// same way: they keep their state (connections counted, queue, ejection).
    #[test]
    fn an_address_reached_the_same_way_keeps_its_state_through_a_reload() {
        let (backends, config) = one_address();
        backends.follow_snapshot(&config(60_000));
        let before = backends.current_full().addresses[0].clone();
        backends.follow_snapshot(&config(5_000));
        assert!(Arc::ptr_eq(&before, &backends.current_full().addresses[0]));
        assert!(!before.is_retired());
    }

    /// A set carries the base of the config it was followed from: a reload that changes only
    /// the base gives the same addresses (state and all) under the new one, and a new DNS
    /// answer keeps it.
    #[test]
    fn a_set_carries_the_base_of_its_config_through_reloads_and_dns_answers() {
        let config = |base: &str| {
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[]);
            cfg.upstream.addresses = vec!["backend.example:80".into()];
            cfg.upstream.base_path = base.into();
            cfg.snapshot()
        };
        let backends = backends();
        let answer = |ip: &str| Ok((vec![ip.parse().unwrap()], Duration::from_secs(30)));
        let base = |set: &AddressSet| set.base.as_ref().map(|b| b.as_str().to_owned());
        assert_eq!(base(&backends.current_full()), None, "nothing followed yet");

        backends.follow_snapshot(&config("/old/v2"));
        backends.looked_up("backend.example", answer("10.0.0.1"));
        let before = backends.current_full();
        assert_eq!(base(&before).as_deref(), Some("/old/v2"));

        backends.follow_snapshot(&config("/new/v2"));
        let after = backends.current_full();
        assert_eq!(base(&after).as_deref(), Some("/new/v2"));
        assert!(Arc::ptr_eq(&before.addresses[0], &after.addresses[0]));

        backends.looked_up("backend.example", answer("10.0.0.2"));
        let moved = backends.current_full();
        assert_eq!(moved.addresses[0].addr, "10.0.0.2:80".parse().unwrap());
        assert_eq!(base(&moved).as_deref(), Some("/new/v2"));
    }

    /// An address reached another way after a reload (here another SNI; a rotated CA alike)
    /// is another `Address`, whose connections start afresh, but it is still in the set: its
    /// ejection series stays, where the rebuild used to drop it as if the address had left.
    #[test]
    fn an_address_reached_another_way_keeps_its_series() {
        let registry = prometheus::Registry::new();
        let telemetry = crate::observe::telemetry::Telemetry::register(&registry).unwrap();
        let backends = Backends::new(telemetry.backends.clone());
        let backend: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let config = |sni: &str| {
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.upstream.tls = true;
            cfg.upstream.tls_sni = Some(sni.into());
            cfg.snapshot()
        };
        let series = || {
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == "agent_gateway_upstream_ejections_total")
                .map(|f| f.get_metric().len())
                .sum::<usize>()
        };
        backends.follow_snapshot(&config("a.example"));
        let before = backends.current_full().addresses[0].clone();
        assert_eq!(series(), 1);
        backends.follow_snapshot(&config("b.example"));
        let after = backends.current_full().addresses[0].clone();
        assert!(
            !Arc::ptr_eq(&before, &after),
            "another way: another Address"
        );
        assert_eq!(series(), 1, "the address's series stays");
    }

    /// An address that leaves the set and comes back while a connection to it is open (a name
    /// whose answers rotate) takes up its state again: that connection still counts against
    /// its budget. Once its last connection has closed, it comes back afresh.
    #[test]
    fn an_address_back_while_still_connected_keeps_its_state() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        let config = |backends: &[SocketAddr]| {
            FileConfig::for_test("127.0.0.1:0".parse().unwrap(), backends).snapshot()
        };
        let backends = backends();
        let budget = BudgetConfig {
            max_connections_per_address: Some(1),
            max_pending: 0,
            pending_timeout: Duration::from_secs(1),
        };
        let address_of = |addr| {
            backends
                .current_full()
                .addresses
                .iter()
                .find(|x| x.addr == addr)
                .cloned()
                .expect("the address is in the set")
        };

        backends.follow_snapshot(&config(&[a, b]));
        let first = address_of(a);
        let Ok(Admit::Connect(busy)) = first.admit(&budget, false) else {
            panic!("the first connection is within the budget");
        };
        backends.follow_snapshot(&config(&[b]));
        assert!(first.is_retired());
        backends.follow_snapshot(&config(&[a, b]));
        let back = address_of(a);
        assert!(
            Arc::ptr_eq(&first, &back),
            "the same address, state and all"
        );
        assert!(!back.is_retired());
        assert_eq!(back.open(), 1);
        assert!(matches!(
            back.admit(&budget, false),
            Err(OverflowReason::QueueFull)
        ));
        drop((first, back));

        backends.follow_snapshot(&config(&[b]));
        drop(busy);
        backends.follow_snapshot(&config(&[a, b]));
        assert_eq!(address_of(a).open(), 0, "nothing open: a fresh start");
    }

    /// A reload that raises the budget wakes as many waiting requests as it has room for,
    /// and the set carries the new budget for them to look again under.
    #[tokio::test(flavor = "current_thread")]
    async fn a_raised_budget_wakes_the_requests_it_has_room_for() {
        let backend: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let config = |max| {
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.upstream.max_connections_per_address = Some(max);
            cfg.snapshot()
        };
        let backends = backends();
        backends.follow_snapshot(&config(1));
        let address = backends.current_full().addresses[0].clone();
        let budget = backends.current_full().budget.unwrap();
        let Ok(Admit::Connect(_busy)) = address.admit(&budget, false) else {
            panic!("the first connection is within the budget");
        };
        let mut waiting: Vec<Waiter> = (0..3)
            .map(|_| match address.admit(&budget, false) {
                Ok(Admit::Wait(w)) => w,
                _ => panic!("the others wait"),
            })
            .collect();
        backends.follow_snapshot(&config(3));
        let woken: Vec<bool> = waiting
            .iter_mut()
            .map(|w| w.woken.try_recv().is_ok())
            .collect();
        assert_eq!(
            woken,
            [true, true, false],
            "room for two more, oldest first"
        );
        let budget = backends.current_full().budget.unwrap();
        assert_eq!(budget.max_connections_per_address, Some(3));
        // The two woken take their places, up to the new budget; then there is none.
        let taken: Vec<_> = (0..2)
            .map(|_| match address.admit(&budget, true) {
                Ok(Admit::Connect(slot)) => slot,
                _ => panic!("a woken request has room under the new budget"),
            })
            .collect();
        assert_eq!(address.open(), 3);
        assert!(matches!(address.admit(&budget, true), Ok(Admit::Wait(_))));
        drop(taken);
    }

    /// A shorter idle timeout closes what it makes expired at once: the sweeper is woken.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_new_idle_timeout_wakes_the_pool_s_sweeper() {
        let (backends, config) = one_address();
        let woken = || tokio::time::timeout(Duration::from_millis(1), backends.sweep_wanted());
        backends.follow_snapshot(&config(60_000));
        backends.follow_snapshot(&config(60_000));
        assert!(woken().await.is_err(), "nothing changed");
        backends.follow_snapshot(&config(5_000));
        assert!(woken().await.is_ok());
    }

    /// A woken request that must wait again keeps its place among the waiting even when
    /// newcomers took every other: it was counted before them.
    #[tokio::test(flavor = "current_thread")]
    async fn a_woken_request_waits_again_even_when_the_queue_filled_behind_it() {
        let (budget, address, _slot) = one_connection_open(1);
        wait_and_be_woken(&address, &budget).await;
        // A newcomer takes the one place among the waiting.
        let Ok(Admit::Wait(_newcomer)) = address.admit(&budget, false) else {
            panic!("a newcomer waits");
        };
        assert!(matches!(
            address.admit(&budget, false),
            Err(OverflowReason::QueueFull)
        ));
        assert!(matches!(address.admit(&budget, true), Ok(Admit::Wait(_))));
    }

    /// A connection that comes back, or a place that frees, at an address nobody waits for
    /// is told to a request waiting at another; at an address with a request of its own
    /// waiting, it wakes that one, and tells nobody else. With nobody waiting anywhere, nobody
    /// is told.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_place_freed_where_nobody_waits_is_told_to_a_request_waiting_elsewhere() {
        let addresses: [SocketAddr; 2] = [
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &addresses);
        cfg.upstream.max_connections_per_address = Some(1);
        let backends = backends();
        backends.follow_snapshot(&cfg.snapshot());
        let set = backends.current_full();
        let budget = set.budget.unwrap();
        let (a, b) = (&set.addresses[0], &set.addresses[1]);
        let told = || tokio::time::timeout(Duration::from_millis(1), a.room_elsewhere());
        let (Ok(Admit::Connect(busy_a)), Ok(Admit::Connect(busy_b))) =
            (a.admit(&budget, false), b.admit(&budget, false))
        else {
            panic!("one connection each is within the budget");
        };
        let Ok(Admit::Wait(at_a)) = a.admit(&budget, false) else {
            panic!("a request waits at the first address");
        };
        b.returned();
        assert!(told().await.is_ok(), "a connection back at the second");
        let Ok(Admit::Wait(mut at_b)) = b.admit(&budget, false) else {
            panic!("a request waits at the second address");
        };
        drop(busy_b);
        assert!(
            at_b.woken.try_recv().is_ok(),
            "the one waiting there is woken"
        );
        assert!(told().await.is_err(), "and nobody else is told");
        drop((at_a, at_b));
        drop(busy_a);
        assert!(told().await.is_err(), "nobody waits");
    }

    /// A request woken for a connection that leaves before taking it (its wait ran out at that
    /// moment, or its client went) passes the wake to the next in line.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wake_its_request_did_not_use_goes_to_the_next() {
        let (budget, address, _slot) = one_connection_open(4);
        let Ok(Admit::Wait(oldest)) = address.admit(&budget, false) else {
            panic!("the second request waits");
        };
        let Ok(Admit::Wait(mut next)) = address.admit(&budget, false) else {
            panic!("the third request waits");
        };
        address.returned();
        assert!(
            next.woken.try_recv().is_err(),
            "the oldest was woken, not this one"
        );
        drop(oldest);
        assert!(next.woken.try_recv().is_ok(), "the unused wake came here");
        // A wake that was used is not passed on.
        let Ok(Admit::Wait(mut used)) = address.admit(&budget, false) else {
            panic!("a fourth request waits");
        };
        let Ok(Admit::Wait(mut after)) = address.admit(&budget, false) else {
            panic!("a fifth request waits");
        };
        address.returned();
        used.woken().await;
        drop(used);
        assert!(after.woken.try_recv().is_err());
    }
}
