//! What the pipeline needs of a client connection, whatever its protocol: [`Downstream`].
//! A protocol module implements it ([`super::h1`]); the pipeline and the relay use only it.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use bytes::BytesMut;
use http::HeaderValue;

use crate::api::failure::BodyError;
use crate::http1::Framing;
use crate::observe::exchange::Protocol;
use crate::policy::admit::RequestView;

/// A client connection as the pipeline sees it: the current request, its body, and a way
/// to answer. Connection state (keep-alive, unread bytes) is the implementor's own.
pub trait Downstream: Send {
    type Request<'a>: RequestView
    where
        Self: 'a;

    /// The current request's head.
    fn request(&self) -> Self::Request<'_>;

    /// The protocol the client speaks, for metrics and the access log.
    fn protocol(&self) -> Protocol;

    /// The connection's peer (the PROXY header's source, else the TCP peer), appended to
    /// `X-Forwarded-For`.
    fn client_ip(&self) -> Option<IpAddr>;

    /// Whether the client has cancelled the request (an HTTP/2 reset): it is not sent
    /// upstream then.
    fn cancelled(&mut self) -> bool {
        false
    }

    /// Whether the gateway itself cut the request off from its client (an HTTP/2 connection
    /// dropped at its drain deadline, or an answer the client did not read within
    /// `limits.client_send_timeout`): a request found gone then, or whose answer could not be
    /// sent, was cut by the gateway, not given up by its client.
    fn closed_by_gateway(&mut self) -> bool {
        false
    }

    /// The current request's head and body (read by [`Self::read_body`]) as they go upstream,
    /// with a watch on the client: a future that is ready once the client has gone (hung up
    /// the connection, reset the stream). It is polled only while the request waits for a
    /// backend connection, and a request whose client has gone is sent nowhere.
    fn outgoing(
        &mut self,
    ) -> (
        Self::Request<'_>,
        &[u8],
        impl Future<Output = ()> + Send + '_,
    );

    /// Reads the whole request body, refusing it as soon as it is known to exceed
    /// `max_bytes` (the excess is never buffered) or when it is not in within `timeout`.
    fn read_body(
        &mut self,
        max_bytes: usize,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), BodyError>> + Send;

    /// The body read by [`Self::read_body`].
    fn body(&self) -> &[u8];

    /// Sends one of the gateway's own answers, whole: `headers` then `body`. It takes the
    /// place of an answer started with [`Self::start_response`] that nothing was sent of. An
    /// error means the client went away.
    fn send_answer(
        &mut self,
        status: u16,
        headers: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send;

    /// Whether this client reads chunked framing (HTTP/1.1). One that does not gets a
    /// chunked answer decoded, and an answer of unknown length ends at the end of the stream.
    fn reads_chunked(&self) -> bool;

    /// Starts relaying the backend's answer: its status and the headers to pass on. `body`
    /// says how the body that follows in [`Self::out`] ends.
    fn start_response<'h>(
        &mut self,
        status: u16,
        reason: &[u8],
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        body: Framing,
    );

    /// Where the answer's body bytes go before [`Self::send`].
    fn out(&mut self) -> &mut BytesMut;

    /// Sends what [`Self::start_response`] and [`Self::out`] hold; `end` with the last of it.
    /// An error means the client went away.
    fn send(&mut self, end: bool) -> impl Future<Output = std::io::Result<()>> + Send;

    /// The answer under way cannot be completed (the backend broke mid-body, or the client
    /// did not take it in time): the client must not take what it got for a whole answer.
    fn abort(&mut self);
}

/// A header of the gateway's own, as the bytes a protocol writes.
pub fn header_bytes<'a>((name, value): &'a (&'static str, HeaderValue)) -> (&'a [u8], &'a [u8]) {
    (name.as_bytes(), value.as_bytes())
}
