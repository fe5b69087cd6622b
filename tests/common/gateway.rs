//! The gateway as tests run it, on a typed config by [`Gateway::builder`]: in this test
//! process by default ([`agent_gateway::app::serve::serve`] on port-0 listeners, with a
//! registry and a log of its own), or as the real `agent-gateway` binary where a process is
//! the point ([`GatewayBuilder::process`]: signals, upgrades, its stdout and stderr, its exit).
//! What a test reads back from it (log, metrics, access log) waits for the state it asserts:
//! the gateway answers first and records the exchange just after, so a read right after an
//! answer can come too early.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use agent_gateway::app::listeners::{ListenAddrs, Listeners};
use agent_gateway::app::logging::{self, LogFormat};
use agent_gateway::app::reload::ConfigStore;
use agent_gateway::app::serve::serve;
use agent_gateway::app::server::{self, BuildOptions};
use agent_gateway::config::{FileConfig, Snapshot};
use serde_json::Value;
use tokio::sync::oneshot;

use super::client::{request, Response};
use super::process::{kill, poll_until, signal, wait_until_or};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// A listener address that takes any free port: the gateway binds port 0, and the harness
/// reads back where it is.
pub const ANY_PORT: &str = "127.0.0.1:0";

/// The log filter of every test gateway, unless the test sets its own.
const LOG_LEVEL: &str = "debug";

/// The file in a gateway's directory that takes its stdout.
const STDOUT_FILE: &str = "stdout.txt";

/// A running gateway: stopped on drop.
pub struct Gateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// The config it runs on, as written to its file.
    pub config: FileConfig,
    /// Holds the log (and the config file, unless the test chose its path) until drop.
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    running: Running,
}

/// Where the gateway runs.
enum Running {
    /// On a runtime of its own, on a thread of this process; told to stop by the sender.
    InProcess {
        stop: Option<oneshot::Sender<()>>,
        thread: Option<JoinHandle<()>>,
    },
    Process(Child),
}

/// How a test gateway is run: the config, where its config file is, the log filter, and for
/// a process its command, arguments and environment. [`GatewayBuilder::start`] is the one
/// place a gateway is started.
pub struct GatewayBuilder {
    config: FileConfig,
    config_path: Option<PathBuf>,
    log_level: String,
    process: Option<ProcessOptions>,
}

/// What only a process has.
struct ProcessOptions {
    /// `run`, or `demo` (the gateway and the mock backend on `upstream.addresses[0]`).
    command: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// stderr is a pipe nobody reads (taken by [`Gateway::take_stderr`]), not the log file.
    stderr_unread: bool,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            command: "run",
            args: Vec::new(),
            env: Vec::new(),
            stderr_unread: false,
        }
    }
}

impl Gateway {
    /// A gateway on `config`; its listeners are `config.listen`'s ([`ANY_PORT`] for any).
    pub fn builder(config: FileConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            config_path: None,
            log_level: LOG_LEVEL.into(),
            process: None,
        }
    }

    /// The common case: a gateway on [`super::test_config`]`(upstreams)` as it is.
    pub fn start(upstreams: &[SocketAddr]) -> Gateway {
        Self::builder(super::test_config(upstreams)).start()
    }
}

impl GatewayBuilder {
    /// Runs the `agent-gateway run` binary rather than in this process: for tests of what only
    /// a process has (signals, the upgrade, stdout, stderr, the exit status).
    pub fn process(mut self) -> Self {
        self.process_options();
        self
    }

    fn process_options(&mut self) -> &mut ProcessOptions {
        self.process.get_or_insert_with(ProcessOptions::default)
    }

    /// Runs `agent-gateway demo`, a process: the mock v2 backend in the same process, on the
    /// config's first upstream address (which must be a port of its own: the demo's
    /// gateway forwards to the address configured).
    pub fn demo(mut self) -> Self {
        self.process_options().command = "demo";
        self
    }

    /// An extra argument after `run --config <path>` (a process).
    pub fn arg(mut self, arg: &str) -> Self {
        self.process_options().args.push(arg.into());
        self
    }

