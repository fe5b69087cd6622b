//! `server.upgrade_sock`: the process sent SIGQUIT hands its listening sockets to whatever
//! listens there (pingora checks nobody), so only the gateway's user, or root, may be able to
//! make a file in its directory. In a shared sticky `/tmp` another user could make the socket
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

/// Whether a directory of mode `mode` owned by `owner` lets no one but a process of effective
/// uid `euid` (and root) make a file in it; else why not. The sticky bit does not help: it
/// keeps others from removing a file, not from making one under a name not yet taken. Root is
/// refused a directory others can write too.
pub fn only_owner_writes(mode: u32, owner: u32, euid: u32) -> Result<(), String> {
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
    if owner != euid && owner != 0 {
        return Err(format!(
            "it belongs to uid {owner}, not to the gateway's uid {euid} or root"
        ));
    }
    Ok(())
}

/// The directory `sock` is made in, or, while it is missing, its nearest existing ancestor
/// (whoever can write there can make the missing directory, and the socket in it): checked by
/// [`only_owner_writes`] for this process's effective uid. A missing directory under one that
/// passes is left to `run --upgrade`, which cannot wait there until it is made.
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
    let euid = nix::unistd::geteuid().as_raw();
    only_owner_writes(metadata.mode(), metadata.uid(), euid).map_err(|why| {
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

/// Checks `server.upgrade_sock`'s directory.
pub(super) fn upgrade_sock(server: &ServerFile, p: &mut Problems) {
    p.check(
        "server.upgrade_sock",
        check_directory(Path::new(&server.upgrade_sock)),
    );
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const GATEWAY: u32 = 1000;
    const OTHER: u32 = 1001;
    const ROOT: u32 = 0;

    #[test]
    fn a_directory_only_the_gateway_or_root_can_write_passes() {
        for (mode, owner, euid) in [
            (0o700, GATEWAY, GATEWAY),
            (0o755, GATEWAY, GATEWAY),
            (0o755, ROOT, GATEWAY), // systemd's RuntimeDirectory= under /run, or /run
            (0o555, ROOT, GATEWAY), // a read-only one: bind fails there, nobody else writes
            (0o700, ROOT, ROOT),
            (0o40755, ROOT, ROOT), // the file type bits of st_mode count for nothing
        ] {
            assert_eq!(
                only_owner_writes(mode, owner, euid),
                Ok(()),
                "{mode:o} {owner} {euid}"
            );
        }
    }

    #[test]
    fn a_directory_others_can_write_is_refused_for_root_too() {
        for euid in [GATEWAY, ROOT] {
            for (mode, owner) in [
                (0o1777, ROOT), // a shared /tmp
                (0o777, euid),  // a Kubernetes emptyDir: 0777, no sticky bit
                (0o2770, euid), // group-writable, whatever the group
                (0o730, euid),
                (0o703, euid),
            ] {
                let why = only_owner_writes(mode, owner, euid).unwrap_err();
                assert!(why.contains(&format!("{:o}", mode)), "{why}");
            }
        }
    }

    #[test]
    fn a_directory_of_another_user_is_refused_for_root_too() {
        for (owner, euid) in [(OTHER, GATEWAY), (OTHER, ROOT), (GATEWAY, ROOT)] {
            let why = only_owner_writes(0o700, owner, euid).unwrap_err();
            assert!(why.contains(&format!("uid {owner}")), "{why}");
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
