//! The files a config names besides itself (`auth.agents_file`,
//! `rate_limit.redis_password_file`, the listener's certificate and key, the CAs), read
//! relative to the config's directory (an absolute path as it is), or, for `check-config
//! --mount`, from where they are before a pod mounts them ([`Mount`]); the Prometheus
//! credentials, read at each use, are only located so. What was read is remembered as
//! [`Inputs`]: a fingerprint of the config's text and every such file, which a reload compares
//! to tell a change from an event that changed nothing, and the files, whose directories the
//! watcher watches beside the config's.
//! Their contents are never kept here, logged or put in a problem.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What a snapshot was read from, beyond the config's own text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// SHA-256 over the config's text and each file read with it (the name the config
    /// writes, and the contents or why they could not be read): equal inputs make snapshots
    /// that act alike.
    pub fingerprint: [u8; 32],
    /// The files read besides the config, as their paths resolve.
    pub files: Vec<PathBuf>,
    /// The config or one of them could not be read. Unlike a bad file, a read error can go
    /// away with no event in a watched directory (too many open files, a link's target
    /// elsewhere put back): the watcher reads again each second while it lasts.
    pub unreadable: bool,
}

impl Inputs {
    /// What a reading of a config that could not be read was: its error (the same error again
    /// is the same reading, counted once), and the files the reading before named, whose
    /// directories stay watched.
    pub fn of_unreadable_config(error: &str, files: Vec<PathBuf>) -> Inputs {
        let mut fingerprint = Sha256::new();
        fingerprint.update(b"the config could not be read: ");
        fingerprint.update(error);
        Inputs {
            fingerprint: fingerprint.finalize().into(),
            files,
            unreadable: true,
        }
    }
}

/// A directory the config names as a pod sees it (`at`, a Secret's mount), read from another
/// (`from`, the files the Secret is made of): `check-config --mount AT=FROM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub at: PathBuf,
    pub from: PathBuf,
}

impl std::str::FromStr for Mount {
    type Err = String;

    fn from_str(s: &str) -> Result<Mount, String> {
        match s.split_once('=') {
            Some((at, from)) if Path::new(at).is_absolute() && !from.is_empty() => Ok(Mount {
                at: at.into(),
                from: from.into(),
            }),
            _ => Err(format!(
                "{s:?}: expected MOUNTED=LOCAL, an absolute directory the config names and the \
                 directory holding its files here"
            )),
        }
    }
}

/// Reads the files a config names, relative to the config's directory.
pub(super) struct Files {
    dir: PathBuf,
    mounts: Vec<Mount>,
    fingerprint: Sha256,
    read: Vec<PathBuf>,
    unreadable: bool,
}

impl Files {
    /// For the config whose text is `text`, in the directory `dir` (where relative names are).
    pub fn new(dir: &Path, text: &str) -> Files {
        let mut fingerprint = Sha256::new();
        fingerprint.update(text.len().to_le_bytes());
        fingerprint.update(text);
        Files {
            dir: dir.to_path_buf(),
            mounts: Vec::new(),
            fingerprint,
            read: Vec::new(),
            unreadable: false,
        }
    }

    /// The same, with files under each mount's `at` read from its `from`.
    pub fn mounted(self, mounts: &[Mount]) -> Files {
        Files {
            mounts: mounts.to_vec(),
            ..self
        }
    }

    /// Where the file the config names `path` is read from.
    fn source(&self, path: PathBuf) -> PathBuf {
        self.mounts
            .iter()
            .find_map(|m| Some(m.from.join(path.strip_prefix(&m.at).ok()?)))
            .unwrap_or(path)
    }

    /// For the config file at `config`, whose text is `text`.
    pub fn beside(config: &Path, text: &str) -> Files {
        Files::new(&directory_of(config), text)
    }

    /// Where the file the config names `name` is, for what reads it at each use rather than
    /// with the config (the Prometheus credentials): not read, fingerprinted or watched.
    pub fn locate(&self, name: &str) -> PathBuf {
        self.source(self.dir.join(name))
    }

