//! `[upstream]`: the backend's targets (IP addresses, or names the proxy looks up), how each
//! address is reached (TLS, timeouts), how names are looked up again, the connection budget
//! and passive ejection. Validation looks nothing up: a name's addresses are the data plane's
//! to find and follow (`crate::proxy::backends`), so a config reads the same wherever it is
//! checked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use pingora::protocols::tls::CaType;
use pingora::upstreams::peer::HttpPeer;

use sha2::{Digest, Sha256};

use super::file::UpstreamFile;
use super::files::{pem_certificates, Files};
use super::problems::Problems;

/// The port asked when a resolver is written without one.
const DNS_PORT: u16 = 53;

/// The backend: its targets, and how their addresses are reached and followed.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// In the order of `upstream.addresses`: the order of the rotation.
    pub targets: Vec<Target>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    pub health_check_interval: Duration,
    pub health_check_path: Option<String>,
    pub dns: DnsConfig,
    pub budget: BudgetConfig,
    pub ejection: EjectionConfig,
    tls: Option<TlsTo>,
}

/// How names are looked up and followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// `upstream.dns_min_ttl_ms` and `upstream.dns_max_ttl_ms`: a TTL is clamped between them.
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// `upstream.resolvers`; empty: the system's (`/etc/resolv.conf`).
    pub resolvers: Vec<SocketAddr>,
    pub allow_unresolved_at_start: bool,
}

/// The connection budget of each address, and the queue of requests that wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    /// `None`: unlimited, and nothing ever waits.
    pub max_connections_per_address: Option<usize>,
    pub max_pending: usize,
    pub pending_timeout: Duration,
}

/// Passive ejection: consecutive failures that take an address out of the rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectionConfig {
    /// 0: never.
    pub after_failures: u32,
    /// The first ejection's length; each repeat doubles it, up to [`EjectionConfig::cap`].
    pub base: Duration,
}

impl EjectionConfig {
    /// The longest an ejection lasts: five minutes (Envoy's default `max_ejection_time`), or
    /// the first ejection's length when that is longer.
    pub fn cap(&self) -> Duration {
        self.base.max(Duration::from_secs(300))
    }
}

/// TLS to the backend, as written.
#[derive(Debug, Clone)]
struct TlsTo {
    verify: bool,
    ca: Option<TrustedCa>,
}

/// `upstream.tls_ca_file`'s certificates, and a key of what they are.
#[derive(Debug, Clone)]
struct TrustedCa {
    certs: Arc<CaType>,
    /// Equal for equal certificates, whichever reload read them: the peers' `group_key`.
    key: u64,
}

/// The host of one `upstream.addresses` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Ip(IpAddr),
    /// Looked up by the proxy: each A/AAAA record is an address.
    Name(String),
}

/// One entry of `upstream.addresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
    /// The name sent and verified over TLS: `upstream.tls_sni`, else the host as written.
    pub sni: String,
}

impl Target {
    /// The address, when the host is one (no lookup needed).
    pub fn address(&self) -> Option<SocketAddr> {
        match self.host {
            Host::Ip(ip) => Some(SocketAddr::new(ip, self.port)),
            Host::Name(_) => None,
        }
    }
}

impl UpstreamConfig {
    /// How `addr`, an address of `target`, is reached: its TLS settings, as pingora connects.
    pub fn peer(&self, target: &Target, addr: SocketAddr) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, self.tls.is_some(), target.sni.clone());
        // No `connection_timeout`: the gateway limits a connect itself on the runtime's timer
        // (`proxy::connect`), with the `connect_timeout` of the request's snapshot. No
        // `idle_timeout`: the gateway's own pool reads it from the snapshot.
        if let Some(tls) = &self.tls {
            peer.options.verify_cert = tls.verify;
            peer.options.verify_hostname = tls.verify;
            if let Some(ca) = &tls.ca {
                peer.options.ca = Some(ca.certs.clone());
                // In pingora's reuse hash, which tells an address that stays through a reload
                // (its state and pooled connections kept) from one reached anew: a changed CA
                // makes new peers, whose connections are verified against it.
                peer.group_key = ca.key;
            }
        }
        peer
    }

    /// The names among the targets, each once, in the order written.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for t in &self.targets {
            if let Host::Name(name) = &t.host {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        names
    }
}

