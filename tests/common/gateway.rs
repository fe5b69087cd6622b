//! The real `agent-gateway` binary as tests run it: spawned on a typed config by
//! [`Gateway::builder`], its listeners on ports the harness chooses, and what a test reads back
//! from it (log, metrics, access log), each read waiting for the state it asserts: the
//! gateway answers first and records the exchange (metrics, access log, usage, span) just
//! after, so a read right after an answer can come too early.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use agent_gateway::config::FileConfig;

use super::client::{request, Response};
use super::ports::{free_port, loopback};
use super::process::{kill, poll_until, signal, wait_listening, wait_until_or, Listening};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// A listener address that asks the harness for a port: [`GatewayBuilder::start`] puts a free
/// one in its place, and another if a process takes it before the gateway binds it. Any other
/// address is used as given.
pub const ANY_PORT: &str = "127.0.0.1:0";

/// What pingora logs while another process holds a port it is to listen on.
pub(super) const PORT_IN_USE: &str = "is in use, will try again";

/// How many times a gateway whose port was taken is started again on other ports.
const START_ATTEMPTS: usize = 5;

/// The file in a gateway's directory that takes its stdout.
const STDOUT_FILE: &str = "stdout.txt";

/// A running gateway process. Killed on drop.
pub struct Gateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// The config it runs on, with the ports the harness chose.
    pub config: FileConfig,
    pub child: Child,
    /// Holds the log (and the config file, unless the test chose its path) until drop.
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    /// What it printed on stdout (logs go to stderr, `log_path`).
    pub stdout_path: PathBuf,
}

/// How a test gateway is run: the config, the process's arguments and environment, and where
/// its config file is. [`GatewayBuilder::start`] is the one place a gateway is spawned.
pub struct GatewayBuilder {
    config: FileConfig,
    /// `run`, or `demo` (the gateway and the mock backend on `upstream.addresses[0]`).
    command: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config_path: Option<PathBuf>,
    /// stderr is a pipe nobody reads (in `child.stderr`), rather than the log file.
    stderr_unread: bool,
}

impl Gateway {
    /// A gateway on `config`; its listeners are `config.listen`'s ([`ANY_PORT`] for any).
    pub fn builder(config: FileConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            command: "run",
            args: Vec::new(),
            env: Vec::new(),
            config_path: None,
            stderr_unread: false,
        }
    }

    /// The common case: a gateway on [`super::test_config`]`(upstreams)` as it is.
    pub fn start(upstreams: &[SocketAddr]) -> Gateway {
        Self::builder(super::test_config(upstreams)).start()
    }
}

impl GatewayBuilder {
    /// Runs `agent-gateway demo` instead of `run`: the mock v2 backend in the same process, on
    /// the config's first upstream address ([`ANY_PORT`] for any).
    pub fn demo(mut self) -> Self {
        self.command = "demo";
        self
    }

    /// An extra argument after `run --config <path>`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    /// An environment variable for the process; wins over the harness's `RUST_LOG=debug`.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Writes the config at `path` (a layout the harness does not make, such as a symlink
    /// into a Kubernetes ConfigMap volume: it is written through) instead of in a fresh
    /// directory.
    pub fn config_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_path = Some(path.into());
        self
    }

    /// Logs into a pipe (`child.stderr`) that nobody reads until the test does: a log sink
    /// that stalls once the pipe is full. `log()` stays empty.
    pub fn stderr_unread(mut self) -> Self {
        self.stderr_unread = true;
        self
    }

    /// Spawns the gateway and waits until it listens on its ports itself; starts it again on
    /// other ports if a port the harness chose was taken meanwhile.
    pub fn start(self) -> Gateway {
        for _ in 0..START_ATTEMPTS {
            let config = self.with_ports_chosen();
            let (dir, config_path, mut child, log_path) = self.spawn(&config);
            let ports = self.ports(&config);
            let choosable = self.ports(&self.config).contains(&0);
            let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
            let in_use = choosable.then_some(PORT_IN_USE);
            match wait_listening(&mut child, &ports, "the gateway", in_use, log) {
                Listening::Yes => {
                    let stdout_path = dir.path().join(STDOUT_FILE);
                    return Gateway {
                        proxy: address(&config.listen.proxy),
                        admin: address(config.listen.admin.as_deref().unwrap()),
                        config,
                        child,
                        dir,
                        config_path,
                        log_path,
                        stdout_path,
                    };
                }
                Listening::PortTaken => kill(&mut child),
            }
        }
        panic!("{START_ATTEMPTS} sets of ports were all taken before the gateway bound them");
    }

    /// Runs the gateway on a config it must refuse and returns how it exited.
    pub fn exit_status(self) -> ExitStatus {
        let (_dir, _, mut child, log_path) = self.spawn(&self.config);
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let status = poll_until(
            "the gateway to refuse its config and exit",
            || child.try_wait().unwrap(),
            Option::is_some,
            |_| log(),
        );
        kill(&mut child);
        status.unwrap()
    }

    /// The config with a free port in place of each [`ANY_PORT`].
    fn with_ports_chosen(&self) -> FileConfig {
        let mut config = self.config.clone();
        let choose = |addr: &mut String| {
            if addr == ANY_PORT {
                *addr = loopback(free_port()).to_string();
            }
        };
        choose(&mut config.listen.proxy);
        if let Some(admin) = &mut config.listen.admin {
            choose(admin);
        }
        if self.command == "demo" {
            choose(&mut config.upstream.addresses[0]);
        }
        config
    }

    /// The ports the process must listen on: the proxy and admin listeners, and the demo's
    /// mock backend.
    fn ports(&self, config: &FileConfig) -> Vec<u16> {
        let admin = config
            .listen
            .admin
            .as_deref()
            .expect("the harness needs an admin listener (test_config sets one)");
        let mut ports = vec![address(&config.listen.proxy).port(), address(admin).port()];
        if self.command == "demo" {
            ports.push(address(&config.upstream.addresses[0]).port());
        }
        ports
    }

    /// `agent-gateway <command> --config <path> <args>` on `config`, stderr to a log file and
    /// stdout to another in a fresh directory.
    fn spawn(&self, config: &FileConfig) -> (tempfile::TempDir, PathBuf, Child, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let config_path = self
            .config_path
            .clone()
            .unwrap_or_else(|| dir.path().join("gateway.toml"));
        std::fs::write(&config_path, config.to_toml()).unwrap();
        let log_path = dir.path().join("gateway.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let stderr = if self.stderr_unread {
            Stdio::piped()
        } else {
            log.into()
        };
        let stdout = std::fs::File::create(dir.path().join(STDOUT_FILE)).unwrap();
        let child = Command::new(BIN)
            .arg(self.command)
            .arg("--config")
            .arg(&config_path)
            .args(&self.args)
            .env("RUST_LOG", "debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap();
        (dir, config_path, child, log_path)
    }
}

