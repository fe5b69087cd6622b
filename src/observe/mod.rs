//! What happened to each request: the per-request record, the metrics, access log and span
//! made from it, the count of requests being served, tracing's context and export, the retirement plan as metrics, and who still
//! calls v1 (one gateway's count, or the fleet's from Prometheus, through its query API), and
//! the retirement board's figures made of them; the backend's addresses and names
//! ([`backend`]).

pub mod access_log;
pub mod backend;
pub mod board;
pub mod exchange;
pub mod fleet;
pub mod in_flight;
pub mod log_sink;
pub mod prometheus;
pub mod retirement;
pub mod spans;
pub mod telemetry;
pub mod trace;
pub mod usage;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};

/// Runs `f` on the value of `key` in a map that requests read and rarely add to (an agent's
/// counters): found under the read lock, made by `make` under the write lock the first time,
/// once whoever races for it. A found value is lent to `f` under the read lock, not counted
/// out: an `Arc`'s clone and drop are two atomic read-modify-writes a lookup, on every request
/// (`Arc::clone` as `f` when the caller keeps it).
pub(crate) fn with_entry<V, S: BuildHasher, R>(
    map: &RwLock<HashMap<String, Arc<V>, S>>,
    key: &str,
    make: impl FnOnce() -> V,
    f: impl FnOnce(&Arc<V>) -> R,
) -> R {
    if let Some(known) = map.read().unwrap_or_else(|e| e.into_inner()).get(key) {
        return f(known);
    }
    let made = map
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_owned())
        .or_insert_with(|| Arc::new(make()))
        .clone();
    f(&made)
}

/// Keeps a second `tracing` dispatcher registered for the rest of a test run; call it before
/// a test sets a scoped subscriber (`set_default`, `with_default`) whose events it reads.
/// While only one dispatcher is registered, tracing-core takes a callsite's interest, once for
/// all threads, from the subscriber of the thread that reaches the callsite first: another
/// test's thread, with none, would switch the callsite off for the test watching it (seen as
/// an access line missing about one run in five). With two registered it asks each of them.
#[cfg(test)]
pub(crate) fn register_a_second_dispatcher() {
    static SECOND: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
    });
    std::sync::LazyLock::force(&SECOND);
}
