//! `[listen]` and `[server]`: the settings that take effect only at process start (listeners,
//! runtimes). A reload keeps the running ones and names those it could not apply.

use std::net::SocketAddr;

use super::file::{ListenFile, ServerFile};
use super::problems::Problems;

/// Settings that only take effect at process start (listeners, runtimes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupConfig {
    pub proxy_listen: SocketAddr,
    /// The proxy listener speaks TLS (`listen.tls_cert`); the certificate it serves follows
    /// reloads ([`super::ServerCert`]).
    pub proxy_tls: bool,
    /// HTTP/2 for clients that ask for it (ALPN `h2`, or the h2c preface).
    pub http2: bool,
    pub admin_listen: Option<SocketAddr>,
    pub threads: usize,
    pub grace_period_seconds: u64,
    pub work_stealing: bool,
    pub upstream_keepalive_pool_size: usize,
    pub watch_config: bool,
    pub upgrade_sock: String,
    /// `/readyz` needs an upstream address that passed its last health check.
    pub readiness_requires_upstream: bool,
}

/// The CPUs this process may run on (its affinity mask and cgroup CPU quota): `server.threads`'
/// default, like nginx's `worker_processes auto`.
pub fn cpus_available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if s.is_empty() {
        return Err("required: the ip:port to listen on".into());
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not an ip:port address"))
}

/// Validates `[listen]` and `[server]`.
pub(super) fn startup(
    listen: &ListenFile,
    server: &ServerFile,
    p: &mut Problems,
) -> Option<StartupConfig> {
    let proxy_listen = p.check("listen.proxy", parse_listen(&listen.proxy));
    let admin_listen = match &listen.admin {
        None => Some(None),
        Some(a) => p.check("listen.admin", parse_listen(a)).map(Some),
    };
    let proxy_tls = listen.tls_cert.is_some();
    if let Some(threads) = server.threads {
        p.positive("server.threads", threads as u64);
    }
    p.positive(
        "server.upstream_keepalive_pool_size",
        server.upstream_keepalive_pool_size as u64,
    );
    Some(StartupConfig {
        proxy_listen: proxy_listen?,
        proxy_tls,
        http2: listen.http2,
        admin_listen: admin_listen?,
        threads: server.threads.unwrap_or_else(cpus_available),
        grace_period_seconds: server.grace_period_seconds,
        work_stealing: server.work_stealing,
        upstream_keepalive_pool_size: server.upstream_keepalive_pool_size,
        watch_config: server.watch_config,
        upgrade_sock: server.upgrade_sock.clone(),
        readiness_requires_upstream: server.readiness_requires_upstream,
    })
}