/// A listener address of a config, as the harness connects to it.
fn address(addr: &str) -> SocketAddr {
    addr.parse()
        .unwrap_or_else(|e| panic!("{addr:?} is not an address to connect to: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The process
// ---------------------------------------------------------------------------------------------

impl Gateway {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What it has printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// Polls `cond` until it holds; fails the test after [`super::PATIENCE`] with `what` and the
    /// gateway's log.
    pub fn wait_until(&self, what: &str, cond: impl FnMut() -> bool) {
        wait_until_or(what, cond, || format!("gateway log:\n{}", self.log()));
    }

    /// Waits for the process to exit; its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let log_path = self.log_path.clone();
        let status = poll_until(
            "the gateway to exit",
            || self.child.try_wait().unwrap(),
            Option::is_some,
            |_| std::fs::read_to_string(log_path).unwrap_or_default(),
        );
        status.unwrap()
    }

    /// Stops it and starts it again on the same config and ports: its counters start again
    /// from zero.
    pub fn restart(mut self) -> Gateway {
        kill(&mut self.child);
        Gateway::builder(self.config.clone()).start()
    }

    /// A new process started with `--upgrade` on this one's config file, handed this one's
    /// listeners: once the new one waits on the upgrade socket, this one gets SIGQUIT, sends
    /// them and exits after its drain. Returned once the new process holds the listeners.
    pub fn hand_over(&self) -> Gateway {
        let sock = PathBuf::from(&self.config.server.upgrade_sock);
        let mut builder = Gateway::builder(self.config.clone()).arg("--upgrade");
        builder.config_path = Some(self.config_path.clone());
        let (dir, config_path, mut child, log_path) = builder.spawn(&self.config);
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        wait_until_or(
            "the new process to wait on the upgrade socket",
            || sock.exists(),
            || format!("new process log:\n{}", log()),
        );
        self.signal("QUIT");
        let ports = builder.ports(&self.config);
        wait_listening(&mut child, &ports, "the upgraded gateway", None, log);
        Gateway {
            proxy: self.proxy,
            admin: self.admin,
            config: self.config.clone(),
            child,
            stdout_path: dir.path().join(STDOUT_FILE),
            dir,
            config_path,
            log_path,
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

// ---------------------------------------------------------------------------------------------
// Its config file
// ---------------------------------------------------------------------------------------------

impl Gateway {
    /// `cfg` on this gateway's listeners where it asks for [`ANY_PORT`]: a changed copy of a
    /// test's config stays on the ports the running gateway got.
    pub fn on_my_ports(&self, cfg: &FileConfig) -> FileConfig {
        let mut cfg = cfg.clone();
        if cfg.listen.proxy == ANY_PORT {
            cfg.listen.proxy = self.config.listen.proxy.clone();
        }
        if cfg.listen.admin.as_deref() == Some(ANY_PORT) {
            cfg.listen.admin = self.config.listen.admin.clone();
        }
        cfg
    }

    /// Writes `cfg` over the config file in place (truncated, then written), as an editor
    /// does. The watcher may see the file in between: tests that count reloads use
    /// [`Self::replace_config`].
    pub fn write_config(&self, cfg: &FileConfig) {
        std::fs::write(&self.config_path, self.on_my_ports(cfg).to_toml()).unwrap();
    }

    /// Puts `cfg` in place of the config file in one step: written beside it, renamed over it.
    pub fn replace_config(&self, cfg: &FileConfig) {
        replace_file(&self.config_path, &self.on_my_ports(cfg).to_toml());
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
