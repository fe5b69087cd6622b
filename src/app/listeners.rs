//! The gateway's listening sockets, opened before anything is served on them: bound from the
//! config's addresses, taken over from the process a `--upgrade` replaces, or bound by a test
//! on port 0. [`crate::app::serve::serve`] accepts on whatever it is given.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;

use pingora::server::Fds;

use crate::config::{directory_of, StartupConfig};

/// Pending connections a listener queues before it accepts them: pingora's own backlog, so a
/// burst of connects waits in the kernel rather than being refused.
const BACKLOG: i32 = 65535;

/// The listening sockets of one gateway process.
#[derive(Debug)]
pub struct Listeners {
    /// Client traffic (TLS on it when `listen.tls_cert` is set).
    pub proxy: TcpListener,
    /// `listen.admin`.
    pub admin: Option<TcpListener>,
    /// The demo's mock v2 backend, on the config's first upstream address.
    pub mock_backend: Option<TcpListener>,
}

/// Where each listener is, as configured (the key a listener is handed over under on an
/// upgrade) or as bound (a port 0 resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddrs {
    pub proxy: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub mock_backend: Option<SocketAddr>,
}

impl ListenAddrs {
    /// The addresses `startup` configures, and the demo's mock backend's.
    pub fn configured(startup: &StartupConfig, mock_backend: Option<SocketAddr>) -> Self {
        ListenAddrs {
            proxy: startup.proxy_listen,
            admin: startup.admin_listen,
            mock_backend,
        }
    }
}

/// Why a listener could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("cannot take the listeners over from {sock}: {source}")]
    Upgrade { sock: String, source: nix::Error },
    #[error("cannot wait on {sock} for the listeners: {reason}")]
    UpgradeSock { sock: String, reason: String },
    #[error("the process being upgraded handed over no listener for {addr}")]
    NotHandedOver { addr: SocketAddr },
}

impl Listeners {
    /// Binds every address of `addrs`.
    pub fn bind(addrs: &ListenAddrs) -> Result<Self, ListenError> {
        Self::open(addrs, bind)
    }

    /// Takes over the listeners the running process sends on `upgrade_sock` after its SIGQUIT
    /// (pingora's handover): each under the address it was bound for.
    pub fn inherit(addrs: &ListenAddrs, upgrade_sock: &str) -> Result<Self, ListenError> {
        can_wait_on(Path::new(upgrade_sock)).map_err(|reason| ListenError::UpgradeSock {
            sock: upgrade_sock.to_owned(),
            reason,
        })?;
        let mut fds = Fds::new();
        fds.get_from_sock(upgrade_sock)
            .map_err(|source| ListenError::Upgrade {
                sock: upgrade_sock.to_owned(),
                source,
            })?;
        Self::open(addrs, |addr| {
            let fd = fds
                .get(&addr.to_string())
                .ok_or(ListenError::NotHandedOver { addr })?;
            Ok(adopt(*fd))
        })
    }

    fn open(
        addrs: &ListenAddrs,
        mut open: impl FnMut(SocketAddr) -> Result<TcpListener, ListenError>,
    ) -> Result<Self, ListenError> {
        Ok(Listeners {
            proxy: open(addrs.proxy)?,
            admin: addrs.admin.map(&mut open).transpose()?,
            mock_backend: addrs.mock_backend.map(&mut open).transpose()?,
        })
    }

    /// Where each listener is bound (a port 0 resolved).
    pub fn local_addrs(&self) -> io::Result<ListenAddrs> {
        let local = |l: &Option<TcpListener>| l.as_ref().map(TcpListener::local_addr).transpose();
        Ok(ListenAddrs {
            proxy: self.proxy.local_addr()?,
            admin: local(&self.admin)?,
            mock_backend: local(&self.mock_backend)?,
        })
    }

    /// Puts each listener in pingora's table of sockets handed to the next process on
    /// SIGQUIT, under the address it is bound to: the configured one, unless that had port 0
    /// (then the next process must be configured with the bound port to find it).
    pub fn register_for_upgrade(&self, fds: &mut Fds) -> io::Result<()> {
        let listeners = [
            Some(&self.proxy),
            self.admin.as_ref(),
            self.mock_backend.as_ref(),
        ];
        for listener in listeners.into_iter().flatten() {
            fds.add(listener.local_addr()?.to_string(), listener.as_raw_fd());
        }
        Ok(())
    }
}

/// Whether the listeners may be sent to `sock` now, on SIGQUIT: pingora sends them to
/// whatever listens there. Only a socket of this process's user, as a `run --upgrade` of the
/// same user makes, passes: another user's (made there first), a link, or nothing at all is
/// refused, and the process goes on serving (pingora, its send failed, would stop serving with
/// no process to take over).
pub fn may_hand_over_to(sock: &Path) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let found = std::fs::symlink_metadata(sock).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            "no process started with --upgrade waits there (nothing is at that path)".to_owned()
        }
        _ => format!("cannot inspect it: {e}"),
    })?;
    let kind = found.file_type();
    let waiting = if kind.is_symlink() {
        Waiting::Link
    } else if kind.is_socket() {
        Waiting::Socket { owner: found.uid() }
    } else {
        Waiting::Other
    };
    hand_over_to(waiting, nix::unistd::geteuid().as_raw())
}