    /// The file `name` (as the config writes it): its path and bytes, or a message naming
    /// the path and why it cannot be read.
    pub fn read(&mut self, name: &str) -> Result<(PathBuf, Vec<u8>), String> {
        let path = self.locate(name);
        let read = std::fs::read(&path);
        // The name as written, not where it resolves: processes that run one config from
        // different directories (or names of it) agree on the fingerprint.
        self.fingerprint.update(name.len().to_le_bytes());
        self.fingerprint.update(name);
        match &read {
            Ok(bytes) => {
                self.fingerprint.update([1]);
                self.fingerprint.update(bytes.len().to_le_bytes());
                self.fingerprint.update(bytes);
            }
            Err(e) => {
                self.unreadable = true;
                self.fingerprint.update([0]);
                self.fingerprint.update(e.to_string());
            }
        }
        self.read.push(path.clone());
        read.map(|bytes| (path.clone(), bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    /// What was read.
    pub fn finish(self) -> Inputs {
        Inputs {
            fingerprint: self.fingerprint.finalize().into(),
            files: self.read,
            unreadable: self.unreadable,
        }
    }
}

/// The directory a file is in (`.` for a bare name): where the names a config writes are,
/// and what a watcher of the file watches.
pub fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A secret read from a file: its text without one trailing newline (`echo` and editors add
/// one). Never printed: a problem names the file, not what it holds.
pub(super) fn secret_text(path: &Path, bytes: Vec<u8>) -> Result<String, String> {
    let mut text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(text)
}

/// The certificates of a PEM file's text, in order, at least one; `shown` names the file in
/// a problem.
pub(super) fn pem_certificates(
    shown: &str,
    pem: &[u8],
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_are_beside_the_config_and_the_fingerprint_follows_contents() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\n").unwrap();
        let config = dir.path().join("gateway.toml");
        let fingerprint = |text: &str| {
            let mut files = Files::beside(&config, text);
            let (path, _) = files.read("pw").unwrap();
            assert_eq!(path, dir.path().join("pw"));
            files.finish()
        };
        let (path, bytes) = Files::beside(&config, "a").read("pw").unwrap();
        assert_eq!(secret_text(&path, bytes).unwrap(), "s3cret");
        let first = fingerprint("a");
        assert_eq!(first.files, [dir.path().join("pw")]);
        assert_eq!(fingerprint("a"), first);
        assert_ne!(fingerprint("b").fingerprint, first.fingerprint);
        std::fs::write(dir.path().join("pw"), "other\n").unwrap();
        assert_ne!(fingerprint("a").fingerprint, first.fingerprint);

        let mut files = Files::beside(&config, "a");
        let missing = files.read("nothing").unwrap_err();
        assert!(missing.starts_with("cannot read "), "{missing}");
        let empty = secret_text(Path::new("pw"), b"\n".to_vec()).unwrap_err();
        assert_eq!(empty, "pw is empty");
    }

    /// `check-config --mount`: a file under a pod's mount is read from the directory its
    /// Secret is made of; other files are read where the config names them.
    #[test]
    fn files_under_a_mount_are_read_from_its_source() {
        let here = tempfile::tempdir().unwrap();
        std::fs::write(here.path().join("password"), "s3cret").unwrap();
        let mount: Mount = format!("/etc/secrets={}", here.path().display())
            .parse()
            .unwrap();
        let mut files = Files::beside(Path::new("/etc/gw/gateway.toml"), "").mounted(&[mount]);
        let (path, bytes) = files.read("/etc/secrets/password").unwrap();
        assert_eq!(
            (path, bytes),
            (here.path().join("password"), b"s3cret".to_vec())
        );
        let elsewhere = files.read("/etc/secretsx/password").unwrap_err();
        assert!(elsewhere.contains("/etc/secretsx/password"), "{elsewhere}");
        for bad in ["relative=/x", "/etc/secrets", "/etc/secrets="] {
            assert!(bad.parse::<Mount>().is_err(), "{bad}");
        }
        // What is read at each use (the Prometheus credentials) is located the same way.
        assert_eq!(
            files.locate("/etc/secrets/token"),
            here.path().join("token")
        );
        assert_eq!(
            Files::beside(Path::new("/etc/gw/gateway.toml"), "").locate("token"),
            Path::new("/etc/gw/token")
        );
    }

    /// Two processes that run one config from two directories (or by two names of it) read
    /// the same inputs, and their fingerprints agree: each file is hashed by the name the
    /// config writes, not the path it resolves to.
    #[test]
    fn the_fingerprint_is_the_same_wherever_the_config_is() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let fingerprint = |dir: &Path| {
            std::fs::write(dir.join("agents.toml"), "[[agents]]\n").unwrap();
            let mut files = Files::beside(&dir.join("gateway.toml"), "text");
            files.read("agents.toml").unwrap();
            files.finish().fingerprint
        };
        assert_eq!(fingerprint(one.path()), fingerprint(two.path()));
    }
}
