//! HTTP/2 clients, on pingora's HTTP/2 server (the `h2` crate): the connection loop and
//! [`H2Stream`], the pipeline's [`Downstream`] for one stream.
//!
//! Every stream goes through the same pipeline as an HTTP/1.1 request; upstream stays
//! HTTP/1.1 over the same pool. The loop adds what pingora's own lacks, so that a client
//! cannot hold the gateway with frames alone:
//! - a handshake deadline, and connections with no stream in flight closed (GOAWAY) after
//!   `limits.client_header_timeout_ms`, whatever PING, SETTINGS or other frames they send
//!   (a stream that crossed the GOAWAY on the wire is still served to its end);
//! - at most `limits.h2_max_concurrent_streams` streams served at once per connection, a
//!   stream past it refused (`REFUSED_STREAM`) rather than queued, since streams the client
//!   resets stop counting for the `h2` crate while their work would go on (rapid reset);
//! - a stream the client has reset is never sent upstream;
//! - header blocks bounded (their size and CONTINUATION frames, by `h2`), the flow-control
//!   windows at their defaults, and on shutdown a GOAWAY that lets open streams finish.
//!
//! A connection the gateway drops itself at its drain deadline, with streams still open,
//! has those streams' requests recorded as cut by the gateway, not given up by their client
//! ([`Downstream::closed_by_gateway`]): to the stream, the end of its connection looks the
//! same either way. So has a stream whose answer the client did not take within
//! `limits.client_send_timeout` (pingora's write timeout).

use std::future::Future;
use std::net::IpAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v2::server::{self as h2server, H2Accept, HttpSession};
use pingora::protocols::{Digest, Stream};
use pingora::server::ShutdownWatch;
use pingora::ErrorType;
use tokio::sync::Notify;
use tokio::time::timeout;

use super::downstream::Downstream;
use super::ProxyApp;
use crate::api::failure::BodyError;
use crate::config::{LimitsConfig, Snapshot};
use crate::http1::{is_bodiless_status, Framing};
use crate::observe::exchange::Protocol;
use crate::policy::admit::{BodyLength, RequestView};

/// The 24 bytes an HTTP/2 client with prior knowledge opens with (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams whose head pingora refused as malformed, per connection, before it is closed.
const MAX_MALFORMED_STREAMS: usize = 32;

/// How long a connection closed for idleness stays open with no stream in flight after its
/// GOAWAY, for the GOAWAY to reach the client: a client that never acks the GOAWAY's PING
/// would hold it open otherwise (`h2` sends the final GOAWAY, and closes, only on that ack).
const IDLE_DRAIN: Duration = Duration::from_secs(1);

/// The `h2` settings for a connection under `limits`.
fn h2_options(limits: &LimitsConfig) -> h2server::H2Options {
    let mut options = h2server::default_h2_options();
    options.max_concurrent_streams(limits.h2_max_concurrent_streams);
    // Header blocks up to four times what admission accepts reach admission, which answers
    // the documented 431; `h2` answers larger ones itself, and resets the connection past
    // four times this.
    let per_field = 32 * limits.max_headers;
    let list = 4 * (limits.max_header_bytes + per_field);
    options.max_header_list_size(u32::try_from(list).unwrap_or(u32::MAX));
    options
}