/// `host:port` read into a target: an IP address (IPv6 in brackets) or a DNS name.
fn target(written: &str, sni: Option<&str>) -> Result<Target, String> {
    let bad = || format!("{written:?} is not a host:port");
    let (host, port) = written.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => Host::Ip(IpAddr::V6(v6.parse().map_err(|_| bad())?)),
        None => match host.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => Host::Ip(IpAddr::V4(v4)),
            // An IPv6 address needs its brackets: `::1:80` reads two ways.
            Ok(IpAddr::V6(_)) => {
                return Err(format!(
                    "{written:?}: write an IPv6 address in brackets, [addr]:port"
                ))
            }
            Err(_) if is_dns_name(host) => Host::Name(host.to_ascii_lowercase()),
            Err(_) => return Err(bad()),
        },
    };
    let sni = match (sni, &host) {
        (Some(name), _) => name.to_owned(),
        (None, Host::Name(name)) => name.clone(),
        (None, Host::Ip(ip)) => ip.to_string(),
    };
    Ok(Target { host, port, sni })
}

/// Whether `host` is a DNS name: dot-separated labels of letters, digits, `-` and `_`, none
/// empty, none longer than 63, 253 in all.
fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
        })
}

/// A resolver's address: `ip:port`, or an IP for port 53.
fn resolver(written: &str) -> Result<SocketAddr, String> {
    written
        .parse::<SocketAddr>()
        .or_else(|_| {
            written
                .parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, DNS_PORT))
        })
        .map_err(|_| format!("{written:?} is not an ip:port (or an IP, for port 53)"))
}

/// Loads the PEM CA certificates of the file the config names `name`, each checked to be a
/// usable trust anchor.
fn load_ca(files: &mut Files, name: &str) -> Result<TrustedCa, String> {
    let (path, pem) = files.read(name)?;
    let shown = path.display().to_string();
    let mut store = pingora::tls::RootCertStore::empty();
    let mut certs = Vec::new();
    let mut key = Sha256::new();
    for cert in pem_certificates(&shown, &pem)? {
        store
            .add(cert.clone())
            .map_err(|e| format!("{shown}: not a usable CA certificate: {e}"))?;
        key.update(cert.len().to_le_bytes());
        key.update(&cert);
        certs.push(pingora::utils::tls::WrappedX509::new(
            cert.to_vec(),
            pingora::utils::tls::parse_x509,
        ));
    }
    let key: [u8; 32] = key.finalize().into();
    Ok(TrustedCa {
        certs: Arc::from(certs.into_boxed_slice()),
        key: u64::from_le_bytes(key[..8].try_into().expect("8 of 32 bytes")),
    })
}