    /// An environment variable for the process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.process_options().env.push((key.into(), value.into()));
        self
    }

    /// Logs into a pipe that nobody reads until the test does (a process): a log sink that
    /// stalls once the pipe is full. `log()` stays empty.
    pub fn stderr_unread(mut self) -> Self {
        self.process_options().stderr_unread = true;
        self
    }

    /// The log filter (`RUST_LOG`'s grammar) instead of `debug`.
    pub fn log_level(mut self, filter: &str) -> Self {
        self.log_level = filter.into();
        self
    }

    /// Writes the config at `path` (a layout the harness does not make, such as a symlink
    /// into a Kubernetes ConfigMap volume: it is written through) instead of in a fresh
    /// directory.
    pub fn config_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_path = Some(path.into());
        self
    }

    /// Starts the gateway; returns once it listens.
    pub fn start(self) -> Gateway {
        let (dir, config_path) = self.write_config(&self.config);
        let log_path = dir.path().join("gateway.log");
        match &self.process {
            None => self.start_in_process(dir, config_path, log_path),
            Some(process) => {
                let child = self.spawn(process, &config_path, &log_path, &dir);
                let mut gw = Gateway {
                    proxy: loopback_any(),
                    admin: loopback_any(),
                    config: self.config.clone(),
                    dir,
                    config_path,
                    log_path,
                    running: Running::Process(child),
                };
                let at = gw.wait_listening();
                gw.proxy = at.proxy;
                gw.admin = at.admin.expect("the harness needs an admin listener");
                gw
            }
        }
    }

    /// Runs the gateway binary on a config it must refuse and returns how it exited.
    pub fn exit_status(self) -> ExitStatus {
        self.refusal().0
    }

    /// [`Self::exit_status`], and what the process wrote to stderr.
    pub fn refusal(mut self) -> (ExitStatus, String) {
        let (dir, config_path) = self.write_config(&self.config);
        let log_path = dir.path().join("gateway.log");
        let process = self.process.take().unwrap_or_default();
        let mut child = self.spawn(&process, &config_path, &log_path, &dir);
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let status = poll_until(
            "the gateway to refuse its config and exit",
            || child.try_wait().unwrap(),
            Option::is_some,
            |_| log(),
        );
        kill(&mut child);
        (status.unwrap(), log())
    }

    /// The gateway in this process: its listeners bound here (port 0 for [`ANY_PORT`]), the
    /// config store loaded from its file (so reloads read it), and [`serve`] on a runtime of
    /// its own whose threads log into `log_path` only.
    fn start_in_process(
        &self,
        dir: tempfile::TempDir,
        config_path: PathBuf,
        log_path: PathBuf,
    ) -> Gateway {
        let snapshot = Snapshot::load(&config_path).unwrap_or_else(|e| panic!("test config: {e}"));
        let addrs = ListenAddrs::configured(&snapshot.startup, None);
        let listeners = Listeners::bind(&addrs).unwrap();
        let at = listeners.local_addrs().unwrap();

        let filter = tracing_subscriber::EnvFilter::new(&self.log_level);
        let log = std::fs::File::create(&log_path).unwrap();
        let (dispatch, logs) = logging::subscriber(LogFormat::Json, filter, log);
        let registry = prometheus::Registry::new();
        let store = ConfigStore::new(snapshot, Some(config_path.clone()), &registry)
            .expect("a store for the test config");
        let options = BuildOptions {
            logs: Some(logs),
            ..BuildOptions::default()
        };
        let gateway = tracing::dispatcher::with_default(&dispatch, || {
            server::build(store, &registry, options)
        })
        .unwrap_or_else(|e| panic!("the test gateway does not build: {e}"));

        let (stop, stopped) = oneshot::channel::<()>();
        let threads = self.config.server.threads.unwrap_or(2);
        let thread = std::thread::spawn(move || {
            let _log = tracing::dispatcher::set_default(&dispatch);
            let for_threads = dispatch.clone();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .on_thread_start(move || {
                    // The guard is kept for the thread's life: every event on it goes to this
                    // gateway's log.
                    std::mem::forget(tracing::dispatcher::set_default(&for_threads));
                })
                .build()
                .unwrap();
            // Stopped at once, as a killed process is: no drain (the process tests have one),
            // and connections still open end with the runtime.
            runtime.block_on(async {
                tokio::select! {
                    () = serve(listeners, gateway, std::future::pending()) => {}
                    _ = stopped => {}
                }
            });
            // Its tasks, and the listeners they hold, are dropped before the thread ends, so a
            // restart on the same ports finds them free (`shutdown_background` returned first
            // and left a restart to race the close).
            runtime.shutdown_timeout(Duration::from_secs(5));
        });
        Gateway {
            proxy: at.proxy,
            admin: at.admin.expect("the harness needs an admin listener"),
            config: self.config.clone(),
            dir,
            config_path,
            log_path,
            running: Running::InProcess {
                stop: Some(stop),
                thread: Some(thread),
            },
        }
    }

    /// Writes `config` into a fresh directory, or at the path the test chose.
    fn write_config(&self, config: &FileConfig) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let config_path = self
            .config_path
            .clone()
            .unwrap_or_else(|| dir.path().join("gateway.toml"));
        std::fs::write(&config_path, config.to_toml()).unwrap();
        (dir, config_path)
    }

    /// `agent-gateway <command> --config <path> <args>`, stderr to `log_path` and stdout to a
    /// file in `dir`.
    fn spawn(
        &self,
        process: &ProcessOptions,
        config_path: &Path,
        log_path: &Path,
        dir: &tempfile::TempDir,
    ) -> Child {
        let log = std::fs::File::create(log_path).unwrap();
        let stderr = if process.stderr_unread {
            Stdio::piped()
        } else {
            log.into()
        };
        let stdout = std::fs::File::create(dir.path().join(STDOUT_FILE)).unwrap();
        Command::new(BIN)
            .arg(process.command)
            .arg("--config")
            .arg(config_path)
            .args(&process.args)
            .env("RUST_LOG", &self.log_level)
            .envs(process.env.iter().map(|(k, v)| (k, v)))
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap()
    }
}