impl ProxyApp {
    /// Serves one HTTP/2 connection until the client or a shutdown ends it.
    pub(super) async fn serve_h2(
        self: &Arc<Self>,
        stream: Stream,
        client: Option<IpAddr>,
        shutdown: &ShutdownWatch,
    ) {
        let limits = self.config.load().limits.clone();
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let handshake = h2server::handshake(stream, Some(h2_options(&limits)));
        let mut conn = match timeout(limits.client_header_timeout, handshake).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "HTTP/2 handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("HTTP/2 preface not received in time; closing");
                return;
            }
        };
        self.telemetry.connection_opened(Protocol::Http2);
        let streams = Arc::new(StreamSlots::new(limits.h2_max_concurrent_streams as usize));
        let mut shutdown = shutdown.clone();
        let mut drain = self.drain.watch();
        let grace = self.grace;
        // Once an idle connection's GOAWAY is out, a stream the client opened as it came (the
        // two crossed on the wire) is served to its end, under its own timeouts, and the
        // connection ends once none has been in flight for `IDLE_DRAIN`.
        let mut idle_closed = false;
        // Once a drain's GOAWAY is out, open streams finish until this deadline, then are cut
        // with the connection: a drain gets its own, during an idle close too (`h2` sends no
        // second GOAWAY, the first one being out).
        let mut drain_deadline = None;
        if *shutdown.borrow() || *drain.borrow() {
            conn.graceful_shutdown();
            drain_deadline = Some(Instant::now() + grace);
        }
        let mut malformed = 0;
        loop {
            let idle = streams.idle_for(if idle_closed {
                IDLE_DRAIN
            } else {
                limits.client_header_timeout
            });
            let deadline = async {
                match drain_deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            let accepted = tokio::select! {
                biased;
                _ = shutdown.changed(), if drain_deadline.is_none() => {
                    conn.graceful_shutdown();
                    drain_deadline = Some(Instant::now() + grace);
                    continue;
                }
                _ = drain.changed(), if drain_deadline.is_none() => {
                    conn.graceful_shutdown();
                    drain_deadline = Some(Instant::now() + grace);
                    continue;
                }
                () = deadline => {
                    streams.close_by_gateway();
                    return;
                }
                accepted = HttpSession::from_h2_conn(&mut conn, digest.clone()) => accepted,
                () = idle, if idle_closed || drain_deadline.is_none() => {
                    if idle_closed {
                        tracing::debug!("HTTP/2 connection idle after its GOAWAY; closing");
                        return;
                    }
                    tracing::debug!("HTTP/2 connection idle; closing");
                    conn.graceful_shutdown();
                    idle_closed = true;
                    continue;
                }
            };
            match accepted {
                Ok(Some(H2Accept::Session(session))) => {
                    self.start_stream(session, client, &streams)
                }
                Ok(Some(H2Accept::Rejected)) => {
                    malformed += 1;
                    if malformed >= MAX_MALFORMED_STREAMS {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP/2 connection ended");
                    return;
                }
            }
        }
    }

    /// Serves `session` on its own task, or refuses it when the connection is at its limit.
    fn start_stream(
        self: &Arc<Self>,
        mut session: HttpSession,
        client: Option<IpAddr>,
        streams: &Arc<StreamSlots>,
    ) {
        let Some(slot) = streams.take() else {
            session.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
            return;
        };
        let app = self.clone();
        tokio::spawn(async move {
            let snap = app.config.load_full();
            let mut stream = H2Stream::new(session, client, slot, &snap);
            app.serve(&mut stream, &snap).await;
            stream.finish();
        });
    }
}

/// The streams a connection serves at once: bounded, counted, and watched for idleness.
struct StreamSlots {
    max: usize,
    in_flight: AtomicUsize,
    /// Streams started so far: idleness is a period in which none started or ran.
    started: AtomicU64,
    finished: Notify,
    /// Set before the gateway drops the connection at a deadline of its own: the streams
    /// still open on it were cut by the gateway.
    closed_by_gateway: AtomicBool,
}

/// A stream's place among its connection's [`StreamSlots`], given back when it drops.
struct StreamSlot(Arc<StreamSlots>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.finished.notify_waiters();
    }
}

impl StreamSlots {
    fn new(max: usize) -> Self {
        StreamSlots {
            max,
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            finished: Notify::new(),
            closed_by_gateway: AtomicBool::new(false),
        }
    }

    /// Notes that the gateway is about to drop the connection with whatever streams are open.
    fn close_by_gateway(&self) {
        let open = self.in_flight.load(Ordering::Acquire);
        if open > 0 {
            tracing::debug!(
                streams = open,
                "HTTP/2 connection past its deadline with streams open; closing"
            );
        }
        self.closed_by_gateway.store(true, Ordering::Release);
    }

    /// A slot for one more stream, unless the connection is at its limit.
    fn take(self: &Arc<Self>) -> Option<StreamSlot> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()?;
        self.started.fetch_add(1, Ordering::AcqRel);
        Some(StreamSlot(self.clone()))
    }

    /// Resolves once no stream has been in flight, nor started, for `period`.
    async fn idle_for(&self, period: Duration) {
        loop {
            let finished = self.finished.notified();
            if self.in_flight.load(Ordering::Acquire) > 0 {
                finished.await;
                continue;
            }
            let started = self.started.load(Ordering::Acquire);
            tokio::time::sleep(period).await;
            if self.in_flight.load(Ordering::Acquire) == 0
                && self.started.load(Ordering::Acquire) == started
            {
                return;
            }
        }
    }
}

