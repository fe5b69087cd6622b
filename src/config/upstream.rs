//! `[upstream]`: the backend addresses, resolved once, with their pingora peers and pool keys
//! built at load so that no request resolves or allocates them.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use pingora::upstreams::peer::{HttpPeer, Peer};

use super::file::UpstreamFile;
use super::problems::Problems;

/// Whether validation looks host names up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    Resolve,
    /// Check the form only ([`super::Snapshot::check_without_lookup`]).
    Skip,
}

/// The backend: its addresses, each resolved with its peer built once.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// In the order of `upstream.addresses`: the order of the rotation.
    pub backends: Vec<Backend>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    pub health_check_interval: Duration,
    pub health_check_path: Option<String>,
}

/// One address of `upstream.addresses` and what reaching it takes, kept together so that no
/// index can pair an address with another's peer.
#[derive(Debug, Clone)]
pub struct Backend {
    pub addr: SocketAddr,
    /// Its timeouts and TLS settings, as pingora connects.
    pub peer: HttpPeer,
    /// Its key in the connection pool: the address and TLS settings, hashed once.
    pub pool_key: u64,
}

fn resolve(s: &str, lookup: Lookup) -> Result<SocketAddr, String> {
    if lookup == Lookup::Skip {
        // The form only; the placeholder address is never served (see `Lookup::Skip`).
        let port = s
            .rsplit_once(':')
            .filter(|(host, _)| !host.is_empty())
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .ok_or_else(|| format!("{s:?} is not a host:port"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not a resolvable host:port ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// The host part of a `host:port` address (without brackets for IPv6).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Loads PEM CA certificates, each checked to be a usable trust anchor.
fn load_ca(path: &str) -> Result<Arc<pingora::protocols::tls::CaType>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut store = pingora::tls::RootCertStore::empty();
    let mut certs = Vec::new();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("{path}: {e}"))?;
        store
            .add(cert.clone())
            .map_err(|e| format!("{path}: not a usable CA certificate: {e}"))?;
        certs.push(pingora::utils::tls::WrappedX509::new(
            cert.to_vec(),
            pingora::utils::tls::parse_x509,
        ));
    }
    if certs.is_empty() {
        return Err(format!("{path} holds no PEM certificate"));
    }
    Ok(Arc::from(certs.into_boxed_slice()))
}

/// Validates `[upstream]`, looking its host names up unless `lookup` says not to.
pub(super) fn upstream(f: &UpstreamFile, lookup: Lookup, p: &mut Problems) -> UpstreamConfig {
    if f.addresses.is_empty() {
        p.push("upstream.addresses", "needs at least one host:port");
    }
    let addresses: Vec<SocketAddr> = f
        .addresses
        .iter()
        .enumerate()
        .filter_map(|(i, a)| p.check(format!("upstream.addresses[{i}]"), resolve(a, lookup)))
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
        Some(path) => p.check("upstream.tls_ca_file", load_ca(path)),
    };

    let backends = addresses
        .into_iter()
        .zip(&f.addresses)
        .map(|(addr, written)| {
            let sni = match &f.tls_sni {
                Some(name) => name.clone(),
                None => host_of(written).to_owned(),
            };
            let mut peer = HttpPeer::new(addr, f.tls, sni);
            // No `connection_timeout`: the gateway limits a connect itself (see
            // `proxy::connect`), on the runtime's timer.
            peer.options.idle_timeout = Some(idle_timeout);
            peer.options.verify_cert = f.tls_verify;
            peer.options.verify_hostname = f.tls_verify;
            peer.options.ca = ca.clone();
            Backend {
                addr,
                pool_key: peer.reuse_hash(),
                peer,
            }
        })
        .collect();
    UpstreamConfig {
        backends,
        connect_timeout,
        read_timeout,
        idle_timeout,
        health_check_interval,
        health_check_path: f.health_check_path.clone(),
    }
}
