//! The certificate the proxy listener serves: the snapshot's, swapped when an applied reload
//! brings another (a renewal written over the same files, or other files). Handshakes after
//! the swap get the new one; connections already open keep theirs.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::ServerCert;

/// What the listener's TLS asks for a certificate at each handshake.
#[derive(Debug)]
pub struct ServedCert(ArcSwap<CertifiedKey>);

impl ServedCert {
    pub fn new(cert: &ServerCert) -> Self {
        ServedCert(ArcSwap::new(cert.certified.clone()))
    }

    /// Serves `cert` from the next handshake on, if it is another certificate than the one
    /// served now. A snapshot without one (TLS turned off, which takes a restart) changes
    /// nothing.
    pub fn follow(&self, cert: Option<&ServerCert>) {
        let Some(cert) = cert else {
            return;
        };
        if self.0.load().cert != cert.certified.cert {
            self.0.store(cert.certified.clone());
            tracing::info!(cert = %cert.cert_file, "the proxy listener serves a new certificate");
        }
    }
}

impl ResolvesServerCert for ServedCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}
