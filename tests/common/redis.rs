//! A real `redis-server` (Debian's package, which `cargo xtask deps test` installs) on free
//! loopback ports, started by the test, killed on drop; it can be killed, frozen and started
//! again on the same ports. Without `redis-server` on PATH the tests that use it fail, never
//! pass silently.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_gateway::config::file::RateLimitFile;
use agent_gateway::config::{FileConfig, OnRedisError, RateLimitBackend};

use super::pki::TestPki;
use super::ports::free_port;
use super::process::{kill, signal, wait_listening, wait_until_or, which, Listening};

/// What redis-server says when a port it is to listen on is taken.
const PORT_IN_USE: &str = "address already in use";

/// A `redis-server` process and the ports it owns.
pub struct RedisServer {
    pub port: u16,
    /// The TLS port, for a server started by [`RedisServer::with_tls`].
    pub tls_port: Option<u16>,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// The TLS files and password it is started with each time.
    tls: Option<(String, String, String)>,
    password: Option<String>,
    /// A command that starts redis-server itself, given its arguments (a manifest's).
    launcher: Option<Vec<String>>,
}

impl RedisServer {
    /// A plain server: no password, no persistence.
    pub fn start() -> RedisServer {
        Self::spawned(None, None, None)
    }

    /// A server with a TLS port beside the plain one, its certificate `pki`'s, and
    /// `requirepass password`.
    pub fn with_tls(pki: &TestPki, password: &str) -> RedisServer {
        let tls = (pki.cert.clone(), pki.key.clone(), pki.ca.clone());
        Self::spawned(Some(tls), Some(password.into()), None)
    }

    /// A plain server with `requirepass password`.
    pub fn with_password(password: &str) -> RedisServer {
        Self::spawned(None, Some(password.into()), None)
    }

    /// A server started by `launcher` (a program and its first arguments, which end by running
    /// `redis-server` with the arguments that follow them), which sets `password` itself.
    pub fn launched_by(launcher: Vec<String>, password: &str) -> RedisServer {
        Self::spawned(None, Some(password.into()), Some(launcher))
    }

    fn spawned(
        tls: Option<(String, String, String)>,
        password: Option<String>,
        launcher: Option<Vec<String>>,
    ) -> RedisServer {
        let mut server = RedisServer {
            port: 0,
            tls_port: None,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            tls,
            password,
            launcher,
        };
        loop {
            server.port = free_port();
            server.tls_port = server.tls.is_some().then(free_port);
            if server.spawn(Some(PORT_IN_USE)) == Listening::Yes {
                return server;
            }
            server.kill();
        }
    }

    /// `redis://127.0.0.1:port/0`, without the password.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The URL tests use to look inside it, on the plain port, with the password.
    fn inspect_url(&self) -> String {
        let auth = match &self.password {
            Some(pw) => {
                let encoded: String = pw
                    .bytes()
                    .map(|b| match b {
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
                        _ => format!("%{b:02X}"),
                    })
                    .collect();
                format!(":{encoded}@")
            }
            None => String::new(),
        };
        format!("redis://{auth}127.0.0.1:{}/0", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Starts it on its ports; waits until it listens on them and answers PING.
    fn spawn(&mut self, in_use: Option<&str>) -> Listening {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
        let mut cmd = match &self.launcher {
            Some(launcher) => {
                let mut cmd = Command::new(&launcher[0]);
                cmd.args(&launcher[1..]);
                cmd
            }
            None => Command::new(which("redis-server")),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(self.dir.path());
        if let (Some((cert, key, ca)), Some(port)) = (&self.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(port.to_string())
                .args(["--tls-cert-file", cert, "--tls-key-file", key])
                .args(["--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]);
        }
        if let (Some(pw), None) = (&self.password, &self.launcher) {
            cmd.args(["--requirepass", pw]);
        }
        let mut child = cmd.stdout(log).stderr(Stdio::null()).spawn().unwrap();
        let ports: Vec<u16> = [Some(self.port), self.tls_port]
            .into_iter()
            .flatten()
            .collect();
        let listening = wait_listening(&mut child, &ports, "redis-server", in_use, || self.log());
        self.child = Some(child);
        if listening == Listening::Yes {
            let url = self.inspect_url();
            wait_until_or(
                "redis-server to answer PING",
                || {
                    redis::Client::open(url.as_str())
                        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                        .is_ok()
                },
                || self.log(),
            );
        }
        listening
    }

    /// SIGKILL: gone at once, its state lost, its ports closed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child);
        }
    }

    /// Starts it again on the same ports (empty, as after a crash without persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(None);
    }

    /// SIGSTOP: its connections stay open and it answers nothing.
    pub fn freeze(&self) {
        signal(self.child.as_ref().unwrap().id(), "STOP");
    }

    /// SIGCONT after [`Self::freeze`].
    pub fn thaw(&self) {
        signal(self.child.as_ref().unwrap().id(), "CONT");
    }

    /// A connection for looking at what the gateway stored.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.inspect_url().as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Keys matching `pattern`, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.connection())
            .unwrap();
        keys.sort();
        keys
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How long the gateway waits for Redis in tests: far past any answer of a live Redis on a
/// busy machine, so only a Redis that is down or frozen makes `on_redis_error` apply.
pub const REDIS_TIMEOUT_MS: u64 = 2000;

/// `cfg` with its limits kept in the Redis at `url`, `on_redis_error` as given, keys under
/// `prefix`, and [`REDIS_TIMEOUT_MS`].
pub fn use_redis(cfg: &mut FileConfig, url: &str, on_error: OnRedisError, prefix: &str) {
    cfg.rate_limit = RateLimitFile {
        backend: RateLimitBackend::Redis,
        redis_url: Some(url.into()),
        on_redis_error: on_error,
        timeout_ms: REDIS_TIMEOUT_MS,
        key_prefix: prefix.into(),
        ..RateLimitFile::default()
    };
}

impl RedisServer {
    /// How many `EVALSHA` calls it has served (`INFO commandstats`): one per decision.
    pub fn evalsha_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Clients connected now, the one asking excluded.
    pub fn other_clients(&self) -> usize {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.connection())
            .unwrap();
        list.lines().count() - 1
    }
}
