//! Live configuration: the snapshot store, the three reload triggers and their metrics.
//!
//! The whole validated config is one immutable [`Snapshot`] behind an [`ArcSwap`]. A reload
//! builds a complete new snapshot or nothing: a file that fails to parse or validate is refused
//! whole and the previous snapshot keeps serving. Settings that only take effect at start-up
//! (listeners, threads) keep their running values and are reported as needing a restart. A
//! snapshot applied is warned about as `run` warns at start ([`warn_of`]: no agent, ...), and
//! one that accepts a published token is refused as `run` refuses it at start
//! ([`PublishedTokens`]).
//!
//! Triggers: [`ConfigWatcher`] (the file's parent directory, so in-place writes, renames over
//! the file and Kubernetes' `..data` symlink swap all count; an in-place write is read once
//! its writer closes the file, never half-way), SIGHUP (in [`crate::app::signals`])
//! and `POST /-/reload` on the admin listener. All three call [`ConfigStore::reload`], and the
//! watcher watches the files each reading names, whichever trigger made it. Parts
//! that are built from the config rather than read per request (the span export pipeline)
//! follow each applied snapshot through [`ConfigStore::on_apply`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Serialize;

use crate::config::published::PublishedTokens;
use crate::config::warnings::snapshot_warnings;
use crate::config::{directory_of, ConfigError, Inputs, Problem, Reading, Snapshot, StartupConfig};

/// How long the watcher waits for a burst of file events to settle before reloading.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// How long a write its writer has not closed yet holds back the reading of its file: a file
/// truncated and written over is read once it is closed, or, from a writer that keeps it
/// open (or a `truncate`, which closes nothing), this long after its first change.
const UNCLOSED_WRITE: Duration = Duration::from_secs(2);

listed_enum! {
    /// What asked for a reload (for logs).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Trigger {
        FileChange => "file_change",
        Sighup => "sighup",
        Admin => "admin",
    }
}

/// The result of one reload, as `POST /-/reload` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    /// `success` or `failure`.
    pub result: &'static str,
    /// The generation serving after this reload.
    pub generation: u64,
    /// Changed settings that keep their running value until a restart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restart_required: Vec<&'static str>,
    /// Every problem of a refused file, by key path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ProblemReport>,
}

/// One problem of a refused file: its key path, and where the file has it.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemReport {
    /// The file the key is in when it is not the config (the agents file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    pub message: String,
}

impl From<Problem> for ProblemReport {
    fn from(p: Problem) -> Self {
        Self {
            file: p.file,
            key: p.key,
            line: p.at.map(|a| a.line),
            column: p.at.map(|a| a.column),
            message: p.message,
        }
    }
}

/// The start-up settings that differ between two snapshots, by key path.
pub fn restart_only_changes(running: &StartupConfig, new: &StartupConfig) -> Vec<&'static str> {
    // Every field, without `..`: a new start-up setting does not compile until it has its key.
    let StartupConfig {
        proxy_listen,
        proxy_tls,
        http2,
        admin_listen,
        threads,
        grace_period_seconds,
        work_stealing,
        upstream_keepalive_pool_size,
        watch_config,
        upgrade_sock,
        readiness_requires_upstream,
    } = running;
    [
        (*proxy_listen != new.proxy_listen, "listen.proxy"),
        // TLS on or off; the certificate itself follows reloads.
        (*proxy_tls != new.proxy_tls, "listen.tls_cert"),
        (*http2 != new.http2, "listen.http2"),
        (*admin_listen != new.admin_listen, "listen.admin"),
        (*threads != new.threads, "server.threads"),
        (
            *grace_period_seconds != new.grace_period_seconds,
            "server.grace_period_seconds",
        ),
        (*work_stealing != new.work_stealing, "server.work_stealing"),
        (
            *upstream_keepalive_pool_size != new.upstream_keepalive_pool_size,
            "server.upstream_keepalive_pool_size",
        ),
        (*watch_config != new.watch_config, "server.watch_config"),
        (*upgrade_sock != new.upgrade_sock, "server.upgrade_sock"),
        (
            *readiness_requires_upstream != new.readiness_requires_upstream,
            "server.readiness_requires_upstream",
        ),
    ]
    .into_iter()
    .filter_map(|(changed, key)| changed.then_some(key))
    .collect()
}

