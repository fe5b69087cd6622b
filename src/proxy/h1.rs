//! HTTP/1.1 clients: the connection loop, and [`H1Connection`], the pipeline's
//! [`Downstream`] for one HTTP/1.1 connection.
//!
//! pingora accepts the connection (TCP or TLS); from there the gateway speaks HTTP/1.1 with
//! [`crate::http1`]: heads parsed into positions within one read buffer per connection, so a
//! request costs one parse and no header maps, bodies held whole (up to
//! `limits.max_body_bytes`) so that they are checked before a byte goes upstream, pipelined
//! requests answered in order, and the connection's state (keep-alive, bytes still unread)
//! kept here rather than passed around.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::Cache;
use bytes::{Buf, BufMut, BytesMut};
use pingora::protocols::http::date::get_cached_date;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use tokio::io::AsyncWriteExt;

use super::downstream::Downstream;
use super::h2::PREFACE;
use super::hangup;
use super::tcp::TcpConn;
use super::timer::{timeout_once_waiting, LazyTimer, TimedOut};
use super::ProxyApp;
use crate::api::failure::{BodyError, UnreadableHead};
use crate::config::{LimitsConfig, Snapshot};
use crate::http1::{
    is_bodiless_status, reserve_for_read, ChunkedDecoder, Framing, FramingError, Request,
    RequestHead, ResponseWriter, FIRST_BUFFER,
};
use crate::observe::exchange::Protocol;
use crate::observe::in_flight::Held;
use crate::policy::admit::{BodyLength, RequestView};

/// After a refusal that closes the connection with request bytes still unread, the gateway
/// reads and drops them for this long (at most [`LINGER_BYTES`]) so that the client gets the
/// answer rather than a reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 4 * 1024 * 1024;

/// Buffers larger than this are not kept from one request to the next.
const KEPT_BUFFER: usize = 64 * 1024;

/// Where the current request's body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    /// The body is unread: its framing, or why that cannot be trusted.
    Unread(Result<Framing, FramingError>),
    /// The body is read: `raw` bytes after the head in `buf` are this request's, and the body
    /// is in `buf` (after the head) or, when it was chunked, in `decoded`.
    Read { raw: usize, chunked: bool },
    /// Unread bytes may be left that cannot be skipped: the connection must close.
    Broken,
}

/// One client connection: its stream, what has been read, and buffers kept from one request
/// to the next.
pub(super) struct H1Connection {
    stream: Stream,
    /// The connection's peer.
    client: Option<IpAddr>,
    /// What has been read: the current request's head and body, then any pipelined bytes.
    buf: BytesMut,
    head: RequestHead,
    /// The current request's body as decoded from chunked framing.
    decoded: BytesMut,
    /// The answer being written.
    out: BytesMut,
    /// The read buffer's first size for the next request: [`FIRST_BUFFER`], or what the
    /// last request took (up to [`KEPT_BUFFER`]), so that a client whose requests are larger
    /// sends each in one read.
    first_read: usize,
    body: BodyState,
    /// The connection stays open after the current exchange.
    keep_alive: bool,
    /// What `keep_alive` was before a relayed answer whose body ends with the connection
    /// turned it off: restored when the gateway's own answer takes that one's place.
    kept_before_answer: Option<bool>,
    /// The current request is a HEAD: its answers have no body.
    head_only: bool,
    /// Requests served on the connection so far.
    requests: u64,
    /// The current request's snapshot's limits on the client's pace and its body.
    send_timeout: Duration,
    body_timeout: Duration,
    max_body_bytes: usize,
    /// A write gave up on a client that did not read it within `send_timeout`: the gateway
    /// cut the connection, which serves no more requests ([`Downstream::closed_by_gateway`]).
    send_timed_out: bool,
}