fn loopback_any() -> SocketAddr {
    ANY_PORT.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// The process
// ---------------------------------------------------------------------------------------------

impl Gateway {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The process, for a gateway started with [`GatewayBuilder::process`].
    pub fn child(&mut self) -> &mut Child {
        match &mut self.running {
            Running::Process(child) => child,
            Running::InProcess { .. } => {
                panic!("an in-process gateway has no process: start it with .process()")
            }
        }
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        match &self.running {
            Running::Process(child) => child.id(),
            Running::InProcess { .. } => {
                panic!("an in-process gateway has no process: start it with .process()")
            }
        }
    }

    /// What the process has printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(STDOUT_FILE)).unwrap_or_default()
    }

    /// Sends SIGTERM to the process.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Polls `cond` until it holds; fails the test after [`super::PATIENCE`] with `what` and the
    /// gateway's log.
    pub fn wait_until(&self, what: &str, cond: impl FnMut() -> bool) {
        wait_until_or(what, cond, || format!("gateway log:\n{}", self.log()));
    }

    /// Waits for the process to exit; its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let log_path = self.log_path.clone();
        let child = self.child();
        let status = poll_until(
            "the gateway to exit",
            || child.try_wait().unwrap(),
            Option::is_some,
            |_| std::fs::read_to_string(log_path).unwrap_or_default(),
        );
        status.unwrap()
    }

    /// Where the process's listeners are, from its `listening` log line; fails the test, with
    /// the log, if it exits first.
    fn wait_listening(&mut self) -> ListenAddrs {
        let log_path = self.log_path.clone();
        let child = self.child();
        let mut stderr = child.stderr.take();
        let mut piped = Vec::new();
        let listening = poll_until(
            "the gateway to listen",
            || {
                if let Some(status) = child.try_wait().unwrap() {
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    let piped = String::from_utf8_lossy(&piped);
                    panic!("the gateway exited ({status}) before listening; log:\n{log}{piped}");
                }
                match &mut stderr {
                    // A pipe: read a line at a time up to its `listening` line, no further.
                    Some(pipe) => read_line(pipe, &mut piped),
                    None => piped = std::fs::read(&log_path).unwrap_or_default(),
                }
                listening_line(&String::from_utf8_lossy(&piped))
            },
            Option::is_some,
            |_| String::new(),
        );
        self.child().stderr = stderr;
        listening.unwrap()
    }

    /// The stderr pipe of a process started with [`GatewayBuilder::stderr_unread`].
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.child()
            .stderr
            .take()
            .expect("started with .stderr_unread()")
    }

    /// Stops it and starts it again on the same config and ports: its counters start again
    /// from zero.
    pub fn restart(mut self) -> Gateway {
        let mut config = self.config.clone();
        config.listen.proxy = self.proxy.to_string();
        config.listen.admin = Some(self.admin.to_string());
        self.stop();
        let mut builder = Gateway::builder(config);
        if matches!(self.running, Running::Process(_)) {
            builder = builder.process();
        }
        let mut gw = builder.start();
        // It runs on the ports it had; later configs of the test keep asking for any port.
        gw.config = self.config.clone();
        gw
    }

    /// A new process started with `--upgrade` on this one's config file, handed this one's
    /// listeners: once the new one waits on the upgrade socket, this one gets SIGQUIT, sends
    /// them and exits after its drain. Returned once the new process holds the listeners.
    pub fn hand_over(&self) -> Gateway {
        self.hand_over_with(|_| {})
    }

    /// [`Self::hand_over`], doing `meanwhile` to the new process while it waits on the
    /// upgrade socket, before this one gets SIGQUIT.
    pub fn hand_over_with(&self, meanwhile: impl FnOnce(&Gateway)) -> Gateway {
        let sock = PathBuf::from(&self.config.server.upgrade_sock);
        // The listeners are handed over under the ports they are bound to.
        let mut config = self.config.clone();
        config.listen.proxy = self.proxy.to_string();
        config.listen.admin = Some(self.admin.to_string());
        let builder = Gateway::builder(config.clone())
            .process()
            .arg("--upgrade")
            .config_path(self.config_path.clone());
        let (dir, config_path) = builder.write_config(&config);
        let log_path = dir.path().join("gateway.log");
        let child = builder.spawn(
            builder.process.as_ref().unwrap(),
            &config_path,
            &log_path,
            &dir,
        );
        let mut new = Gateway {
            proxy: self.proxy,
            admin: self.admin,
            config,
            dir,
            config_path,
            log_path,
            running: Running::Process(child),
        };
        wait_until_or(
            "the new process to wait on the upgrade socket",
            || sock.exists(),
            || format!("new process log:\n{}", new.log()),
        );
        meanwhile(&new);
        self.signal("QUIT");
        new.wait_listening();
        new
    }

    /// Stops the gateway at once: a process is killed; in-process, its runtime ends.
    fn stop(&mut self) {
        match &mut self.running {
            Running::Process(child) => kill(child),
            Running::InProcess { stop, thread } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }
}