struct ReloadMetrics {
    success: IntCounter,
    failure: IntCounter,
    last_success: Gauge,
    generation: IntGauge,
}

impl ReloadMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "agent_gateway_config_reloads_total",
                "Config reload attempts, by result.",
            ),
            &["result"],
        )?;
        let last_success = Gauge::new(
            "agent_gateway_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successfully applied config (start-up counts).",
        )?;
        let generation = IntGauge::new(
            "agent_gateway_config_generation",
            "Number of config snapshots applied since start (the first is 1).",
        )?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(last_success.clone()))?;
        registry.register(Box::new(generation.clone()))?;
        Ok(Self {
            success: reloads.with_label_values(&["success"]),
            failure: reloads.with_label_values(&["failure"]),
            last_success,
            generation,
        })
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Logs what `snapshot` allows that works but should not ([`snapshot_warnings`]: no agent,
/// PROXY headers believed from anyone, ...), a WARN line each: `run` at start, and the store at
/// each reload that applies a config, so that what a later edit brings is said too.
pub fn warn_of(snapshot: &Snapshot) {
    for warning in snapshot_warnings(snapshot) {
        tracing::warn!("{warning}");
    }
}

/// Something that follows the config: told of each new snapshot before requests see it.
pub type OnApply = Box<dyn Fn(&Snapshot) + Send + Sync>;

/// The live config: the current snapshot, where it came from, and how reloads went.
pub struct ConfigStore {
    current: Arc<ArcSwap<Snapshot>>,
    path: Option<PathBuf>,
    /// What the last reading read (the config's text and the files it names, applied or
    /// refused): a watcher event that changed none of them is not a reload, and one bad write
    /// is one failure, however many events it makes.
    seen: Mutex<Inputs>,
    metrics: ReloadMetrics,
    on_apply: Vec<OnApply>,
    /// Told of each reading applied or refused, for the watcher: a reload by signal or by the
    /// admin listener may name a file in a place, or by a name, it does not watch yet.
    readings: tokio::sync::Notify,
    /// Whether each applied reload logs its config's warnings ([`warn_of`]).
    warns: bool,
    /// Whether a reload may apply a config that accepts a published token.
    published: PublishedTokens,
}

impl ConfigStore {
    /// A store serving `snapshot`, loaded from `path` ([`Snapshot::load`]).
    pub fn new(
        snapshot: Snapshot,
        path: Option<PathBuf>,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let metrics = ReloadMetrics::register(registry)?;
        metrics.generation.set(1);
        metrics.last_success.set(unix_now());
        Ok(Self {
            seen: Mutex::new(snapshot.source.inputs.clone()),
            current: Arc::new(ArcSwap::from_pointee(snapshot)),
            path,
            metrics,
            on_apply: Vec::new(),
            readings: tokio::sync::Notify::new(),
            warns: true,
            published: PublishedTokens::Refused,
        })
    }

    /// Reloads log no warning about their config: for the demo, which warns of nothing at
    /// start either.
    pub fn without_warnings(&mut self) {
        self.warns = false;
    }

    /// Whether reloads may apply a config that accepts a published token: refused unless
    /// told (the demo).
    pub fn published_tokens(&mut self, published: PublishedTokens) {
        self.published = published;
    }

    /// Calls `follow` with every snapshot a reload applies, before any request can load it
    /// (for state that lives beside the snapshot: the rate limiter's Redis connection, the
    /// span exporter). It runs on the reload's thread, so it must not block for long.
    pub fn on_apply(&mut self, follow: impl Fn(&Snapshot) + Send + Sync + 'static) {
        self.on_apply.push(Box::new(follow));
    }

    /// The handle requests load their snapshot from.
    pub fn current(&self) -> &Arc<ArcSwap<Snapshot>> {
        &self.current
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn generation(&self) -> u64 {
        self.metrics.generation.get() as u64
    }

    /// Whether the last reading could not read a file the config names: worth reading again
    /// without an event ([`Inputs::unreadable`]).
    pub fn unreadable(&self) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unreadable
    }

    /// The files besides the config that the last reading read (the agents file, a password
    /// file): the watcher watches their directories too.
    pub fn named_files(&self) -> Vec<PathBuf> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .files
            .clone()
    }

    /// Re-reads the config file and the files it names, and applies them if valid. With
    /// `only_if_changed`, inputs equal to the last ones read are left alone (the watcher's
    /// events may repeat).
    pub fn reload(&self, trigger: Trigger, only_if_changed: bool) -> Option<ReloadReport> {
        let path = self.path.as_ref()?;
        // One reload at a time; the lock also guards `seen`.
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let reading = match Snapshot::read(path) {
            Ok(reading) => reading,
            // Remembered as any reading is: the same error again counts nothing more.
            Err(err) => Reading {
                inputs: Inputs::of_unreadable_config(&err.to_string(), seen.files.clone()),
                result: Err(err),
            },
        };
        if only_if_changed && reading.inputs.fingerprint == seen.fingerprint {
            return None;
        }
        let checked = reading
            .result
            .and_then(|new| self.published.check(&new).map(|()| new));
        let report = match checked {
            Ok(new) => self.apply(new, trigger),
            Err(err) => self.refuse(trigger, err),
        };
        *seen = reading.inputs;
        self.readings.notify_one();
        Some(report)
    }

    /// Swaps in `new`, keeping the running start-up settings.
    fn apply(&self, mut new: Snapshot, trigger: Trigger) -> ReloadReport {
        let running = self.current.load();
        let restart_required = restart_only_changes(&running.startup, &new.startup);
        new.startup = running.startup.clone();
        if new.startup.proxy_tls && new.server_cert.is_none() {
            // TLS turned off takes a restart: until then the snapshot names the certificate
            // the listener still serves.
            new.server_cert = running.server_cert.clone();
        }
        for follow in &self.on_apply {
            follow(&new);
        }
        self.current.store(Arc::new(new));
        self.metrics.success.inc();
        self.metrics.generation.inc();
        self.metrics.last_success.set(unix_now());
        let generation = self.generation();
        tracing::info!(
            trigger = trigger.as_str(),
            generation,
            ?restart_required,
            "config reloaded"
        );
        if !restart_required.is_empty() {
            tracing::warn!(settings = ?restart_required, "changed settings need a restart; their running values are kept");
        }
        if self.warns {
            warn_of(&self.current.load());
        }
        ReloadReport {
            result: "success",
            generation,
            restart_required,
            problems: Vec::new(),
        }
    }

    fn refuse(&self, trigger: Trigger, err: ConfigError) -> ReloadReport {
        self.metrics.failure.inc();
        tracing::error!(trigger = trigger.as_str(), error = %err, "config reload refused; the previous config keeps serving");
        ReloadReport {
            result: "failure",
            generation: self.generation(),
            restart_required: Vec::new(),
            problems: err
                .problems()
                .into_iter()
                .map(ProblemReport::from)
                .collect(),
        }
    }
}

