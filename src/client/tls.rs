//! How a client of ours trusts the servers it calls over TLS: the platform's roots (the
//! default), the CA certificates of one PEM file (curl's `--cacert`: they replace the
//! platform's), or nothing at all (curl's `--insecure`: the certificate is not checked, the
//! handshake's signatures still are). Made into a rustls [`ClientConfig`] on the rustls 0.23
//! and ring that pingora already links. For every client that is not the gateway's own
//! upstream connector (which pingora configures from `[upstream]`): this layer's HTTP(S)
//! client and the load generator.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Whom a client trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The platform's roots (the system's CA store).
    Platform,
    /// Only the CA certificates of this PEM file.
    CaFile(PathBuf),
    /// Any certificate: for test deployments with self-signed ones, never for a real check.
    Insecure,
}

/// Why a client TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the CA file {path}: {source}")]
    CaRead {
        path: String,
        source: std::io::Error,
    },
    #[error("the CA file {path}: {message}")]
    CaFormat { path: String, message: String },
}

/// A rustls client configuration trusting `trust`, offering `alpn` (e.g. `[b"h2"]`) in the
/// handshake.
pub fn client_config(trust: &Trust, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let mut config = match trust {
        Trust::Platform => builder
            .with_root_certificates(platform_roots())
            .with_no_client_auth(),
        Trust::CaFile(path) => builder
            .with_root_certificates(ca_file_roots(path)?)
            .with_no_client_auth(),
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The system's CA store; certificates it cannot parse are skipped (as curl does). A store
/// that holds none makes every handshake fail with an unknown issuer, which names the cause.
fn platform_roots() -> RootCertStore {
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    store
}

/// Every certificate of a PEM file, each one a usable trust anchor.
fn ca_file_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let shown = path.display().to_string();
    let format = |message: String| TlsError::CaFormat {
        path: shown.clone(),
        message,
    };
    let pem = std::fs::read(path).map_err(|source| TlsError::CaRead {
        path: shown.clone(),
        source,
    })?;
    let mut store = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format(e.to_string()))?;
        store
            .add(cert)
            .map_err(|e| format(format!("not a usable CA certificate: {e}")))?;
    }
    if store.is_empty() {
        return Err(format("holds no PEM certificate".into()));
    }
    Ok(store)
}

/// `--insecure`: accepts any certificate for any name, and checks the handshake's signatures
/// with the provider's algorithms as a verifying client would.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_usable_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            client_config(&Trust::CaFile(missing), &[]),
            Err(TlsError::CaRead { .. })
        ));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = client_config(&Trust::CaFile(empty), &[]).unwrap_err();
        assert!(e.to_string().ends_with("holds no PEM certificate"), "{e}");

        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, ca.pem()).unwrap();
        let config = client_config(&Trust::CaFile(file), &[b"h2"]).unwrap();
        assert_eq!(config.alpn_protocols, [b"h2".to_vec()]);
    }

    #[test]
    fn insecure_accepts_any_certificate() {
        let config = client_config(&Trust::Insecure, &[b"http/1.1"]).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        let verifier = AnyCertificate(Arc::new(rustls::crypto::ring::default_provider()));
        assert!(!verifier.supported_verify_schemes().is_empty());
        let cert = CertificateDer::from(vec![0u8; 8]);
        let name = ServerName::try_from("anything.example").unwrap();
        assert!(verifier
            .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .is_ok());
    }
}