impl ProxyApp {
    /// Serves one HTTP/1.1 connection until either side ends it. A plaintext connection that
    /// opens with the HTTP/2 preface is handed back, its bytes unread, to be served as h2c.
    /// `first_request` is released once the first request is over: a drain waits for it, so a
    /// connection accepted just before a stop is answered, even with `Connection: close`.
    pub(super) async fn serve_h1(
        &self,
        stream: Stream,
        client: Option<IpAddr>,
        mut first_request: Option<Held>,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // TLS clients choose HTTP/2 by ALPN; only a plaintext one opens with the preface.
        let mut sniff_h2 = self.http2 && stream.get_ssl_digest().is_none();
        let mut c = H1Connection::new(stream, client);
        let mut config = Cache::new(&*self.config);
        // One timer for what the connection waits for between requests: each head, and the
        // linger at its close.
        let mut timer = LazyTimer::default();
        loop {
            // The whole head must arrive in time (a slowloris client is cut off), and an idle
            // kept-alive connection waits no longer, by the limits current when it starts.
            let limits = &config.load().limits;
            let (wait, most) = (limits.client_header_timeout, longest_head(limits));
            let head = timer.limit(wait, c.read_head(most, sniff_h2)).await;
            if std::mem::take(&mut sniff_h2) || c.requests == 0 {
                if matches!(head, Ok(Ok(HeadRead::Http2Preface))) {
                    return c.into_rewound();
                }
                self.telemetry.connection_opened(Protocol::Http1);
            }
            // One snapshot per request, from its complete head to its end: a reload never
            // changes a request in flight.
            let snap: Arc<Snapshot> = Arc::clone(config.load());
            c.apply_limits(&snap.limits);
            match head {
                Ok(Ok(HeadRead::Ready)) => {
                    c.start_request(!*shutdown.borrow() && !self.drain.started());
                    // Boxed: inline, the pipeline's state would size every connection's
                    // future, idle ones included (one allocation per request instead).
                    Box::pin(self.serve(&mut c, &snap)).await;
                }
                Ok(Err(unreadable)) => {
                    c.keep_alive = false;
                    c.head_only = false;
                    Box::pin(self.refuse_unreadable(&mut c, &snap, unreadable)).await;
                }
                Ok(Ok(HeadRead::Closed | HeadRead::Http2Preface)) => return None,
                Err(_) => {
                    tracing::debug!("request header not received in time; closing");
                    return None;
                }
            }
            c.requests += 1;
            drop(first_request.take());
            if !c.keep_alive {
                if !matches!(c.body, BodyState::Read { .. }) {
                    // Request bytes may be left unread: let the client read its answer first.
                    c.linger(&mut timer).await;
                }
                return None;
            }
            c.finish_request();
        }
    }
}

/// What reading a request head came to.
enum HeadRead {
    /// A whole head is in the buffer.
    Ready,
    /// The client closed (or broke) the connection first, which needs no answer.
    Closed,
    /// The connection opens with the HTTP/2 preface.
    Http2Preface,
}

/// The most bytes a head the limits admit can take, with each line's separators.
fn longest_head(limits: &LimitsConfig) -> usize {
    limits.max_uri_bytes + limits.max_header_bytes + 4 * limits.max_headers + 64
}

/// How far `buf` matches the HTTP/2 preface.
fn preface_match(buf: &[u8]) -> Option<bool> {
    let n = buf.len().min(PREFACE.len());
    (buf[..n] == PREFACE[..n]).then_some(n == PREFACE.len())
}

impl H1Connection {
    fn new(stream: Stream, client: Option<IpAddr>) -> Self {
        H1Connection {
            stream,
            client,
            // Allocated on first use: a connection that sends nothing costs no buffers.
            buf: BytesMut::new(),
            head: RequestHead::default(),
            decoded: BytesMut::new(),
            out: BytesMut::new(),
            first_read: FIRST_BUFFER,
            body: BodyState::Broken,
            keep_alive: false,
            kept_before_answer: None,
            head_only: false,
            requests: 0,
            send_timeout: Duration::ZERO,
            body_timeout: Duration::ZERO,
            max_body_bytes: 0,
            send_timed_out: false,
        }
    }