/// Whether a directory event can have changed the config file: a write, a rename (an
/// atomic replace, Kubernetes' `..data` swap), a creation or a removal. Opens, reads and
/// attribute changes cannot, and the watcher's own reads make them: reacting to those would
/// re-read the file forever.
fn may_change_the_file(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) | EventKind::Any => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Other => false,
    }
}

/// Whether an event is a write whose writer has not closed the file yet (inotify's
/// `IN_MODIFY`): the file may hold only the start of what is being written, a valid file cut
/// short (fewer agents, a token without its `not_after`). It is read at the close
/// (`Close(Write)`), not at each write.
fn is_a_write_under_way(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Modify(ModifyKind::Data(_)))
}

/// Whether an event that names `paths` is about one of the watched files, known by their
/// `names`: it names one of them, or an entry of Kubernetes' atomic writer (`..data`, its
/// timestamped directories), whose swap changes every file of a mounted ConfigMap or Secret
/// at once. Other files in the same directories (a log written beside the config) are not
/// the config's: each of their writes was a reload, the whole config read and parsed again.
fn names_a_watched_file(paths: &[PathBuf], names: &[OsString]) -> bool {
    paths
        .iter()
        .filter_map(|p| p.file_name())
        .any(|name| names.iter().any(|n| n == name) || name.as_encoded_bytes().starts_with(b".."))
}

