//! A test PKI: a CA generated in the test and a certificate it signed, as PEM files, and the
//! proxy listener set to serve it.

use agent_gateway::config::FileConfig;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A CA and a certificate it signed, as PEM files (paths) in a directory of their own.
pub struct TestPki {
    pub ca: String,
    pub cert: String,
    pub key: String,
    _dir: tempfile::TempDir,
}

impl TestPki {
    /// A CA named after `name` and a certificate for "localhost".
    pub fn localhost(name: &str) -> TestPki {
        Self::for_host(name, "localhost")
    }

    /// A CA named after `name` and a certificate for `host`, a DNS name or an IP address.
    pub fn for_host(name: &str, host: &str) -> TestPki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Names of their own: a leaf whose issuer reads like its subject looks self-signed to
        // OpenSSL (curl), whatever the signature says.
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("agent-gateway test CA {name}"));
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(vec![host.to_string()]).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, host);
        let cert = leaf.signed_by(&key, &ca, &ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, pem: String| {
            let path = dir.path().join(format!("{name}-{file}"));
            std::fs::write(&path, pem).unwrap();
            path.display().to_string()
        };
        TestPki {
            ca: write("ca.pem", ca.pem()),
            cert: write("cert.pem", cert.pem()),
            key: write("key.pem", key.serialize_pem()),
            _dir: dir,
        }
    }

    /// `cfg` with its proxy listener speaking TLS with this certificate.
    pub fn serve_on(&self, cfg: &mut FileConfig) {
        cfg.listen.tls_cert = Some(self.cert.clone());
        cfg.listen.tls_key = Some(self.key.clone());
    }
}