/// Reads from `pipe` into `into` up to a newline (or its end).
fn read_line(pipe: &mut std::process::ChildStderr, into: &mut Vec<u8>) {
    use std::io::Read;
    let mut byte = [0u8; 1];
    while let Ok(1) = pipe.read(&mut byte) {
        into.push(byte[0]);
        if byte[0] == b'\n' {
            return;
        }
    }
}

/// The addresses of the gateway's `listening` log line (JSON), if it has one.
pub fn listening_line(log: &str) -> Option<ListenAddrs> {
    log.lines().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v["message"] != "listening" {
            return None;
        }
        let addr = |field: &str| v[field].as_str().map(|a| a.parse().unwrap());
        Some(ListenAddrs {
            proxy: addr("proxy")?,
            admin: addr("admin"),
            mock_backend: addr("mock_backend"),
        })
    })
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// Its config file
// ---------------------------------------------------------------------------------------------

impl Gateway {
    /// Writes `cfg` over the config file in place (truncated, then written), as an editor
    /// does. The watcher may see the file in between: tests that count reloads use
    /// [`Self::replace_config`].
    pub fn write_config(&self, cfg: &FileConfig) {
        std::fs::write(&self.config_path, cfg.to_toml()).unwrap();
    }

    /// Puts `cfg` in place of the config file in one step: written beside it, renamed over it.
    pub fn replace_config(&self, cfg: &FileConfig) {
        replace_file(&self.config_path, &cfg.to_toml());
    }