/// What is at the upgrade socket's path when the listeners are to be sent there.
#[derive(Debug, Clone, Copy)]
enum Waiting {
    Socket { owner: u32 },
    Link,
    Other,
}

/// Whether the listeners may go to `waiting` from a process of effective uid `euid`: only to
/// a socket of its own user (not a link to one, whose target another user may have made).
fn hand_over_to(waiting: Waiting, euid: u32) -> Result<(), String> {
    match waiting {
        Waiting::Socket { owner } if owner == euid => Ok(()),
        Waiting::Socket { owner } => Err(format!(
            "the socket there belongs to uid {owner}, not to this process's uid {euid}: \
             another user may have made it first"
        )),
        Waiting::Link => Err("it is a symbolic link, not a socket".to_owned()),
        Waiting::Other => Err("it is not a socket".to_owned()),
    }
}

/// Whether pingora can make its socket at `sock` (it panics when it cannot): a directory there
/// this process may write in, and no file in the way that it cannot remove (one left by an
/// earlier upgrade it removes, as pingora would). Its directory passed
/// [`crate::config`]'s check when the config was read: nobody else can write there.
fn can_wait_on(sock: &Path) -> Result<(), String> {
    use nix::unistd::{access, AccessFlags};
    let dir = directory_of(sock);
    access(&dir, AccessFlags::W_OK | AccessFlags::X_OK)
        .map_err(|e| format!("cannot make a socket in {}: {}", dir.display(), e.desc()))?;
    match std::fs::remove_file(sock) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(format!("cannot remove what is there: {e}"))
        }
        _ => Ok(()),
    }
}

/// A listening socket on `addr`, with pingora's options (address reuse, its backlog), ready
/// for a runtime to accept on.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, ListenError> {
    use socket2::{Domain, Socket, Type};
    let socket = (|| {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(BACKLOG)?;
        socket.set_nonblocking(true)?;
        Ok(TcpListener::from(socket))
    })();
    socket.map_err(|source| ListenError::Bind { addr, source })
}

/// Takes ownership of a listening socket received over the upgrade socket.
#[allow(unsafe_code)]
fn adopt(fd: RawFd) -> TcpListener {
    // SAFETY: `fd` arrived by SCM_RIGHTS on the upgrade socket, so it is open and this process
    // holds it; pingora's `Fds` table only records it, and it is adopted once, under the one
    // address it was sent for. This is the step pingora's own listeners take (`from_raw_fd` in
    // pingora-core's `listeners/l4.rs`), which its API does not expose.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    // The sender's listener was non-blocking, but that is the file's state, set again to be sure.
    let _ = listener.set_nonblocking(true);
    listener
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_port() -> ListenAddrs {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        ListenAddrs {
            proxy: any,
            admin: Some(any),
            mock_backend: None,
        }
    }

    #[test]
    fn the_listeners_go_only_to_a_socket_of_this_processs_user() {
        for euid in [1000, 0] {
            assert_eq!(hand_over_to(Waiting::Socket { owner: euid }, euid), Ok(()));
        }
        for (waiting, euid, said) in [
            (Waiting::Socket { owner: 1001 }, 1000, "uid 1001"),
            (Waiting::Socket { owner: 1000 }, 0, "uid 1000"),
            (Waiting::Socket { owner: 0 }, 1000, "uid 0"),
            (Waiting::Link, 1000, "symbolic link"),
            (Waiting::Other, 1000, "not a socket"),
        ] {
            let why = hand_over_to(waiting, euid).unwrap_err();
            assert!(why.contains(said), "{waiting:?} {euid}: {why}");
        }
    }

    #[test]
    fn port_zero_binds_a_port_of_its_own_for_each_listener() {
        let listeners = Listeners::bind(&any_port()).unwrap();
        let bound = listeners.local_addrs().unwrap();
        assert_ne!(bound.proxy.port(), 0);
        assert_ne!(bound.admin.unwrap().port(), 0);
        assert_ne!(bound.proxy, bound.admin.unwrap());
        assert_eq!(bound.mock_backend, None);
    }

    #[test]
    fn a_taken_address_is_an_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = Listeners::bind(&ListenAddrs {
            proxy: addr,
            admin: None,
            mock_backend: None,
        })
        .unwrap_err();
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[test]
    fn listeners_are_handed_over_under_the_addresses_they_are_bound_to() {
        let listeners = Listeners::bind(&any_port()).unwrap();
        let mut fds = Fds::new();
        listeners.register_for_upgrade(&mut fds).unwrap();
        let bound = listeners.local_addrs().unwrap();
        let admin = listeners.admin.as_ref().unwrap();
        assert_eq!(
            fds.get(&bound.proxy.to_string()),
            Some(&listeners.proxy.as_raw_fd())
        );
        assert_eq!(
            fds.get(&bound.admin.unwrap().to_string()),
            Some(&admin.as_raw_fd())
        );
    }
}
