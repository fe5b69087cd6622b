//! Making new backend connections: [`Connect`], pingora's [`TransportConnector`] (TCP, TLS)
//! in the gateway and an in-memory stand-in in tests.

use std::future::Future;
use std::pin::Pin;

use pingora::connectors::TransportConnector;
use pingora::protocols::Stream;
use pingora::upstreams::peer::HttpPeer;
use pingora::Error;

/// A boxed connect: connecting (and TLS) is a large future, and rare; kept inline it would
/// size every client connection's task, idle or not.
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = Result<Stream, Box<Error>>> + Send + 'a>>;

/// Makes new connections to backends.
pub trait Connect: Send + Sync {
    fn connect<'a>(&'a self, peer: &'a HttpPeer) -> ConnectFuture<'a>;
}

impl Connect for TransportConnector {
    fn connect<'a>(&'a self, peer: &'a HttpPeer) -> ConnectFuture<'a> {
        Box::pin(self.new_stream(peer))
    }
}
