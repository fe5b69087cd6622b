//! A real `redis-server` (Debian's package; `.ci/run` installs it) on a free loopback port,
//! started by the test, killed on drop; it can be killed, frozen and started again on the same
//! port. Without `redis-server` on PATH the tests that use it fail, never pass silently.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_gateway::config::file::RateLimitFile;
use agent_gateway::config::{FileConfig, OnRedisError, RateLimitBackend};

use super::{free_port, signal, wait_until};

/// A `redis-server` process and the port it owns.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Extra arguments (TLS, a password) it is started with each time.
    args: Vec<String>,
    /// The URL tests use to look inside it, on the plain port (`redis://[:password@]127.0.0.1:port/0`).
    inspect_url: String,
}

impl RedisServer {
    /// A plain server: no password, no persistence.
    pub fn start() -> RedisServer {
        Self::with_args(Vec::new(), None)
    }

    /// A server started with `args` after the harness's own (a TLS port beside the plain
    /// one, ...), and `requirepass password` when given.
    pub fn with_args(mut args: Vec<String>, password: Option<&str>) -> RedisServer {
        let port = free_port();
        let auth = match password {
            Some(pw) => {
                args.extend(["--requirepass".to_string(), pw.to_string()]);
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
        let mut server = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            args,
            inspect_url: format!("redis://{auth}127.0.0.1:{port}/0"),
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:port/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn spawn(&mut self) {
        let bin = which("redis-server");
        let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let url = self.inspect_url.clone();
        wait_until(20, "redis-server to answer PING", || {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
    }

    /// SIGKILL: gone at once, its state lost, its port closed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty, as after a crash without persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
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
        redis::Client::open(self.inspect_url.as_str())
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

/// The full path of `name` on PATH; fails the test when it is missing.
pub fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH (Debian: redis-server for redis-server, kubectl 1.21 \
                 or later for kubectl, prometheus for promtool; .ci/run installs the first and \
                 the last)."
            )
        })
}

/// `cfg` with its limits kept in the Redis at `url`, `on_redis_error` and `timeout_ms` as
/// given, and keys under `prefix`.
pub fn use_redis(
    cfg: &mut FileConfig,
    url: &str,
    on_error: OnRedisError,
    timeout_ms: u64,
    prefix: &str,
) {
    cfg.rate_limit = RateLimitFile {
        backend: RateLimitBackend::Redis,
        redis_url: Some(url.into()),
        on_redis_error: on_error,
        timeout_ms,
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