/// Validates `[upstream]`.
pub(super) fn upstream(f: &UpstreamFile, files: &mut Files, p: &mut Problems) -> UpstreamConfig {
    if f.addresses.is_empty() {
        p.push("upstream.addresses", "needs at least one host:port");
    }
    let targets = f
        .addresses
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            p.check(
                format!("upstream.addresses[{i}]"),
                target(a, f.tls_sni.as_deref()),
            )
        })
        .collect();
    let connect_timeout = p.millis("upstream.connect_timeout_ms", f.connect_timeout_ms);
    let read_timeout = p.millis("upstream.read_timeout_ms", f.read_timeout_ms);
    let idle_timeout = p.millis("upstream.idle_timeout_ms", f.idle_timeout_ms);
    let health_check_interval = p.millis(
        "upstream.health_check_interval_ms",
        f.health_check_interval_ms,
    );
    if let Some(path) = &f.health_check_path {
        if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
            p.push(
                "upstream.health_check_path",
                "must be an absolute path without spaces",
            );
        }
    }
    let ca = match &f.tls_ca_file {
        None => None,
        Some(name) => p.check("upstream.tls_ca_file", load_ca(files, name)),
    };
    let min_ttl = p.millis("upstream.dns_min_ttl_ms", f.dns_min_ttl_ms);
    let max_ttl = p.millis("upstream.dns_max_ttl_ms", f.dns_max_ttl_ms);
    if max_ttl < min_ttl {
        p.push(
            "upstream.dns_max_ttl_ms",
            "must not be less than upstream.dns_min_ttl_ms",
        );
    }
    let resolvers = f
        .resolvers
        .iter()
        .enumerate()
        .filter_map(|(i, r)| p.check(format!("upstream.resolvers[{i}]"), resolver(r)))
        .collect();
    if let Some(max) = f.max_connections_per_address {
        p.positive("upstream.max_connections_per_address", max as u64);
    }
    let pending_timeout = p.millis("upstream.pending_timeout_ms", f.pending_timeout_ms);
    let eject = p.millis("upstream.eject_ms", f.eject_ms);
    UpstreamConfig {
        targets,
        connect_timeout,
        read_timeout,
        idle_timeout,
        health_check_interval,
        health_check_path: f.health_check_path.clone(),
        dns: DnsConfig {
            min_ttl,
            max_ttl,
            resolvers,
            allow_unresolved_at_start: f.allow_unresolved_at_start,
        },
        budget: BudgetConfig {
            max_connections_per_address: f.max_connections_per_address,
            max_pending: f.max_pending,
            pending_timeout,
        },
        ejection: EjectionConfig {
            after_failures: f.eject_after_failures,
            base: eject,
        },
        tls: f.tls.then(|| TlsTo {
            verify: f.tls_verify,
            ca,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn targets_are_addresses_or_names_with_a_port() {
        let t = target("10.0.0.1:80", None).unwrap();
        assert_eq!(t.address(), Some("10.0.0.1:80".parse().unwrap()));
        assert_eq!(t.sni, "10.0.0.1");
        let t = target("[::1]:8443", None).unwrap();
        assert_eq!(t.address(), Some("[::1]:8443".parse().unwrap()));
        let t = target("Backend.svc.cluster.local:8080", Some("api.example")).unwrap();
        assert_eq!(t.host, Host::Name("backend.svc.cluster.local".into()));
        assert_eq!((t.port, t.sni.as_str()), (8080, "api.example"));
        for bad in [
            "no-port", ":80", "h:x", "::1:80", "a..b:80", "-a:80", "a b:80", "h:70000",
        ] {
            assert!(target(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolvers_take_a_port_or_get_53() {
        assert_eq!(
            resolver("127.0.0.1:5353"),
            Ok("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(resolver("10.0.0.2"), Ok("10.0.0.2:53".parse().unwrap()));
        assert_eq!(resolver("[::1]:53"), Ok("[::1]:53".parse().unwrap()));
        assert!(resolver("dns.example:53").is_err());
    }

    #[test]
    fn names_are_listed_once_each() {
        let mut f = UpstreamFile::new(vec![
            "a.example:80".into(),
            "10.0.0.1:80".into(),
            "a.example:81".into(),
            "b.example:80".into(),
        ]);
        f.resolvers = vec!["127.0.0.1:5353".into()];
        let mut p = Problems::default();
        let u = upstream(&f, &mut Files::new(Path::new("."), ""), &mut p);
        assert_eq!(u.names(), ["a.example", "b.example"]);
        assert_eq!(u.dns.resolvers, ["127.0.0.1:5353".parse().unwrap()]);
    }

    #[test]
    fn bounds_that_contradict_or_mean_nothing_are_refused() {
        let mut f = UpstreamFile::new(vec!["10.0.0.1:80".into()]);
        f.dns_min_ttl_ms = 5000;
        f.dns_max_ttl_ms = 1000;
        f.max_connections_per_address = Some(0);
        f.pending_timeout_ms = 0;
        f.eject_ms = 0;
        f.resolvers = vec!["nowhere".into()];
        let mut p = Problems::default();
        upstream(&f, &mut Files::new(Path::new("."), ""), &mut p);
        let keys: Vec<String> = p
            .finish(Some(()))
            .unwrap_err()
            .into_iter()
            .map(|p| p.key)
            .collect();
        assert_eq!(
            keys,
            [
                "upstream.dns_max_ttl_ms",
                "upstream.resolvers[0]",
                "upstream.max_connections_per_address",
                "upstream.pending_timeout_ms",
                "upstream.eject_ms"
            ]
        );
    }

    /// A CA the test makes, as PEM.
    fn a_ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    /// The CA file is read beside the config, as the other files a config names, and goes
    /// into pingora's reuse hash by what it holds: the same CA read again keeps the peers
    /// (their state and pooled connections), another CA makes new ones.
    #[test]
    fn a_ca_file_is_read_beside_the_config_and_a_new_ca_makes_new_peers() {
        use pingora::upstreams::peer::Peer;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("backend-ca.pem");
        std::fs::write(&ca_file, a_ca()).unwrap();
        let mut f = UpstreamFile::new(vec!["10.0.0.1:443".into()]);
        f.tls = true;
        f.tls_ca_file = Some("backend-ca.pem".into());
        let read = || {
            let mut files = Files::beside(&dir.path().join("gateway.toml"), "");
            let mut p = Problems::default();
            let u = upstream(&f, &mut files, &mut p);
            assert!(p.finish(Some(())).is_ok());
            let peer = u.peer(&u.targets[0], "10.0.0.1:443".parse().unwrap());
            (peer.reuse_hash(), files.finish().files)
        };
        let (first, files) = read();
        assert_eq!(files, std::slice::from_ref(&ca_file));
        assert_eq!(read().0, first, "the same CA, read again");
        std::fs::write(&ca_file, a_ca()).unwrap();
        assert_ne!(read().0, first, "another CA");
    }
}
