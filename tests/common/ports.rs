//! Loopback ports for the processes tests start, chosen so that no other process takes them
//! between the choice and the bind, and a check that a process really listens on its own.
//!
//! A port "free a moment ago" that the kernel also hands out (its ephemeral range, for every
//! `bind(0)` and every outgoing connection on the machine) can be taken by anyone before the
//! process it was chosen for binds it; pingora then retries the bind for 30 s while the other
//! process answers on the port. So [`free_port`] chooses outside the ephemeral range, never
//! twice in one test process, and servers are waited for with [`listens_on`], which asks the
//! kernel which process owns the listening socket, rather than by connecting to the port.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use nix::sys::socket::{
    bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    SockaddrIn,
};

/// Ports this test process has handed out: each is handed out once.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Where the harness chooses ports when the kernel's ephemeral range leaves no room below it.
const LOWEST: u16 = 10_000;

/// A loopback port nothing listened on a moment ago, outside the kernel's ephemeral range
/// (so no `bind(0)` or outgoing connection on the machine can take it meanwhile), and never
/// handed out before by this process.
pub fn free_port() -> u16 {
    let (first, last) = ephemeral_range();
    let (lo, hi) = if first > LOWEST + 1000 {
        (LOWEST, first)
    } else {
        (last.saturating_add(1), u16::MAX)
    };
    let random = RandomState::new();
    let mut handed_out = HANDED_OUT.lock().unwrap();
    for attempt in 0u32..10_000 {
        let mut h = random.build_hasher();
        h.write_u32(attempt);
        let port = lo + (h.finish() % u64::from(hi - lo)) as u16;
        if handed_out.contains(&port) || TcpListener::bind(loopback(port)).is_err() {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
    panic!("no free loopback port in {lo}..{hi}");
}

/// `net.ipv4.ip_local_port_range`: the ports the kernel chooses itself.
fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap_or_else(|_| "32768 60999".into());
    let mut bounds = text.split_whitespace().map(|n| n.parse().unwrap());
    (bounds.next().unwrap(), bounds.next().unwrap())
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback address where nothing listens: a socket holds the port without listening, so
/// every connection is refused and no other process can bind it. A recording backend can
/// listen on it for a while ([`super::Backend::start_on`]); once that backend is dropped the
/// address refuses connections again.
pub struct ClosedPort {
    pub addr: SocketAddr,
    _hold: OwnedFd,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let hold = reusable_socket();
        bind_loopback(&hold, 0);
        let addr = nix::sys::socket::getsockname::<SockaddrIn>(raw(&hold)).unwrap();
        ClosedPort {
            addr: loopback(addr.port()),
            _hold: hold,
        }
    }

    /// A listener on this port (beside the socket that holds it).
    pub fn listen(&self) -> TcpListener {
        let socket = reusable_socket();
        bind_loopback(&socket, self.addr.port());
        listen(&socket, Backlog::new(128).unwrap()).unwrap();
        TcpListener::from(socket)
    }
}

/// A loopback address where a connect never completes: a listener that accepts nothing,
/// its accept queue filled, so the kernel drops every further SYN and the client retries
/// it for minutes, as with a backend behind a firewall that drops packets.
pub struct SilentPort {
    pub addr: SocketAddr,
    _listener: OwnedFd,
    _queued: Vec<std::net::TcpStream>,
}

impl SilentPort {
    pub fn new() -> SilentPort {
        let listener = reusable_socket();
        bind_loopback(&listener, 0);
        listen(&listener, Backlog::new(0).unwrap()).unwrap();
        let addr = nix::sys::socket::getsockname::<SockaddrIn>(raw(&listener)).unwrap();
        let addr = loopback(addr.port());
        let mut queued = Vec::new();
        // Connect until one does not complete: the queue is full from there on.
        while let Ok(conn) =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
        {
            queued.push(conn);
            assert!(
                queued.len() < 64,
                "the accept queue of {addr} does not fill"
            );
        }
        SilentPort {
            addr,
            _listener: listener,
            _queued: queued,
        }
    }
}

/// A TCP socket that may share its port with the others of this module (`SO_REUSEPORT`).
fn reusable_socket() -> OwnedFd {
    let socket = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    setsockopt(&socket, sockopt::ReusePort, &true).unwrap();
    socket
}

fn bind_loopback(socket: &OwnedFd, port: u16) {
    bind(raw(socket), &SockaddrIn::new(127, 0, 0, 1, port)).unwrap();
}

fn raw(socket: &OwnedFd) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    socket.as_raw_fd()
}

/// Whether process `pid` itself holds a socket listening on TCP `port` (any local address):
/// its open file descriptors against the kernel's table of listening sockets.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: BTreeSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    ["tcp", "tcp6"].iter().any(|table| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        text.lines().skip(1).any(|row| {
            let cells: Vec<&str> = row.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) =
                (cells.get(1), cells.get(3), cells.get(9))
            else {
                return false;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            *state == "0A" && local_port == Some(port) && inodes.contains(*inode)
        })
    })
}
