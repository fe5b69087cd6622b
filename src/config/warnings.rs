//! What a config allows that works but should not, said as warnings (`run` at start and
//! at each reload that applies a config, `check-config`), never as refusals: no agent at all,
//! PROXY protocol headers believed from any host, and a board that cannot ask its
//! Prometheus. Here, beside the refusals, so that the command line and a reload say the
//! same. A published token is refused, not warned of ([`super::published`]).

use super::Snapshot;
use crate::client::Client;

/// What a config allows that is worth a warning, not a refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigWarning {
    /// No agent is configured: every call is refused with 401.
    NoAgent,
    /// The board's Prometheus client cannot be made as configured (a credential or CA file
    /// missing, empty or malformed): the board shows this gateway's own counts meanwhile.
    PrometheusClient(String),
    /// `listen.proxy_protocol` without `listen.trusted_proxies`: any host that reaches the
    /// listener names its own client address, for the log and for the guess throttle.
    ProxyHeadersFromAnyone,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigWarning::PrometheusClient(problem) => write!(
                f,
                "the retirement board cannot ask retirement.prometheus_url ({problem}): it shows \
                 this gateway's own counts until it can (the files are read at each use)"
            ),
            ConfigWarning::NoAgent => {
                f.write_str("no agent is configured: every call is refused with 401")
            }
            ConfigWarning::ProxyHeadersFromAnyone => f.write_str(
                "listen.proxy_protocol is on and listen.trusted_proxies is empty: any host that \
                 reaches the proxy listener may send a PROXY header naming any client address \
                 (the access log's, and the one auth.max_failures_per_minute counts). Set \
                 listen.trusted_proxies to the balancers' addresses",
            ),
        }
    }
}

/// The warnings about `snapshot`: its agents', then its board's, then its edge's.
pub fn snapshot_warnings(snapshot: &Snapshot) -> Vec<ConfigWarning> {
    let mut warnings = Vec::new();
    if snapshot.auth.agents.is_empty() {
        warnings.push(ConfigWarning::NoAgent);
    }
    let retirement = &snapshot.retirement;
    if let Some(url) = &retirement.prometheus_url {
        if let Err(e) = Client::new(url, &retirement.prometheus_client) {
            warnings.push(ConfigWarning::PrometheusClient(e.to_string()));
        }
    }
    let edge = &snapshot.edge;
    if edge.proxy_protocol && edge.trusted_proxies.is_empty() {
        warnings.push(ConfigWarning::ProxyHeadersFromAnyone);
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_agent_at_all_is_said() {
        use crate::config::FileConfig;
        let backend = "127.0.0.1:9000".parse().unwrap();
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
        assert!(!snapshot_warnings(&cfg.clone().snapshot()).contains(&ConfigWarning::NoAgent));
        cfg.auth.agents.clear();
        assert_eq!(snapshot_warnings(&cfg.snapshot()), [ConfigWarning::NoAgent]);
    }

    #[test]
    fn proxy_headers_believed_from_any_host_are_said() {
        use crate::config::FileConfig;
        let config = |proxy_protocol, trusted: &[&str]| {
            let backend = "127.0.0.1:9000".parse().unwrap();
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.listen.proxy_protocol = proxy_protocol;
            cfg.listen.trusted_proxies = trusted.iter().map(ToString::to_string).collect();
            cfg.snapshot()
        };
        let said = |snapshot: &Snapshot| {
            snapshot_warnings(snapshot).contains(&ConfigWarning::ProxyHeadersFromAnyone)
        };
        assert!(said(&config(true, &[])));
        assert!(!said(&config(true, &["10.0.0.0/8"])));
        assert!(!said(&config(false, &[])));
    }

    #[test]
    fn a_prometheus_credential_that_cannot_be_read_is_said() {
        use crate::config::FileConfig;
        let dir = tempfile::tempdir().unwrap();
        let config = |token_file: &std::path::Path| {
            let backend = "127.0.0.1:9000".parse().unwrap();
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.retirement.prometheus_url = Some("http://prometheus:9090".into());
            cfg.retirement.prometheus_token_file = Some(token_file.display().to_string());
            cfg.snapshot()
        };
        let said = |snapshot: &Snapshot| {
            snapshot_warnings(snapshot)
                .into_iter()
                .filter(|w| matches!(w, ConfigWarning::PrometheusClient(_)))
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
        };
        let missing = dir.path().join("token");
        let warned = said(&config(&missing));
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].contains(&missing.display().to_string()),
            "{}",
            warned[0]
        );
        std::fs::write(&missing, "t0ken\n").unwrap();
        assert!(said(&config(&missing)).is_empty());
    }
}
