//! Making new backend connections: [`Connect`]; the gateway's [`BackendConnector`] (plain TCP
//! on a [`TcpConn`], TLS through pingora's [`TransportConnector`]) and an in-memory stand-in
//! in tests.

use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::time::Duration;

use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::protocols::Stream;
use pingora::upstreams::peer::{HttpPeer, Peer};
use pingora::{Error, ErrorType};
use tokio::net::TcpStream;

use super::tcp::TcpConn;

/// A boxed connect: connecting (and TLS) is a large future, and rare; kept inline it would
/// size every client connection's task, idle or not.
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = Result<Stream, Box<Error>>> + Send + 'a>>;

/// Makes new connections to backends.
pub trait Connect: Send + Sync {
    /// A connection to `peer` (TCP, and TLS when it says so), given up after `limit`.
    fn connect<'a>(&'a self, peer: &'a HttpPeer, limit: Duration) -> ConnectFuture<'a>;
}

/// The gateway's connections to its backends. A plaintext backend's is the socket alone, a
/// [`TcpConn`] as a client's is: pingora's L4 stream would add its digests and timing (most of
/// a kilobyte per pooled connection, and two clock reads per answer waited for) that nothing
/// here reads. A TLS backend's goes through pingora's connector (its roots, SNI, verification).
pub struct BackendConnector {
    tls: TransportConnector,
}

impl Default for BackendConnector {
    fn default() -> Self {
        BackendConnector {
            tls: TransportConnector::new(Some(ConnectorOptions::new(0))),
        }
    }
}

impl Connect for BackendConnector {
    /// The limit is the runtime's timer, not the peer's `connection_timeout`: pingora's own
    /// timeouts start a clock thread that wakes 100 times a second for the life of the
    /// process, idle or not.
    fn connect<'a>(&'a self, peer: &'a HttpPeer, limit: Duration) -> ConnectFuture<'a> {
        Box::pin(async move {
            let connected = async {
                if peer.tls() {
                    self.tls.new_stream(peer).await
                } else {
                    plain(peer).await
                }
            };
            match tokio::time::timeout(limit, connected).await {
                Ok(connected) => connected,
                Err(_) => Error::e_explain(
                    ErrorType::ConnectTimedout,
                    format!("no connection within {}", humantime::format_duration(limit)),
                ),
            }
        })
    }
}

/// A plain TCP connection to `peer`, with Nagle off (a request's head and body go out in one
/// write, and wait for nothing); its errors typed as pingora types its own.
async fn plain(peer: &HttpPeer) -> Result<Stream, Box<Error>> {
    let Some(addr) = peer.address().as_inet().copied() else {
        return Error::e_explain(ErrorType::SocketError, "a backend address that is not TCP");
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| {
        let etype = match e.kind() {
            ErrorKind::ConnectionRefused => ErrorType::ConnectRefused,
            ErrorKind::TimedOut => ErrorType::ConnectTimedout,
            ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable => ErrorType::ConnectNoRoute,
            _ => ErrorType::ConnectError,
        };
        Error::because(etype, format!("connecting to {addr}"), e)
    })?;
    tcp.set_nodelay(true)
        .map_err(|e| Error::because(ErrorType::SocketError, "setting TCP_NODELAY", e))?;
    Ok(Box::new(TcpConn::new(tcp)))
}
