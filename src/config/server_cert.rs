//! The proxy listener's certificate (`listen.tls_cert`, `listen.tls_key`): read like the other
//! secret files (relative to the config's directory, in the reading's fingerprint, their
//! directories watched), checked to go together, and kept loaded in the snapshot. Whether the
//! listener speaks TLS is fixed at start ([`super::StartupConfig::proxy_tls`]); the certificate
//! it serves follows each reload, so a renewal written over the files (cert-manager, certbot)
//! is served without a restart.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::sign::CertifiedKey;

use super::file::ListenFile;
use super::files::{pem_certificates, Files};
use super::problems::Problems;

/// A certificate chain and the private key that goes with it, as the listener serves them.
#[derive(Clone)]
pub struct ServerCert {
    /// The files, as the config names them.
    pub cert_file: String,
    pub key_file: String,
    pub certified: Arc<CertifiedKey>,
}

/// By hand: the files' names, never the key.
impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCert")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

/// Reads and checks the listener's certificate and key, if `[listen]` names them.
pub(super) fn server_cert(
    listen: &ListenFile,
    files: &mut Files,
    p: &mut Problems,
) -> Option<ServerCert> {
    let (cert_file, key_file) = match (&listen.tls_cert, &listen.tls_key) {
        (None, None) => return None,
        (Some(cert), Some(key)) => (cert, key),
        _ => {
            p.push("listen.tls_cert", "tls_cert and tls_key go together");
            return None;
        }
    };
    let chain = files
        .read(cert_file)
        .and_then(|(path, pem)| pem_certificates(&path.display().to_string(), &pem));
    let key = files
        .read(key_file)
        .and_then(|(path, pem)| private_key(&path, &pem));
    let (chain, key) = (
        p.check("listen.tls_cert", chain),
        p.check("listen.tls_key", key),
    );
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain?, key?, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            format!("{key_file} is not the key of the certificate in {cert_file}")
        }
        e => format!("{key_file} cannot sign for {cert_file}: {e}"),
    });
    Some(ServerCert {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        certified: Arc::new(p.check("listen.tls_key", certified)?),
    })
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| format!("{} is not PEM: {e}", path.display()))?
        .ok_or_else(|| format!("no private key in {}", path.display()))
}