    fn view(&self) -> Request<'_> {
        self.head.view(&self.buf)
    }

    /// Takes the current request's limits on the client's pace and body.
    fn apply_limits(&mut self, limits: &LimitsConfig) {
        self.send_timeout = limits.client_send_timeout;
        self.body_timeout = limits.client_body_timeout;
        self.max_body_bytes = limits.max_body_bytes;
    }

    /// Sets up the state of the request whose head was just read.
    fn start_request(&mut self, may_keep_alive: bool) {
        self.head_only = self.head.method_is_head;
        self.keep_alive = may_keep_alive && self.head.wants_keep_alive();
        self.body = BodyState::Unread(self.head.framing());
    }

    /// Reads more bytes; `Ok(0)` at the end of the stream.
    ///
    /// While nothing can be read and nothing is kept, the connection waits without a read
    /// buffer or header table (as nginx frees a keepalive connection's): one that sends
    /// nothing, or waits for its next request, holds neither, and the read when bytes come
    /// is the only system call.
    async fn fill(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| {
            reserve_for_read(&mut self.buf, self.first_read);
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf);
            if read.is_pending() && self.buf.is_empty() {
                self.buf = BytesMut::new();
                self.head.release();
            }
            read
        })
        .await
    }

    /// Reads until a whole request head is in (refused past `most` bytes), or, with
    /// `sniff_h2`, the HTTP/2 preface.
    async fn read_head(&mut self, most: usize, sniff_h2: bool) -> Result<HeadRead, UnreadableHead> {
        self.body = BodyState::Broken;
        loop {
            if !self.buf.is_empty() {
                match preface_match(&self.buf).filter(|_| sniff_h2) {
                    Some(true) => return Ok(HeadRead::Http2Preface),
                    // Part of the preface: more must come before anything is parsed.
                    Some(false) => {}
                    None => match self.head.parse(&self.buf) {
                        Ok(true) => return Ok(HeadRead::Ready),
                        Ok(false) => {}
                        Err(e) => return Err(e.into()),
                    },
                }
                if self.buf.len() > most {
                    return Err(if self.buf.contains(&b'\n') {
                        UnreadableHead::TooLarge
                    } else {
                        UnreadableHead::TargetTooLong
                    });
                }
            }
            if !matches!(self.fill().await, Ok(n) if n > 0) {
                return Ok(HeadRead::Closed);
            }
        }
    }

    /// The connection's stream with what was read of it put back, for the HTTP/2 server to
    /// read from the start.
    fn into_rewound(self) -> Option<Stream> {
        match self.stream.into_any().downcast::<TcpConn>() {
            Ok(mut tcp) => {
                tcp.rewind(&self.buf);
                Some(tcp)
            }
            Err(_) => {
                tracing::debug!("an HTTP/2 preface on a stream that cannot be rewound; closing");
                None
            }
        }
    }

    /// Reads the whole body, refusing it as soon as it is known to exceed `max` (the excess
    /// is never buffered).
    async fn read_body_framed(&mut self, framing: Framing, max: usize) -> Result<(), BodyError> {
        let start = self.head.len;
        match framing {
            Framing::Length(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n > max {
                    return Err(BodyError::TooLarge { max });
                }
                self.send_continue(start + n).await?;
                while self.buf.len() < start + n {
                    self.buf.reserve(start + n - self.buf.len());
                    self.fill_body().await?;
                }
                self.body = BodyState::Read {
                    raw: n,
                    chunked: false,
                };
            }
            Framing::Chunked => {
                self.send_continue(usize::MAX).await?;
                let mut decoder = ChunkedDecoder::default();
                let mut raw = 0;
                self.decoded.clear();
                loop {
                    let (decoded, input) = (&mut self.decoded, &self.buf[start + raw..]);
                    let (used, done) = decoder
                        .decode(input, |data| decoded.extend_from_slice(data))
                        .map_err(BodyError::Chunked)?;
                    raw += used;
                    if self.decoded.len() > max {
                        return Err(BodyError::TooLarge { max });
                    }
                    if done {
                        break;
                    }
                    // Decoded bytes are kept apart: drop the raw ones so a large body is not
                    // held twice.
                    self.buf.truncate(start);
                    raw = 0;
                    self.fill_body().await?;
                }
                self.body = BodyState::Read { raw, chunked: true };
            }
            Framing::UntilClose => return Err(BodyError::Unframed),
        }
        Ok(())
    }

    /// Reads more of a body whose end has not come yet.
    async fn fill_body(&mut self) -> Result<(), BodyError> {
        match self.fill().await {
            Ok(0) => Err(BodyError::Truncated),
            Ok(_) => Ok(()),
            Err(e) => Err(BodyError::ClientGone(e)),
        }
    }

    /// Whether the client waits for `100 Continue` before sending a body that ends at `end`
    /// in `buf`.
    fn awaits_continue(&self, end: usize) -> bool {
        self.buf.len() < end && !self.head.http10 && self.view().has_token("expect", "100-continue")
    }

    /// Answers `Expect: 100-continue` when the body (ending at `end` in `buf`) is not all in.
    async fn send_continue(&mut self, end: usize) -> Result<(), BodyError> {
        if !self.awaits_continue(end) {
            return Ok(());
        }
        self.out.clear();
        self.out.put_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        self.send_out().await.map_err(BodyError::ClientGone)
    }

    /// Reads and drops an unread body of `n` declared bytes, keeping what follows it.
    async fn skip_body(&mut self, n: usize) -> bool {
        let start = self.head.len;
        let mut left = n;
        loop {
            let have = self.buf.len() - start;
            if have >= left {
                self.body = BodyState::Read {
                    raw: left,
                    chunked: false,
                };
                return true;
            }
            left -= have;
            self.buf.truncate(start);
            if !matches!(self.fill().await, Ok(got) if got > 0) {
                return false;
            }
        }
    }

    /// Before one of the gateway's own answers: a body left unread is skipped when it is
    /// within the size limit, declared and not held back for `100 Continue` (so the client
    /// reads the answer, not a reset); otherwise the connection closes after the answer.
    async fn skip_unread_body(&mut self) {
        let BodyState::Unread(framing) = self.body else {
            return;
        };
        // A body that broke its framing, its size or its deadline is not worth waiting for.
        // A client waiting for `100 Continue` gets the refusal now, and a close.
        let skippable = match framing {
            Ok(Framing::Length(n)) => usize::try_from(n)
                .ok()
                .filter(|n| *n <= self.max_body_bytes && !self.awaits_continue(self.head.len + n)),
            _ => None,
        };
        self.keep_alive &= match skippable {
            Some(n) => timeout_once_waiting(self.body_timeout, self.skip_body(n))
                .await
                .unwrap_or(false),
            None => false,
        };
    }

    /// Writes `out` to the client, giving up when the client does not read it in time.
    async fn send_out(&mut self) -> std::io::Result<()> {
        let write = async {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await
        };
        let sent = match timeout_once_waiting(self.send_timeout, write).await {
            Ok(sent) => sent,
            Err(TimedOut) => {
                self.send_timed_out = true;
                Err(std::io::ErrorKind::TimedOut.into())
            }
        };
        self.out.clear();
        if sent.is_err() {
            self.keep_alive = false;
        }
        sent
    }

    /// The `Connection` header that says whether the connection stays open, where the
    /// client would not assume it.
    fn connection_header(&self) -> Option<&'static str> {
        if !self.keep_alive {
            Some("close")
        } else if self.head.http10 {
            Some("keep-alive")
        } else {
            None
        }
    }

    /// Writes a response head into `out`: status, `headers`, a `Date` when they have none
    /// (RFC 9110 §6.6.1: the gateway's own answers, and a backend's answer without one), then
    /// the framing and connection headers, always the gateway's own: `body` says how the body
    /// that follows ends. (HTTP/2 answers get their `Date` from pingora's session.)
    fn write_head<'h>(
        &mut self,
        status: u16,
        reason: &[u8],
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        body: Framing,
    ) {
        let connection = self.connection_header();
        self.out.clear();
        // Room for a usual answer at once, rather than growing by doubling from nothing (the
        // buffer goes after each answer: [`Self::finish_request`]).
        self.out.reserve(FIRST_BUFFER);
        let mut w = ResponseWriter::new(&mut self.out, status, reason);
        let mut dated = false;
        for (name, value) in headers {
            dated |= name.eq_ignore_ascii_case(b"date");
            w.header(name, value);
        }
        if !dated {
            w.header("date", get_cached_date().as_bytes());
        }
        match body {
            _ if is_bodiless_status(status) => {}
            Framing::Length(n) => {
                w.number("content-length", n);
            }
            Framing::Chunked => {
                w.header("transfer-encoding", "chunked");
            }
            Framing::UntilClose => {}
        }
        if let Some(value) = connection {
            w.header("connection", value);
        }
        w.end();
    }

    /// Drops the finished request from the buffer, keeping any pipelined bytes.
    fn finish_request(&mut self) {
        let mut took = self.head.len;
        if let BodyState::Read { raw, .. } = self.body {
            took += raw;
            self.buf.advance(took);
        }
        self.first_read = took.next_power_of_two().clamp(FIRST_BUFFER, KEPT_BUFFER);
        self.body = BodyState::Broken;
        // One large request must not pin its buffers for the connection's life. The read
        // buffer goes while the connection waits for more ([`Self::fill`]); the answer's and
        // the decoded body's go now (a kept-alive connection waiting for its next request
        // holds no buffers, for a malloc and a free per answer).
        if self.buf.capacity() > KEPT_BUFFER && self.buf.len() < 4096 {
            self.buf = BytesMut::from(&self.buf[..]);
        }
        self.out = BytesMut::new();
        self.decoded = BytesMut::new();
    }

    /// Closes after an answer that left request bytes unread: stops writing, then reads and
    /// drops what the client is still sending, for a while (on the connection's `timer`), so
    /// it can read the answer.
    async fn linger(&mut self, timer: &mut LazyTimer) {
        let mut dropped = 0;
        let _ = timer
            .limit(LINGER, async {
                if self.stream.shutdown().await.is_err() {
                    return;
                }
                while dropped < LINGER_BYTES {
                    self.buf.clear();
                    match self.fill().await {
                        Ok(n) if n > 0 => dropped += n,
                        _ => return,
                    }
                }
            })
            .await;
    }
}