/// One HTTP/2 stream: its request, its body, and the answer being written.
pub(super) struct H2Stream {
    session: HttpSession,
    /// The request's head, taken from the session so that the request can be sent while the
    /// session is watched for a reset ([`Downstream::outgoing`]).
    head: RequestHeader,
    client: Option<IpAddr>,
    /// The stream's place on its connection, given back when it ends.
    slot: StreamSlot,
    /// The request body, read whole by [`Downstream::read_body`].
    body: BytesMut,
    /// The answer's head, written with the first bytes of its body.
    pending_head: Option<Box<ResponseHeader>>,
    /// The answer's body bytes not yet sent.
    out: BytesMut,
    /// The current request is a HEAD: its answers have no body.
    head_only: bool,
    /// The answer has ended the stream: nothing more may be written.
    ended: bool,
    /// A write gave up on a client that did not take it within `limits.client_send_timeout`:
    /// the gateway cut the stream ([`Downstream::closed_by_gateway`]).
    send_timed_out: bool,
}

impl H2Stream {
    fn new(
        mut session: HttpSession,
        client: Option<IpAddr>,
        slot: StreamSlot,
        snap: &Snapshot,
    ) -> Self {
        session.set_write_timeout(Some(snap.limits.client_send_timeout));
        // What is left in the session is an empty head (allocated nothing): the session reads
        // its own only to drain a body and to describe itself, neither of which the gateway
        // asks of it.
        let empty = RequestHeader::from(http::Request::new(()).into_parts().0);
        let head = std::mem::replace(session.req_header_mut(), empty);
        let head_only = head.method == http::Method::HEAD;
        H2Stream {
            session,
            head,
            client,
            slot,
            body: BytesMut::new(),
            pending_head: None,
            out: BytesMut::new(),
            head_only,
            ended: false,
            send_timed_out: false,
        }
    }

    /// Ends the stream if the pipeline left it open (it never does on success).
    fn finish(&mut self) {
        let _ = self.session.finish();
    }

    /// A response head with `headers`, and the framing header the gateway writes itself.
    fn response_head<'h>(
        status: u16,
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        length: Option<u64>,
    ) -> Option<Box<ResponseHeader>> {
        let mut head = ResponseHeader::build_no_case(status, None).ok()?;
        for (name, value) in headers {
            let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            else {
                continue;
            };
            let _ = head.append_header(name, value);
        }
        if let Some(n) = length.filter(|_| !is_bodiless_status(status)) {
            let _ = head.insert_header(http::header::CONTENT_LENGTH, n);
        }
        Some(Box::new(head))
    }

    /// A failed write of the answer's body as the pipeline sees it, noting one the client did
    /// not take in time.
    fn write_failed(&mut self, e: Box<pingora::Error>) -> std::io::Error {
        self.send_timed_out |= *e.etype() == ErrorType::WriteTimedout;
        std::io::Error::other(e)
    }

    /// How the stream has ended, without waiting: pending while it is open, `Ok` with the
    /// client's reset, `Err` when its connection has ended.
    fn poll_ended(&mut self) -> Poll<pingora::Result<h2::Reason>> {
        pin!(self.session.idle()).poll(&mut Context::from_waker(Waker::noop()))
    }
}

impl RequestView for &RequestHeader {
    fn method(&self) -> &str {
        self.method.as_str()
    }

    fn path(&self) -> &str {
        self.uri.path()
    }

    fn query(&self) -> Option<&str> {
        self.uri.query()
    }

    fn target_len(&self) -> usize {
        self.uri.path_and_query().map_or(0, |p| p.as_str().len())
    }

    fn authority(&self) -> Option<&str> {
        self.uri.authority().map(|a| a.as_str())
    }

    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
    }

    fn header_count(&self) -> usize {
        self.headers.len()
    }

    fn headers_named<'n>(&'n self, name: &'n str) -> impl Iterator<Item = &'n [u8]> {
        self.headers.get_all(name).iter().map(HeaderValue::as_bytes)
    }

    fn body_length(&self) -> BodyLength {
        // The stream's DATA frames frame the body; a content-length, when sent, must agree
        // with them (`h2` checks) and is the declared length.
        let mut lengths = self.headers_named("content-length");
        match (lengths.next(), lengths.next()) {
            (None, _) => BodyLength::Unknown,
            (Some(v), None) => std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map_or(BodyLength::Ambiguous, BodyLength::Declared),
            (Some(_), Some(_)) => BodyLength::Ambiguous,
        }
    }

    fn host_required(&self) -> bool {
        // `:authority` or `Host` (RFC 9113 §8.3.1): every request here names a path, so it
        // has authority information to convey.
        true
    }
}