/// Watches the config file's parent directory, and those of the files it names (the agents
/// file, a password file, the listener's certificate: a Kubernetes Secret swaps its `..data`
/// there as a ConfigMap does), and reloads when any of them changes. A watched directory
/// that is removed or moved away takes its watch with it: it is watched again once it is
/// back (looked for each [`RETRY`]), and its files are read then.
pub struct ConfigWatcher {
    pub store: Arc<ConfigStore>,
}

/// How often a directory that cannot be watched (not there yet, or removed) is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// What the watcher follows, shared with notify's thread, which sorts events by it.
#[derive(Default)]
struct Followed {
    /// The watched files' names ([`names_a_watched_file`]).
    names: Vec<OsString>,
    /// The directories watched now.
    dirs: Vec<PathBuf>,
}

/// What notify's thread tells the watcher.
enum Heard {
    /// A watched file may have changed.
    Change,
    /// A watched file is being written ([`is_a_write_under_way`]): read at its close.
    Writing,
    /// A watched directory was removed or moved away, and its watch with it.
    DirectoryGone(PathBuf),
}

impl ConfigWatcher {
    /// Watches the directories of the config and of the files it names now that are not
    /// watched yet (a reload may name a file in a new place; a directory may be back), and
    /// says which file names its events are about. Returns the directories it began to
    /// watch, whether the names changed (either way a file may have changed unheard since it
    /// was read), and whether a directory could not be watched (to be tried again).
    fn watch_new_files(
        &self,
        watcher: &mut impl Watcher,
        followed: &RwLock<Followed>,
        missing: &mut Vec<PathBuf>,
    ) -> (Vec<PathBuf>, bool) {
        let Some(path) = self.store.path() else {
            return (Vec::new(), false);
        };
        let files: Vec<PathBuf> = std::iter::once(path.to_path_buf())
            .chain(self.store.named_files())
            .collect();
        let now: Vec<OsString> = files
            .iter()
            .filter_map(|f| f.file_name().map(OsString::from))
            .collect();
        // Never held while notify is called: its thread, which `watch` waits on, may be
        // waiting for this lock in the event handler.
        let dirs: Vec<PathBuf> = files.iter().map(|f| directory_of(f)).collect();
        // A directory no file is in any longer is not looked for.
        missing.retain(|m| dirs.contains(m));
        // Each new directory is followed before its watch begins: its removal at that moment
        // is then heard, and it is looked for again.
        let (renamed, unwatched) = {
            let mut followed = followed.write().unwrap_or_else(|e| e.into_inner());
            let renamed = followed.names != now;
            followed.names = now;
            let mut unwatched: Vec<PathBuf> = Vec::new();
            for dir in dirs {
                if !followed.dirs.contains(&dir) {
                    followed.dirs.push(dir.clone());
                    unwatched.push(dir);
                }
            }
            (renamed, unwatched)
        };
        let mut began = Vec::new();
        for dir in unwatched {
            match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    missing.retain(|m| *m != dir);
                    began.push(dir);
                }
                Err(e) => {
                    followed
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .dirs
                        .retain(|d| *d != dir);
                    if !missing.contains(&dir) {
                        tracing::error!(dir = %dir.display(), error = %e, "cannot watch a config directory; trying again each second");
                        missing.push(dir);
                    }
                }
            }
        }
        (began, renamed)
    }

    /// Reads the files again and applies them if they differ from what runs.
    async fn look(&self) {
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.reload(Trigger::FileChange, true)).await;
    }
}