impl RequestView for Request<'_> {
    fn method(&self) -> &str {
        Request::method(self)
    }

    fn path(&self) -> &str {
        Request::path(self)
    }

    fn query(&self) -> Option<&str> {
        Request::query(self)
    }

    fn target_len(&self) -> usize {
        self.target().len()
    }

    fn authority(&self) -> Option<&str> {
        Request::authority(self)
    }

    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        Request::headers(self)
    }

    fn header_count(&self) -> usize {
        Request::header_count(self)
    }

    fn headers_named<'n>(&'n self, name: &'n str) -> impl Iterator<Item = &'n [u8]> {
        Request::headers_named(self, name)
    }

    fn body_length(&self) -> BodyLength {
        match self.framing() {
            Ok(Framing::Length(n)) => BodyLength::Declared(n),
            Ok(_) => BodyLength::Unknown,
            Err(_) => BodyLength::Ambiguous,
        }
    }

    fn host_required(&self) -> bool {
        !self.http10()
    }
}

impl Downstream for H1Connection {
    type Request<'a> = Request<'a>;

    fn request(&self) -> Request<'_> {
        self.view()
    }

    fn protocol(&self) -> Protocol {
        Protocol::Http1
    }

    fn client_ip(&self) -> Option<IpAddr> {
        self.client
    }

    fn closed_by_gateway(&mut self) -> bool {
        self.send_timed_out
    }

    async fn read_body(
        &mut self,
        max_bytes: usize,
        body_timeout: Duration,
    ) -> Result<(), BodyError> {
        let framing = match self.body {
            BodyState::Unread(framing) => framing.map_err(BodyError::Ambiguous)?,
            // A body is read once, after its head started the request: in any other state
            // the connection has lost its place in the client's bytes.
            BodyState::Read { .. } | BodyState::Broken => return Err(BodyError::Unframed),
        };
        let read =
            timeout_once_waiting(body_timeout, self.read_body_framed(framing, max_bytes)).await;
        let result = read.unwrap_or(Err(BodyError::Timeout));
        if result.is_err() {
            // Part of the body may be gone from the buffer: the connection cannot be reused.
            self.body = BodyState::Broken;
            self.keep_alive = false;
        }
        result
    }

    fn body(&self) -> &[u8] {
        match self.body {
            BodyState::Read { chunked: true, .. } => &self.decoded,
            BodyState::Read { raw, .. } => &self.buf[self.head.len..self.head.len + raw],
            _ => &[],
        }
    }

    fn outgoing(&mut self) -> (Request<'_>, &[u8], impl Future<Output = ()> + Send + '_) {
        let this = &*self;
        (this.view(), this.body(), hangup::hung_up(&this.stream))
    }

    async fn send_answer(
        &mut self,
        status: u16,
        headers: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> std::io::Result<()> {
        if let Some(kept) = self.kept_before_answer.take() {
            self.keep_alive = kept;
        }
        self.skip_unread_body().await;
        let length = Framing::Length(body.len() as u64);
        self.write_head(status, b"", headers.iter().copied(), length);
        // An answer to HEAD has the headers of the answer to GET, and no body.
        if !self.head_only {
            self.out.put_slice(body);
        }
        self.send_out().await
    }

    fn reads_chunked(&self) -> bool {
        // An HTTP/1.0 client cannot: it gets the data, then a close.
        !self.head.http10
    }

    fn start_response<'h>(
        &mut self,
        status: u16,
        reason: &[u8],
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
        body: Framing,
    ) {
        if body == Framing::UntilClose {
            self.kept_before_answer = Some(self.keep_alive);
            self.keep_alive = false;
        }
        self.write_head(status, reason, headers, body);
    }

    fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    async fn send(&mut self, _end: bool) -> std::io::Result<()> {
        // The answer's head goes out now: its `Connection` stands.
        self.kept_before_answer = None;
        self.send_out().await
    }

    fn abort(&mut self) {
        self.keep_alive = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing;
    use tokio::io::AsyncWriteExt;
    use tokio::time::timeout;

    #[tokio::test]
    async fn a_client_whose_requests_are_large_sends_each_in_one_read() {
        let (mut client, gateway) = tokio::io::duplex(16 * 1024);
        let mut c = H1Connection::new(Box::new(gateway), None);
        c.apply_limits(&testing::config().snapshot().limits);
        let body = "x".repeat(3000);
        let large = format!("POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 3000\r\n\r\n{body}");
        let small = b"GET /b HTTP/1.1\r\nHost: gw\r\n\r\n";
        let mut exchange = async |c: &mut H1Connection, request: &[u8]| {
            client.write_all(request).await.unwrap();
            assert!(matches!(
                c.read_head(8192, false).await,
                Ok(HeadRead::Ready)
            ));
            let read_at_once = c.buf.len();
            c.start_request(true);
            c.read_body(8192, Duration::from_secs(5)).await.unwrap();
            c.write_head(200, b"", std::iter::empty(), Framing::Length(0));
            c.send_out().await.unwrap();
            c.finish_request();
            // The connection waits for the next request, without its buffer.
            let waiting = timeout(Duration::from_millis(20), c.read_head(8192, false)).await;
            assert!(waiting.is_err() && c.buf.capacity() == 0);
            read_at_once
        };
        // The first request is read into a first buffer's worth, the rest after.
        assert_eq!(exchange(&mut c, large.as_bytes()).await, FIRST_BUFFER);
        // The next one, in one read: the buffer starts at what the last request took.
        assert_eq!(exchange(&mut c, large.as_bytes()).await, large.len());
        // A small request brings it back to the first size.
        assert_eq!(exchange(&mut c, small).await, small.len());
        client.write_all(small).await.unwrap();
        assert!(matches!(
            c.read_head(8192, false).await,
            Ok(HeadRead::Ready)
        ));
        assert_eq!(c.buf.capacity(), FIRST_BUFFER);
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_next_request_holds_no_buffers() {
        let (mut client, gateway) = tokio::io::duplex(4096);
        let mut c = H1Connection::new(Box::new(gateway), None);
        let request = b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}";
        client.write_all(request).await.unwrap();
        assert!(matches!(
            c.read_head(8192, false).await,
            Ok(HeadRead::Ready)
        ));
        c.start_request(true);
        c.apply_limits(&testing::config().snapshot().limits);
        c.read_body(1024, Duration::from_secs(5)).await.unwrap();
        assert_eq!(c.body(), b"{}");
        c.write_head(200, b"", std::iter::empty(), Framing::Length(0));
        c.send_out().await.unwrap();
        assert!(c.buf.capacity() > 0 && c.head.header_table_capacity() > 0);
        c.finish_request();
        // The next head does not come: the connection waits for it.
        let waiting = timeout(Duration::from_millis(50), c.read_head(8192, false)).await;
        assert!(waiting.is_err());
        assert_eq!(c.buf.capacity(), 0, "read buffer");
        assert_eq!(c.head.header_table_capacity(), 0, "header table");
        assert_eq!(c.out.capacity(), 0, "answer buffer");
        // And the next request is read as the first was.
        client.write_all(request).await.unwrap();
        assert!(matches!(
            c.read_head(8192, false).await,
            Ok(HeadRead::Ready)
        ));
        assert_eq!(c.view().path(), "/a");
    }

    #[test]
    fn only_the_whole_preface_is_http2_and_a_prefix_waits_for_more() {
        assert_eq!(preface_match(PREFACE), Some(true));
        assert_eq!(preface_match(&[PREFACE, b"frames"].concat()), Some(true));
        assert_eq!(
            preface_match(&PREFACE[..3]),
            Some(false),
            "PRI: wait for the rest"
        );
        assert_eq!(
            preface_match(b"PRI /x HTTP/1.1\r\n"),
            None,
            "PRI is a method too"
        );
        assert_eq!(preface_match(b"GET / HTTP/1.1\r\n"), None);
    }
}
