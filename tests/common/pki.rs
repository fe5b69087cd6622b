//! A test PKI: a CA generated in the test, and a "localhost" certificate it signed.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A CA and a "localhost" certificate it signed, written as PEM files into `dir`.
pub struct TestPki {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

pub fn make_pki(dir: &Path, name: &str) -> TestPki {
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
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    let write = |file: &str, pem: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    TestPki {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", cert.pem()),
        key: write("key.pem", key.serialize_pem()),
    }
}
