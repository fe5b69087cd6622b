//! `server.upgrade_sock`: the process sent SIGQUIT hands its listening sockets to whatever
//! listens there (pingora checks nobody), so no other user may be able to make a file in its
//! directory (it should be the gateway's user's, or root's). In a shared sticky `/tmp` another user could make the socket
//! first: the process started with `--upgrade` could not take its place, and the listeners,
//! with every agent's token on them, would go to that user. Checked wherever a config is
//! read, like the files it names: `check-config`, `run` (which sends on a later SIGQUIT),
//! `run --upgrade` before it waits there, the demo, and each reload.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::file::ServerFile;
use super::files::directory_of;
use super::problems::Problems;

/// Write permission for the directory's group and for every other user.
const GROUP_WRITE: u32 = 0o020;
const OTHER_WRITE: u32 = 0o002;

/// Whether a directory of mode `mode` lets no other user make a file in it; else why not.
/// The sticky bit does not help: it keeps others from removing a file, not from making one
/// under a name not yet taken. Its owner is not judged: `check-config` may run as another
/// user than the gateway's (an operator, or `sudo`), and a directory of the gateway's own
/// user is where it belongs (systemd's `RuntimeDirectory=`).
pub fn only_owner_writes(mode: u32) -> Result<(), String> {
    if mode & OTHER_WRITE != 0 {
        return Err(format!(
            "every user can write to it (mode {:o})",
            mode & 0o7777
        ));
    }
    if mode & GROUP_WRITE != 0 {
        return Err(format!(
            "its group can write to it (mode {:o})",
            mode & 0o7777
        ));
    }
    Ok(())
}

/// The directory `sock` is made in, or, while it is missing, its nearest existing ancestor
/// (whoever can write there can make the missing directory, and the socket in it): checked by
/// [`only_owner_writes`]. A missing directory under one that passes is left to
/// `run --upgrade`, which cannot wait there until it is made.
pub fn check_directory(sock: &Path) -> Result<(), String> {
    let dir = directory_of(sock);
    let mut at: PathBuf = dir.clone();
    let metadata = loop {
        match std::fs::metadata(&at) {
            Ok(metadata) => break metadata,
            Err(e) if e.kind() == ErrorKind::NotFound => match at.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => at = parent.to_path_buf(),
                _ if at != Path::new(".") => at = PathBuf::from("."),
                _ => return Err(format!("cannot inspect {}: {e}", at.display())),
            },
            Err(e) => return Err(format!("cannot inspect {}: {e}", at.display())),
        }
    };
    if !metadata.is_dir() {
        return Err(format!("{} is not a directory", at.display()));
    }
    only_owner_writes(metadata.mode()).map_err(|why| {
        let whose = if at == dir {
            format!("{}: {why}", dir.display())
        } else {
            format!(
                "{} does not exist, and {} where it would be made: {why}",
                dir.display(),
                at.display()
            )
        };
        format!(
            "{whose}; another user could make the socket first and be handed the listeners \
             on SIGQUIT. Use a directory only the gateway's user can write, such as systemd's \
             RuntimeDirectory= (/run/agent-gateway)"
        )
    })
}

/// The longest path a Unix socket's address holds (`sun_path`, less its final NUL): pingora
/// panics on a longer one.
const MAX_SOCKET_PATH: usize = 107;

/// Checks `server.upgrade_sock`: a path a socket can be made at, in a directory no other user
/// can write.
pub(super) fn upgrade_sock(server: &ServerFile, p: &mut Problems) {
    let sock = &server.upgrade_sock;
    let shape = if sock.is_empty() {
        Err("must name a file: the socket the listeners are handed over on".to_owned())
    } else if sock.len() > MAX_SOCKET_PATH {
        Err(format!(
            "is {} bytes: a Unix socket's path holds at most {MAX_SOCKET_PATH}",
            sock.len()
        ))
    } else {
        Ok(())
    };
    if p.check("server.upgrade_sock", shape).is_some() {
        p.check("server.upgrade_sock", check_directory(Path::new(sock)));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_directory_only_its_owner_can_write_passes() {
        for mode in [0o700, 0o755, 0o555, 0o40755] {
            assert_eq!(only_owner_writes(mode), Ok(()), "{mode:o}");
        }
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        for mode in [
            0o1777, // a shared /tmp
            0o777,  // a Kubernetes emptyDir: 0777, no sticky bit
            0o2770, // group-writable, whatever the group
            0o730, 0o703,
        ] {
            let why = only_owner_writes(mode).unwrap_err();
            assert!(why.contains(&format!("{:o}", mode)), "{why}");
        }
    }

    #[test]
    fn an_empty_or_overlong_path_is_refused() {
        let problems = |sock: String| {
            let server = ServerFile {
                upgrade_sock: sock,
                ..ServerFile::default()
            };
            let mut p = Problems::default();
            upgrade_sock(&server, &mut p);
            p.finish(Some(())).err().unwrap_or_default()
        };
        let private = tempfile::tempdir().unwrap();
        let at = |name: &str| private.path().join(name).display().to_string();
        assert!(problems(at("upgrade.sock")).is_empty());
        let long = at(&"s".repeat(MAX_SOCKET_PATH));
        for sock in [String::new(), long] {
            let said = problems(sock.clone());
            assert_eq!(said.len(), 1, "{sock:?}: {said:?}");
            assert_eq!(said[0].key, "server.upgrade_sock");
        }
    }

    #[test]
    fn a_missing_directory_is_judged_by_the_nearest_one_that_exists() {
        let private = tempfile::tempdir().unwrap();
        let deep = private.path().join("a/b/upgrade.sock");
        assert_eq!(check_directory(&deep), Ok(()));

        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let why = check_directory(&shared.path().join("a/upgrade.sock")).unwrap_err();
        assert!(
            why.contains("does not exist") && why.contains(&shared.path().display().to_string()),
            "{why}"
        );
        let why = check_directory(&shared.path().join("upgrade.sock")).unwrap_err();
        assert!(why.contains("mode 1777"), "{why}");
    }
}