/// A watched directory is gone (removed, or moved away): its watch goes, and it is looked for
/// until it is back.
fn lost(
    dir: &Path,
    watcher: &mut impl Watcher,
    followed: &RwLock<Followed>,
    missing: &mut Vec<PathBuf>,
) {
    tracing::warn!(dir = %dir.display(), "a config directory was removed or moved; watching it again once it is back");
    followed
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .dirs
        .retain(|d| d != dir);
    // Not under the lock: notify's thread, which this waits on, may be waiting for it.
    let _ = watcher.unwatch(dir);
    if !missing.iter().any(|m| m == dir) {
        missing.push(dir.to_path_buf());
    }
}

#[async_trait]
impl BackgroundService for ConfigWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if self.store.path().is_none() {
            return;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let followed = Arc::new(RwLock::new(Followed::default()));
        let sorting = followed.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else {
                return;
            };
            if !may_change_the_file(&event.kind) {
                return;
            }
            let followed = sorting.read().unwrap_or_else(|e| e.into_inner());
            if matches!(
                event.kind,
                EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
            ) {
                for gone in event.paths.iter().filter(|p| followed.dirs.contains(p)) {
                    let _ = tx.send(Heard::DirectoryGone(gone.clone()));
                }
            }
            if names_a_watched_file(&event.paths, &followed.names) {
                let heard = if is_a_write_under_way(&event.kind) {
                    Heard::Writing
                } else {
                    Heard::Change
                };
                let _ = tx.send(heard);
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the config file; reload with SIGHUP or POST /-/reload");
                return;
            }
        };
        let mut missing = Vec::new();
        // When a write not closed yet is read anyway ([`UNCLOSED_WRITE`]).
        let mut unclosed: Option<tokio::time::Instant> = None;
        loop {
            let (began, renamed) = self.watch_new_files(&mut watcher, &followed, &mut missing);
            if !began.is_empty() || renamed {
                // A change between a file's last read and the start of its watch (or of its
                // name's) makes no event: look once (a no-op unless the files differ from
                // what runs). Logged after the look, so from that line on every change is
                // heard.
                self.look().await;
                for dir in began {
                    tracing::info!(dir = %dir.display(), "watching the config directory");
                }
            }
            let held_until = unclosed.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                _ = shutdown.changed() => return,
                // A reading by any trigger (this watcher's own included): watch what it named.
                _ = self.store.readings.notified() => continue,
                // A directory not there to watch: it may be now.
                _ = tokio::time::sleep(RETRY), if !missing.is_empty() => continue,
                // A file that could not be read may be readable now, with no event to say so
                // (a revoked token must not wait for the next change): read again. Nothing is
                // counted while the reading stays the same. Not during a write not closed yet:
                // it is read at its close.
                _ = tokio::time::sleep(RETRY), if unclosed.is_none() && self.store.unreadable() => {}
                // A write never closed: read what it left.
                _ = tokio::time::sleep_until(held_until), if unclosed.is_some() => {}
                heard = rx.recv() => match heard {
                    None => return,
                    Some(Heard::DirectoryGone(dir)) => {
                        lost(&dir, &mut watcher, &followed, &mut missing);
                        continue;
                    }
                    Some(Heard::Writing) => {
                        unclosed.get_or_insert_with(|| tokio::time::Instant::now() + UNCLOSED_WRITE);
                        continue;
                    }
                    Some(Heard::Change) => {}
                }
            }
            // Debounce: editors and ConfigMap swaps write in bursts.
            tokio::time::sleep(DEBOUNCE).await;
            // A write begun after the last change (and not closed yet) is read at its close.
            let mut writing = false;
            while let Ok(heard) = rx.try_recv() {
                match heard {
                    Heard::DirectoryGone(dir) => lost(&dir, &mut watcher, &followed, &mut missing),
                    Heard::Writing => writing = true,
                    Heard::Change => writing = false,
                }
            }
            let overdue = unclosed.is_some_and(|at| at <= tokio::time::Instant::now());
            if writing && !overdue {
                unclosed.get_or_insert_with(|| tokio::time::Instant::now() + UNCLOSED_WRITE);
                continue;
            }
            unclosed = None;
            self.look().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{testing, FileConfig};

    fn base() -> FileConfig {
        testing::config()
    }

    fn store_on(dir: &Path, f: FileConfig) -> ConfigStore {
        let path = dir.join("gw.toml");
        std::fs::write(&path, f.to_toml()).unwrap();
        ConfigStore::new(Snapshot::load(&path).unwrap(), Some(path), &Registry::new()).unwrap()
    }

    /// Writes `f` over the store's file.
    fn write(dir: &Path, f: &FileConfig) {
        std::fs::write(dir.join("gw.toml"), f.to_toml()).unwrap();
    }

    #[test]
    fn restart_only_changes_name_the_key_that_changed() {
        let running = base().snapshot().startup.clone();
        let mut new = running.clone();
        assert!(restart_only_changes(&running, &new).is_empty());
        // TLS turned on takes a restart (its certificate follows reloads: tests/tls.rs).
        new.proxy_tls = true;
        new.threads = running.threads + 1;
        assert_eq!(
            restart_only_changes(&running, &new),
            ["listen.tls_cert", "server.threads"]
        );
    }

    #[test]
    fn a_valid_file_applies_and_bumps_the_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_on(dir.path(), base());
        let mut f = base();
        f.v1.default_service = "B".into();
        write(dir.path(), &f);
        let report = store.reload(Trigger::Admin, false).unwrap();
        assert_eq!((report.result, report.generation), ("success", 2));
        assert_eq!(store.current().load().v1_default_service.as_str(), "B");
    }

    #[test]
    fn hooks_see_each_applied_snapshot_and_no_refused_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_on(dir.path(), base());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        store.on_apply(move |s| {
            log.lock()
                .unwrap()
                .push(s.v1_default_service.as_str().to_owned())
        });
        let mut f = base();
        f.v1.default_service = "B".into();
        write(dir.path(), &f);
        store.reload(Trigger::Admin, false).unwrap();
        f.upstream.addresses = vec!["nowhere".into()];
        write(dir.path(), &f);
        assert_eq!(
            store.reload(Trigger::Admin, false).unwrap().result,
            "failure"
        );
        assert_eq!(*seen.lock().unwrap(), ["B"]);
    }

    #[test]
    fn an_invalid_file_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_on(dir.path(), base());
        let mut bad = base();
        bad.v1.default_service = "B".into();
        bad.upstream.addresses = vec!["nowhere".into()];
        write(dir.path(), &bad);
        let report = store.reload(Trigger::Sighup, false).unwrap();
        assert_eq!(report.result, "failure");
        assert_eq!(report.problems[0].key, "upstream.addresses[0]");
        assert_eq!(
            store.current().load().v1_default_service.as_str(),
            testing::DEFAULT_SERVICE
        );
        assert_eq!(store.generation(), 1);
        assert_eq!(store.metrics.failure.get(), 1);
    }

    #[test]
    fn start_up_settings_keep_their_running_values() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_on(dir.path(), base());
        let running = store.current().load().startup.proxy_listen;
        let mut moved = base();
        moved.listen.proxy = "127.0.0.1:8081".into();
        moved.v1.default_service = "C".into();
        write(dir.path(), &moved);
        let report = store.reload(Trigger::Admin, false).unwrap();
        assert_eq!(report.restart_required, vec!["listen.proxy"]);
        let now = store.current().load();
        assert_eq!(now.startup.proxy_listen, running);
        assert_eq!(now.v1_default_service.as_str(), "C");
    }

    #[test]
    fn a_bad_file_fails_once_for_the_watcher_however_many_events_it_makes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_on(dir.path(), base());
        std::fs::write(dir.path().join("gw.toml"), "not [toml").unwrap();
        assert_eq!(
            store.reload(Trigger::FileChange, true).unwrap().result,
            "failure"
        );
        assert!(store.reload(Trigger::FileChange, true).is_none());
        assert_eq!(store.metrics.failure.get(), 1);
        // An explicit reload still says what is wrong.
        assert_eq!(
            store.reload(Trigger::Sighup, false).unwrap().result,
            "failure"
        );
    }

    #[test]
    fn only_events_that_can_change_the_file_count() {
        use notify::event::{CreateKind, DataChange, MetadataKind, RenameMode};
        for kind in [
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            EventKind::Create(CreateKind::File),
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
        ] {
            assert!(may_change_the_file(&kind), "{kind:?}");
        }
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)),
        ] {
            assert!(!may_change_the_file(&kind), "{kind:?}");
        }
    }

    /// A write is read at its close: in between, the file may hold a valid part of it.
    #[test]
    fn a_write_is_under_way_until_its_close() {
        use notify::event::{CreateKind, DataChange, RenameMode};
        assert!(is_a_write_under_way(&EventKind::Modify(ModifyKind::Data(
            DataChange::Any
        ))));
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            EventKind::Create(CreateKind::File),
            EventKind::Any,
        ] {
            assert!(!is_a_write_under_way(&kind), "{kind:?}");
        }
    }

    #[test]
    fn only_events_about_a_watched_file_or_kubernetes_swap_count() {
        let names = [OsString::from("gw.toml"), OsString::from("agents.toml")];
        let about = |paths: &[&str]| {
            let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
            names_a_watched_file(&paths, &names)
        };
        assert!(about(&["/etc/gw/gw.toml"]));
        assert!(about(&["./agents.toml"]));
        // A rename over the file names both ends.
        assert!(about(&["/etc/gw/.gw.toml.swp", "/etc/gw/gw.toml"]));
        // Kubernetes' atomic writer: a new timestamped directory, `..data` swapped.
        assert!(about(&["/etc/gw/..2026_11_27_06_00_00.123456789"]));
        assert!(about(&["/etc/gw/..data_tmp", "/etc/gw/..data"]));
        // Anything else in the directory: a log written beside the config, an editor's file.
        assert!(!about(&["/etc/gw/gateway.log"]));
        assert!(!about(&["/etc/gw/gw.toml.bak"]));
        assert!(!about(&["/etc/gw/.gw.toml.swp"]));
        assert!(!about(&[]));
    }

    #[test]
    fn unchanged_text_is_not_a_reload_for_the_watcher() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_on(dir.path(), base());
        assert!(store.reload(Trigger::FileChange, true).is_none());
        assert_eq!(store.reload(Trigger::Sighup, false).unwrap().generation, 2);
    }

    /// An agents file read empty (a write caught half-way, a Secret key emptied by mistake) is
    /// refused: the agents in service keep it, rather than every agent getting 401.
    #[test]
    fn an_emptied_agents_file_is_refused_and_its_agents_kept() {
        use crate::config::file::{AgentFile, AgentsFile};
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("agents.toml");
        let one = AgentsFile {
            agents: vec![AgentFile::new("filed", testing::TOKEN)],
        };
        std::fs::write(&agents, toml::to_string(&one).unwrap()).unwrap();
        let mut f = base();
        f.auth.agents.clear();
        f.auth.agents_file = Some("agents.toml".into());
        let store = store_on(dir.path(), f);
        std::fs::write(&agents, "").unwrap();
        let report = store.reload(Trigger::FileChange, true).unwrap();
        assert_eq!(report.result, "failure");
        assert!(report.problems[0].message.contains("holds no agent"));
        assert_eq!(store.current().load().auth.agents.len(), 1);
    }
}