    /// Writes `cfg` over the config file and asks for a reload (`POST /-/reload`), which must
    /// succeed; its report.
    pub fn reload(&self, cfg: &FileConfig) -> serde_json::Value {
        self.write_config(cfg);
        let answer = request(self.admin, "POST", "/-/reload", &[], b"");
        assert_eq!(answer.status, 200, "reload refused: {}", answer.text());
        answer.json()
    }
}

/// Puts `contents` in place of `path` in one step: written beside it, renamed over it.
pub fn replace_file(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Metrics and the access log, read once what they record is in
// ---------------------------------------------------------------------------------------------

impl Gateway {
    /// `GET /metrics`, as it is now.
    pub fn scrape(&self) -> String {
        let resp = request(self.admin, "GET", "/metrics", &[], b"");
        assert_eq!(resp.status, 200, "/metrics: {}", resp.text());
        resp.text()
    }

    /// `/metrics` once no request is in flight, so every exchange answered so far is counted.
    pub fn settled_scrape(&self) -> String {
        let mut text = String::new();
        self.wait_until("no request in flight", || {
            text = self.scrape();
            metric_value(&text, "agent_gateway_in_flight_requests") == Some(0.0)
        });
        text
    }

    /// The value of one exact series (`name{labels}`, labels in exposition order), or 0 when
    /// it has none, once every request answered so far is counted.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.settled_scrape(), series).unwrap_or(0.0)
    }

    /// Waits until `series` is `want` (a count that follows answers, or an export that
    /// follows a span); fails with the last value and the log.
    pub fn wait_for_metric(&self, series: &str, want: f64) {
        self.poll_metric(&format!("{series} == {want}"), series, |v| v == want);
    }

    /// Waits until `series` is at least `want`; its value then.
    pub fn wait_for_metric_at_least(&self, series: &str, want: f64) -> f64 {
        self.poll_metric(&format!("{series} >= {want}"), series, |v| v >= want)
    }

    fn poll_metric(&self, what: &str, series: &str, done: impl Fn(f64) -> bool) -> f64 {
        poll_until(
            what,
            || metric_value(&self.scrape(), series).unwrap_or(0.0),
            |v| done(*v),
            |v| format!("last value {v}; gateway log:\n{}", self.log()),
        )
    }

    /// The access-log lines written so far (target `agent_gateway::access`), parsed.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "agent_gateway::access")
            .collect()
    }

    /// The access log once it has `n` lines (more is a failure too).
    pub fn wait_for_access_log(&self, n: usize) -> Vec<serde_json::Value> {
        self.wait_until(&format!("{n} access-log lines"), || {
            self.access_log().len() >= n
        });
        let lines = self.access_log();
        assert_eq!(lines.len(), n, "access log: {lines:#?}");
        lines
    }

    /// The access-log line of the request `request_id`, once written.
    pub fn access_line(&self, request_id: &str) -> serde_json::Value {
        let find = || {
            self.access_log()
                .into_iter()
                .find(|l| l["request_id"] == request_id)
        };
        self.wait_until(&format!("the access-log line of {request_id}"), || {
            find().is_some()
        });
        find().unwrap()
    }

    /// `GET /v1-usage` once every request answered so far is counted.
    pub fn v1_usage(&self) -> serde_json::Value {
        self.settled_scrape();
        let resp: Response = request(self.admin, "GET", "/v1-usage", &[], b"");
        assert_eq!(resp.status, 200, "/v1-usage: {}", resp.text());
        resp.json()
    }
}

/// Each access-log line's `status`, `client_aborted` and `closed_by_gateway` (null when
/// absent): what the client was told, and who ended the request.
pub fn who_ended(logged: &[Value]) -> Vec<(Value, Value, Value)> {
    let field = |line: &Value, name: &str| line[name].clone();
    logged
        .iter()
        .map(|l| {
            (
                field(l, "status"),
                field(l, "client_aborted"),
                field(l, "closed_by_gateway"),
            )
        })
        .collect()
}

/// The value of the sample `series` (exactly as printed, labels in exposition order).
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// Runs `agent-gateway <args>`, one of its commands that is not a server, to the end.
pub fn cli<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}
