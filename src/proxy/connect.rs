//! Making new backend connections: [`Connect`], pingora's [`TransportConnector`] (TCP, TLS)
//! in the gateway and an in-memory stand-in in tests.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use pingora::connectors::TransportConnector;
use pingora::protocols::Stream;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType};

/// A boxed connect: connecting (and TLS) is a large future, and rare; kept inline it would
/// size every client connection's task, idle or not.
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = Result<Stream, Box<Error>>> + Send + 'a>>;

/// Makes new connections to backends.
pub trait Connect: Send + Sync {
    /// A connection to `peer` (TCP, and TLS when it says so), given up after `limit`.
    fn connect<'a>(&'a self, peer: &'a HttpPeer, limit: Duration) -> ConnectFuture<'a>;
}

impl Connect for TransportConnector {
    /// The limit is the runtime's timer, not the peer's `connection_timeout`: pingora's own
    /// timeouts start a clock thread that wakes 100 times a second for the life of the
    /// process, idle or not.
    fn connect<'a>(&'a self, peer: &'a HttpPeer, limit: Duration) -> ConnectFuture<'a> {
        Box::pin(async move {
            match tokio::time::timeout(limit, self.new_stream(peer)).await {
                Ok(connected) => connected,
                Err(_) => Error::e_explain(
                    ErrorType::ConnectTimedout,
                    format!("no connection within {}", humantime::format_duration(limit)),
                ),
            }
        })
    }
}