impl Downstream for H2Stream {
    type Request<'a> = &'a RequestHeader;

    fn request(&self) -> &RequestHeader {
        &self.head
    }

    fn protocol(&self) -> Protocol {
        Protocol::Http2
    }

    fn client_ip(&self) -> Option<IpAddr> {
        self.client
    }

    async fn read_body(
        &mut self,
        max_bytes: usize,
        body_timeout: Duration,
    ) -> Result<(), BodyError> {
        let read = async {
            while let Some(chunk) = self
                .session
                .read_body_bytes()
                .await
                .map_err(|e| BodyError::Stream(e))?
            {
                if self.body.len() + chunk.len() > max_bytes {
                    return Err(BodyError::TooLarge { max: max_bytes });
                }
                self.body.extend_from_slice(&chunk);
            }
            Ok(())
        };
        timeout(body_timeout, read)
            .await
            .unwrap_or(Err(BodyError::Timeout))
    }

    fn body(&self) -> &[u8] {
        &self.body
    }

    fn cancelled(&mut self) -> bool {
        self.poll_ended().is_ready()
    }

    fn closed_by_gateway(&mut self) -> bool {
        // A stream its client reset before the connection closed stays the client's doing.
        self.send_timed_out
            || (self.slot.0.closed_by_gateway.load(Ordering::Acquire)
                && !matches!(self.poll_ended(), Poll::Ready(Ok(_))))
    }

    fn outgoing(&mut self) -> (&RequestHeader, &[u8], impl Future<Output = ()> + Send + '_) {
        let reset = self.session.idle();
        (&self.head, &self.body, async {
            let _ = reset.await;
        })
    }

    async fn send_answer(
        &mut self,
        status: u16,
        headers: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> std::io::Result<()> {
        let head = Self::response_head(status, headers.iter().copied(), Some(body.len() as u64))
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let bodiless = self.head_only || body.is_empty() || is_bodiless_status(status);
        // An answer started and not sent is replaced.
        self.pending_head = None;
        self.out.clear();
        self.ended = true;
        self.session
            .write_response_header(head, bodiless)
            .map_err(std::io::Error::other)?;
        if !bodiless {
            self.session
                .write_body(Bytes::copy_from_slice(body), true)
                .await
                .map_err(|e| self.write_failed(e))?;
        }
        Ok(())
    }

    fn reads_chunked(&self) -> bool {
        // DATA frames frame the body: chunked coding has no place on HTTP/2.
        false
    }

    fn start_response<'h>(
        &mut self,
        status: u16,
        _reason: &[u8],
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        body: Framing,
    ) {
        let length = match body {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        self.pending_head = Self::response_head(status, headers, length);
        self.out.clear();
    }

    fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    async fn send(&mut self, end: bool) -> std::io::Result<()> {
        if let Some(head) = self.pending_head.take() {
            if is_bodiless_status(head.status.as_u16()) || self.head_only {
                self.out.clear();
            }
            self.ended = end && self.out.is_empty();
            self.session
                .write_response_header(head, self.ended)
                .map_err(std::io::Error::other)?;
        }
        if self.ended {
            self.out.clear();
            return Ok(());
        }
        if self.out.is_empty() && !end {
            return Ok(());
        }
        self.ended = end;
        let data = self.out.split().freeze();
        self.session
            .write_body(data, end)
            .await
            .map_err(|e| self.write_failed(e))
    }

    fn abort(&mut self) {
        self.session
            .shutdown_with_reason(h2::Reason::INTERNAL_ERROR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_serves_at_most_its_streams_and_idles_only_when_none_ran() {
        let slots = Arc::new(StreamSlots::new(2));
        let (a, b) = (slots.take().unwrap(), slots.take().unwrap());
        assert!(slots.take().is_none(), "a third stream is refused");
        drop(a);
        let c = slots.take().expect("a slot given back is taken again");
        let period = Duration::from_secs(10);
        // Not idle while streams run, nor for a period in which one started.
        let idle = tokio::spawn({
            let slots = slots.clone();
            async move { slots.idle_for(period).await }
        });
        tokio::time::sleep(period * 3).await;
        assert!(!idle.is_finished());
        drop((b, c));
        tokio::time::sleep(period / 2).await;
        let d = slots.take().unwrap();
        drop(d);
        tokio::time::sleep(period).await;
        assert!(!idle.is_finished(), "a stream started within the period");
        tokio::time::sleep(period * 2).await;
        assert!(idle.is_finished());
    }
}
