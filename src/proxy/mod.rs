//! The pingora glue: a client connection's requests, from client to backend and back.
//!
//! pingora accepts the connection (TCP or TLS) and hands over the stream as a [`ServerApp`];
//! the gateway speaks HTTP/1.1 on it with [`crate::http1`], so it holds and validates a whole
//! request body of up to `limits.max_body_bytes` before a single byte goes upstream, and a
//! request costs one parse per head and no header maps or per-request buffers. The sequence
//! is plain: read the head → size limits → [`plan`] (route, auth, retirement) → rate limit →
//! read and validate the body → send upstream on a pooled connection → relay the response.
//! A request that may have reached a backend is never sent twice; only a connect failure
//! (nothing sent), or a GET on a kept-alive connection the backend had closed, goes again.
//!
//! Decisions are made by pure functions ([`plan`], [`schema::validate`], [`Reply`],
//! [`RateLimiter::check`]); this module only performs them.

pub mod health;
pub mod pool;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::{Buf, BufMut, BytesMut};
use pingora::apps::ServerApp;
use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use pingora::{Error, ErrorType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use crate::api::operation::ApiVersion;
use crate::api::reply::Reply;
use crate::api::schema;
use crate::config::{Limits, Snapshot, ValidationMode};
use crate::http1::{ChunkedDecoder, Framing, HeadError, Request, RequestHead, ResponseWriter};
use crate::observe::exchange::{Exchange, UpstreamErrorKind};
use crate::observe::telemetry::Telemetry;
use crate::policy::admit::{plan, RequestFacts};
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};
use crate::policy::rate_limit::RateLimiter;
use crate::policy::request_id::{self, RequestIds};
use crate::proxy::health::UpstreamHealth;
use crate::proxy::pool::{UpstreamConn, UpstreamPool};

/// Request headers that describe one hop, not the request, or that the gateway sets itself;
/// never forwarded as sent.
const NOT_FORWARDED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
    "x-request-id",
    "x-forwarded-for",
];

/// Response headers of the backend's that describe its hop, or that the gateway sets itself.
const NOT_RELAYED: [&str; 4] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "x-request-id",
];

/// Bodies up to this size travel in the same buffer as the head: one `send` per request.
const INLINE_BODY_MAX: usize = 16 * 1024;

/// Longest response head accepted from a backend.
const MAX_UPSTREAM_HEAD: usize = 64 * 1024;

/// After a refusal that closes the connection with request bytes still unread, the gateway
/// reads and drops them for this long (at most [`LINGER_BYTES`]) so that the client gets the
/// answer rather than a reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 4 * 1024 * 1024;

/// The proxy service: shared by every connection of the listener.
pub struct ProxyApp {
    config: Arc<ArcSwap<Snapshot>>,
    /// Makes new backend connections (connect timeout, TLS); reuse is [`UpstreamPool`]'s.
    connector: TransportConnector,
    pool: Arc<UpstreamPool>,
    next_peer: AtomicUsize,
    ids: RequestIds,
    telemetry: Arc<Telemetry>,
    health: Arc<UpstreamHealth>,
    rate_limits: RateLimiter,
}

/// One client connection: its stream, bytes read but not yet used, and buffers reused from
/// one request to the next.
struct Client {
    stream: Stream,
    /// The client's IP address, as written into `X-Forwarded-For`.
    addr: Option<String>,
    /// What has been read: the current request's head and body, then any pipelined bytes.
    buf: BytesMut,
    head: RequestHead,
    /// The current request's body as decoded from chunked framing.
    decoded: BytesMut,
    /// The upstream request being sent, then the response being written.
    out: BytesMut,
    request: RequestState,
    /// `limits.client_send_timeout` of the current request's snapshot.
    send_timeout: Duration,
}

/// Where the current request's body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestState {
    /// The body is unread; `None` when its framing cannot be trusted.
    Unread(Option<Framing>),
    /// The body is read: `raw` bytes after the head in `buf` are this request's, and the body
    /// is in `buf` (after the head) or, when it was chunked, in `decoded`.
    Read { raw: usize, chunked: bool },
    /// Unread bytes may be left that cannot be skipped: the connection must close.
    Broken,
}

impl Client {
    fn new(stream: Stream) -> Self {
        let addr = stream.get_socket_digest().and_then(|d| {
            d.peer_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip().to_string())
        });
        Client {
            stream,
            addr,
            // Allocated on first use: a connection that sends nothing costs no buffers.
            buf: BytesMut::new(),
            head: RequestHead::default(),
            decoded: BytesMut::new(),
            out: BytesMut::new(),
            request: RequestState::Broken,
            send_timeout: Duration::from_secs(10),
        }
    }

    fn request(&self) -> Request<'_> {
        self.head.view(&self.buf)
    }

    /// The body read by [`Self::read_body`].
    fn body(&self) -> &[u8] {
        match self.request {
            RequestState::Read { chunked: true, .. } => &self.decoded,
            RequestState::Read { raw, .. } => &self.buf[self.head.len..self.head.len + raw],
            _ => &[],
        }
    }

    /// Reads more bytes; `Ok(0)` at the end of the stream.
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        self.stream.read_buf(&mut self.buf).await
    }

    /// Reads until a whole request head is in: `Ok(false)` when the client closed (or broke)
    /// the connection first, which needs no answer.
    async fn read_head(&mut self, limits: &Limits) -> Result<bool, Reply> {
        // Room for the largest head the limits admit, with each line's separators.
        let most = limits.max_uri_bytes + limits.max_header_bytes + 4 * limits.max_headers + 64;
        loop {
            if !self.buf.is_empty() {
                match self.head.parse(&self.buf) {
                    Ok(true) => return Ok(true),
                    Ok(false) => {}
                    Err(HeadError::TooManyHeaders) => return Err(Reply::HeadersTooLarge),
                    Err(HeadError::Malformed) => return Err(Reply::Malformed),
                }
                if self.buf.len() > most {
                    return Err(if self.buf.contains(&b'\n') {
                        Reply::HeadersTooLarge
                    } else {
                        Reply::UriTooLong
                    });
                }
            }
            if !matches!(self.fill().await, Ok(n) if n > 0) {
                return Ok(false);
            }
        }
    }

    /// Reads the whole body, refusing it as soon as it is known to exceed `max` (the excess
    /// is never buffered).
    async fn read_body(&mut self, framing: Framing, max: usize) -> Result<(), Reply> {
        let start = self.head.len;
        match framing {
            Framing::Length(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n > max {
                    return Err(Reply::PayloadTooLarge);
                }
                self.send_continue(start + n).await?;
                while self.buf.len() < start + n {
                    self.buf.reserve(start + n - self.buf.len());
                    if !matches!(self.fill().await, Ok(got) if got > 0) {
                        return Err(Reply::BadBody);
                    }
                }
                self.request = RequestState::Read {
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
                        .map_err(|_| Reply::BadBody)?;
                    raw += used;
                    if self.decoded.len() > max {
                        return Err(Reply::PayloadTooLarge);
                    }
                    if done {
                        break;
                    }
                    // Decoded bytes are kept apart: drop the raw ones so a large body is not
                    // held twice.
                    self.buf.truncate(start);
                    raw = 0;
                    if !matches!(self.fill().await, Ok(got) if got > 0) {
                        return Err(Reply::BadBody);
                    }
                }
                self.request = RequestState::Read { raw, chunked: true };
            }
            Framing::UntilClose => return Err(Reply::BadBody),
        }
        Ok(())
    }

    /// Whether the client waits for `100 Continue` before sending a body that ends at `end`
    /// in `buf`.
    fn awaits_continue(&self, end: usize) -> bool {
        let req = self.request();
        self.buf.len() < end && !req.http10() && req.has_token("expect", "100-continue")
    }

    /// Answers `Expect: 100-continue` when the body (ending at `end` in `buf`) is not all in.
    async fn send_continue(&mut self, end: usize) -> Result<(), Reply> {
        if !self.awaits_continue(end) {
            return Ok(());
        }
        self.out.clear();
        self.out.put_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        self.send_out().await.map_err(|_| Reply::BadBody)
    }

    /// Reads and drops an unread body of `n` declared bytes, keeping what follows it.
    async fn skip_body(&mut self, n: usize) -> bool {
        let start = self.head.len;
        let mut left = n;
        loop {
            let have = self.buf.len() - start;
            if have >= left {
                self.request = RequestState::Read {
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

    /// Writes `out` to the client, giving up when the client does not read it in time.
    async fn send_out(&mut self) -> std::io::Result<()> {
        let write = async {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await
        };
        timeout(self.send_timeout, write)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    }

    /// Drops the finished request from the buffer, keeping any pipelined bytes.
    fn finish_request(&mut self) {
        if let RequestState::Read { raw, .. } = self.request {
            self.buf.advance(self.head.len + raw);
        }
        self.request = RequestState::Broken;
        // One large request must not pin its buffers for the connection's life.
        if self.buf.capacity() > 64 * 1024 && self.buf.len() < 4096 {
            self.buf = BytesMut::from(&self.buf[..]);
        }
        if self.decoded.capacity() > 64 * 1024 {
            self.decoded = BytesMut::new();
        }
    }

    /// Closes after an answer that left request bytes unread: stops writing, then reads and
    /// drops what the client is still sending, for a while, so it can read the answer.
    async fn linger(&mut self) {
        let mut dropped = 0;
        let _ = timeout(LINGER, async {
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

/// What went wrong talking to a backend.
#[derive(Debug)]
struct UpstreamFailure {
    kind: UpstreamErrorKind,
    what: &'static str,
    cause: Option<String>,
}

impl UpstreamFailure {
    fn new(kind: UpstreamErrorKind, what: &'static str) -> Self {
        UpstreamFailure {
            kind,
            what,
            cause: None,
        }
    }

    fn io(what: &'static str, e: &std::io::Error) -> Self {
        UpstreamFailure {
            kind: UpstreamErrorKind::Reset,
            what,
            cause: Some(e.to_string()),
        }
    }
}

impl fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)?;
        if let Some(c) = &self.cause {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl ProxyApp {
    pub fn new(
        config: Arc<ArcSwap<Snapshot>>,
        telemetry: Arc<Telemetry>,
        health: Arc<UpstreamHealth>,
        pool: Arc<UpstreamPool>,
    ) -> Self {
        Self {
            config,
            connector: TransportConnector::new(Some(ConnectorOptions::new(0))),
            pool,
            next_peer: AtomicUsize::new(0),
            ids: RequestIds::default(),
            telemetry,
            health,
            rate_limits: RateLimiter::default(),
        }
    }

    /// Reads and answers one request; returns whether the connection may be kept.
    async fn serve_next(&self, c: &mut Client, shutdown: &ShutdownWatch) -> bool {
        // The whole head must arrive in time (a slowloris client is cut off), and an idle
        // kept-alive connection waits no longer. The snapshot is taken once the head is in.
        let limits = self.config.load().limits.clone();
        c.request = RequestState::Broken;
        let unreadable = match timeout(limits.client_header_timeout, c.read_head(&limits)).await {
            Ok(Ok(true)) => None,
            Ok(Err(reply)) => Some(reply),
            Ok(Ok(false)) => return false,
            Err(_) => {
                tracing::debug!("request header not received in time; closing");
                return false;
            }
        };

        // One snapshot per request, start to end: a reload never changes a request in flight.
        let snap = self.config.load_full();
        c.send_timeout = snap.limits.client_send_timeout;
        let in_flight = self.telemetry.in_flight();
        let keep = match unreadable {
            Some(reply) => {
                tracing::debug!(status = reply.status(), "unreadable request");
                let mut ex = Exchange::start(&http::Method::GET, "");
                ex.request_id = self.ids.next_id();
                self.reply(c, reply, &snap, &mut ex, false).await;
                self.telemetry.record(&ex);
                false
            }
            None => {
                let req = c.request();
                let method =
                    http::Method::from_bytes(req.method().as_bytes()).unwrap_or(http::Method::GET);
                let mut ex = Exchange::start(&method, req.path());
                let keep_alive = req.wants_keep_alive() && !*shutdown.borrow();
                c.request = RequestState::Unread(req.framing().ok());
                let keep = self.serve(c, &snap, &mut ex, keep_alive).await;
                self.telemetry.record(&ex);
                keep
            }
        };
        drop(in_flight);
        if keep {
            c.finish_request();
        } else if !matches!(c.request, RequestState::Read { .. }) {
            // Request bytes may be left unread: let the client read its answer first.
            c.linger().await;
        }
        keep
    }

    /// Serves the request whose head is in `c`; returns whether the connection may be kept.
    async fn serve(&self, c: &mut Client, snap: &Snapshot, ex: &mut Exchange, keep: bool) -> bool {
        let req = c.request();
        ex.request_id = match req.header(request_id::HEADER) {
            Some(v) if request_id::is_sane(v) => String::from_utf8_lossy(v).into_owned(),
            _ => self.ids.next_id(),
        };
        if let Err(reply) = check_request_size(&req, &snap.limits) {
            return self.reply(c, reply, snap, ex, keep).await;
        }
        let RequestState::Unread(Some(framing)) = c.request else {
            return self.reply(c, Reply::Malformed, snap, ex, false).await;
        };
        let facts = RequestFacts {
            method: req.method(),
            path: req.path(),
            query: req.query(),
            agent_id: req.single_header(AGENT_ID_HEADER),
            token: req.single_header(AUTH_TOKEN_HEADER),
            request_id: &ex.request_id,
            now: ex.started_at,
        };
        let forward = match plan(snap, &facts) {
            Ok(f) => f,
            Err(refusal) => {
                ex.identified(&refusal.who);
                ex.auth_failure = refusal.auth_failure;
                if let Reply::V1Gone(r) = refusal.reply {
                    ex.v1_refusal = Some(r);
                }
                let hint = refusal.hint.as_deref();
                return self
                    .reply_with(c, refusal.reply, hint, snap, ex, keep)
                    .await;
            }
        };
        ex.identified(&forward.who);

        // Only authenticated requests reach the bucket, so strangers cannot spend an agent's budget.
        if let Some(agent) = forward.who.agent {
            if let Some(limit) = agent.rate_limit {
                if let Err(wait) = self.rate_limits.check(&agent.id, limit, ex.started) {
                    ex.rate_limited = true;
                    let reply = Reply::RateLimited {
                        retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
                    };
                    return self.reply(c, reply, snap, ex, keep).await;
                }
            }
        }
        let operation = forward.operation;
        if operation.method() == "POST" && !is_json(&req) {
            return self
                .reply(c, Reply::UnsupportedMediaType, snap, ex, keep)
                .await;
        }

        let limits = &snap.limits;
        let read = timeout(
            limits.client_body_timeout,
            c.read_body(framing, limits.max_body_bytes),
        )
        .await;
        if let Err(reply) = read.unwrap_or(Err(Reply::BodyTimeout)) {
            // Part of the body may be gone from the buffer: the connection cannot be reused.
            c.request = RequestState::Broken;
            return self.reply(c, reply, snap, ex, false).await;
        }
        ex.bytes_in = c.body().len();
        if let Some(schema) = operation
            .schema()
            .filter(|_| snap.validation != ValidationMode::Off)
        {
            if let Err(violation) = schema::validate(schema, c.body()) {
                let message = violation.message();
                tracing::info!(request_id = %ex.request_id, %message, "request body breaks the schema");
                ex.validation_failure = Some(violation.rule);
                if snap.validation == ValidationMode::Enforce {
                    return self
                        .reply_with(c, Reply::InvalidBody, Some(&message), snap, ex, keep)
                        .await;
                }
            }
        }
        // `out` is taken out of `c` while the request and body are read from it.
        let mut out = std::mem::take(&mut c.out);
        write_upstream_head(
            &mut out,
            c.request(),
            c.addr.as_deref(),
            c.body(),
            &forward.upstream_path,
            &ex.request_id,
        );
        c.out = out;
        ex.upstream_path = Some(forward.upstream_path);
        self.forward(c, snap, ex, keep).await
    }

    /// Sends the request (its head already in `c.out`) to one backend, trying the next address
    /// only when connecting failed, so nothing was sent, and relays the answer.
    async fn forward(
        &self,
        c: &mut Client,
        snap: &Snapshot,
        ex: &mut Exchange,
        keep: bool,
    ) -> bool {
        let upstream = &snap.upstream;
        let peers = &upstream.peers;
        let first = self.next_peer.fetch_add(1, Ordering::Relaxed);
        // Addresses that failed their health check leave the rotation, unless all have.
        let any_up = upstream.addresses.iter().any(|a| self.health.is_up(a));
        let idempotent = ex.method == http::Method::GET;
        let mut last_failure = Reply::UpstreamConnect;
        let mut resent_on_stale = false;
        let mut attempt = 0;
        while attempt < peers.len() {
            let index = (first + attempt) % peers.len();
            let (peer, key) = (&peers[index], upstream.pool_keys[index]);
            attempt += 1;
            if any_up && !self.health.is_up(&upstream.addresses[index]) {
                continue;
            }
            let started = Instant::now();
            // A resend goes on a new connection, never on another pooled one.
            let pooled = if resent_on_stale {
                None
            } else {
                self.pool.take(key, upstream.idle_timeout)
            };
            let (mut up, reused) = match pooled {
                Some(conn) => (conn, true),
                // Boxed: connecting (and TLS) is a large future, and rare; kept inline it would
                // size every connection's task, idle or not.
                None => match Box::pin(self.connector.new_stream(peer)).await {
                    Ok(stream) => (UpstreamConn::new(stream), false),
                    Err(e) => {
                        let kind = classify(&e);
                        ex.upstream_errors.push(kind);
                        tracing::warn!(request_id = %ex.request_id, peer = %peer, error = %e, "upstream connect failed");
                        last_failure = reply_for(kind);
                        continue;
                    }
                },
            };
            match send_and_read_head(&mut up, &c.out, c.body(), upstream.read_timeout).await {
                Ok(()) => {
                    ex.upstream_header_time = Some(started.elapsed());
                    return self
                        .relay_response(c, up, key, snap, ex, keep, started)
                        .await;
                }
                Err(failure) => {
                    ex.upstream_errors.push(failure.kind);
                    tracing::warn!(request_id = %ex.request_id, peer = %peer, reused, error = %failure, "upstream exchange failed");
                    // A kept-alive connection the backend had already closed: an idempotent
                    // GET may go once more on a fresh connection. A POST never does.
                    if reused
                        && idempotent
                        && !resent_on_stale
                        && failure.kind == UpstreamErrorKind::Reset
                    {
                        resent_on_stale = true;
                        attempt -= 1;
                        continue;
                    }
                    ex.upstream_header_time = Some(started.elapsed());
                    return self.reply(c, reply_for(failure.kind), snap, ex, keep).await;
                }
            }
        }
        self.reply(c, last_failure, snap, ex, keep).await
    }

    /// Relays the backend's response (its head parsed in `up`) to the client, then returns the
    /// connection to the pool if the backend keeps it and all of the response was read.
    #[allow(clippy::too_many_arguments)]
    async fn relay_response(
        &self,
        c: &mut Client,
        mut up: UpstreamConn,
        key: u64,
        snap: &Snapshot,
        ex: &mut Exchange,
        keep: bool,
        started: Instant,
    ) -> bool {
        let framing = up.head.framing;
        // An HTTP/1.0 client cannot read chunked framing: it gets the data, then a close.
        let http10 = c.request().http10();
        let dechunk = framing == Framing::Chunked && http10;
        let keep = keep && framing != Framing::UntilClose && !dechunk;
        ex.status = up.head.status;

        c.out.clear();
        let declares_hop_headers = up.head.declares_hop_headers;
        let mut w = ResponseWriter::new(&mut c.out, up.head.status, up.head.reason(&up.buf));
        for (name, value) in up.head.headers(&up.buf) {
            // With chunked framing a Content-Length is wrong (RFC 9112 §6.3); a client that
            // gets the data decoded gets no Transfer-Encoding either.
            let skip = NOT_RELAYED
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
                || (declares_hop_headers && up.head.connection_lists(&up.buf, name))
                || (framing == Framing::Chunked && name.eq_ignore_ascii_case(b"content-length"))
                || (dechunk && name.eq_ignore_ascii_case(b"transfer-encoding"));
            if !skip {
                w.header(name, value);
            }
        }
        w.header(request_id::HEADER, &ex.request_id);
        add_retirement_signals(&mut w, snap, ex);
        connection_header(&mut w, keep, http10);
        w.end();
        up.buf.advance(up.head.len);
        // Only body bytes count as sent; the head goes out with the first of them.
        let mut head_bytes = c.out.len();

        let read_timeout = snap.upstream.read_timeout;
        let mut decoder = ChunkedDecoder::default();
        let mut left = match framing {
            Framing::Length(n) => n,
            _ => u64::MAX,
        };
        loop {
            // Move what has arrived of the body into `out`, and note whether it is complete.
            let done = match framing {
                Framing::Length(_) => {
                    let n = up
                        .buf
                        .len()
                        .min(usize::try_from(left).unwrap_or(usize::MAX));
                    c.out.extend_from_slice(&up.buf[..n]);
                    up.buf.advance(n);
                    left -= n as u64;
                    left == 0
                }
                Framing::Chunked => {
                    let out = &mut c.out;
                    let decoded = if dechunk {
                        decoder.decode(&up.buf, |data| out.extend_from_slice(data))
                    } else {
                        decoder.decode(&up.buf, |_| {})
                    };
                    let Ok((used, done)) = decoded else {
                        ex.upstream_errors.push(UpstreamErrorKind::Other);
                        tracing::warn!(request_id = %ex.request_id, "upstream sent broken chunked framing; closing client connection");
                        return false;
                    };
                    if !dechunk {
                        c.out.extend_from_slice(&up.buf[..used]);
                    }
                    up.buf.advance(used);
                    done
                }
                Framing::UntilClose => {
                    c.out.extend_from_slice(&up.buf);
                    up.buf.clear();
                    false
                }
            };
            if done {
                break;
            }
            ex.bytes_out += c.out.len() - head_bytes;
            head_bytes = 0;
            if let Err(e) = c.send_out().await {
                tracing::debug!(request_id = %ex.request_id, error = %e, "client went away mid-response");
                ex.client_aborted = true;
                return false;
            }
            c.out.clear();
            match timeout(read_timeout, up.stream.read_buf(&mut up.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(Ok(_)) if framing == Framing::UntilClose => break,
                result => {
                    // The head is already out: the only honest signal left is to close.
                    let kind = match result {
                        Err(_) => UpstreamErrorKind::Timeout,
                        _ => UpstreamErrorKind::Reset,
                    };
                    ex.upstream_errors.push(kind);
                    tracing::warn!(request_id = %ex.request_id, kind = kind.as_str(), "upstream broke mid-response; closing client connection");
                    return false;
                }
            }
        }
        // The backend's part is over: its connection goes back to the pool before the client
        // has the last bytes, so the client's next request can have it.
        ex.upstream_duration = Some(started.elapsed());
        if up.head.keep_alive && up.buf.is_empty() {
            self.pool.put(key, up);
        }
        ex.bytes_out += c.out.len() - head_bytes;
        if let Err(e) = c.send_out().await {
            tracing::debug!(request_id = %ex.request_id, error = %e, "client went away at the end of the response");
            ex.client_aborted = true;
            return false;
        }
        keep
    }

    /// Writes one of the gateway's own answers. A request body left unread is skipped when it
    /// is within the size limit (so the client reads the answer, not a reset), else the
    /// connection closes.
    async fn reply(
        &self,
        c: &mut Client,
        reply: Reply,
        snap: &Snapshot,
        ex: &mut Exchange,
        keep: bool,
    ) -> bool {
        self.reply_with(c, reply, None, snap, ex, keep).await
    }

    /// [`Self::reply`] with a hint appended to the message.
    async fn reply_with(
        &self,
        c: &mut Client,
        reply: Reply,
        hint: Option<&str>,
        snap: &Snapshot,
        ex: &mut Exchange,
        keep: bool,
    ) -> bool {
        let mut keep = keep;
        if let RequestState::Unread(framing) = c.request {
            // A body that broke its framing, its size or its deadline is not worth waiting for.
            // A client waiting for `100 Continue` gets the refusal now, and a close.
            let skippable = match framing {
                Some(Framing::Length(n)) => usize::try_from(n).ok().filter(|n| {
                    *n <= snap.limits.max_body_bytes && !c.awaits_continue(c.head.len + n)
                }),
                _ => None,
            };
            keep &= match skippable {
                Some(n) => timeout(snap.limits.client_body_timeout, c.skip_body(n))
                    .await
                    .unwrap_or(false),
                None => false,
            };
        }
        let body = reply.body(hint);
        ex.status = reply.status();
        ex.bytes_out = body.len();
        c.out.clear();
        let http10 = c.head.http10;
        let mut w = reply.head(&mut c.out, body.len(), &ex.request_id);
        add_retirement_signals(&mut w, snap, ex);
        connection_header(&mut w, keep, http10);
        w.end();
        c.out.put_slice(&body);
        if c.send_out().await.is_err() {
            ex.client_aborted = true;
            return false;
        }
        keep
    }
}

#[async_trait]
impl ServerApp for ProxyApp {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let mut client = Client::new(stream);
        while self.serve_next(&mut client, shutdown).await {}
        None
    }
}

/// Whether a request declares a JSON body (`application/json`, any parameters).
fn is_json(req: &Request<'_>) -> bool {
    req.header("content-type")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Refuses request lines and headers over the configured limits.
fn check_request_size(req: &Request<'_>, limits: &Limits) -> Result<(), Reply> {
    if req.target().len() > limits.max_uri_bytes {
        return Err(Reply::UriTooLong);
    }
    if req.header_count() > limits.max_headers {
        return Err(Reply::HeadersTooLarge);
    }
    let bytes: usize = req.headers().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > limits.max_header_bytes {
        return Err(Reply::HeadersTooLarge);
    }
    Ok(())
}

/// Adds the configured `Deprecation`, `Sunset` and `Link` headers to a v1 response.
fn add_retirement_signals(w: &mut ResponseWriter<'_>, snap: &Snapshot, ex: &Exchange) {
    if ex.version == Some(ApiVersion::V1) {
        for (name, value) in &snap.retirement.headers {
            w.header(name, value.as_bytes());
        }
    }
}

/// Says whether the connection stays open, where the client would not assume it.
fn connection_header(w: &mut ResponseWriter<'_>, keep: bool, http10: bool) {
    if !keep {
        w.header("connection", "close");
    } else if http10 {
        w.header("connection", "keep-alive");
    }
}

/// Writes the request head sent upstream into `out`: the new path, the client's headers
/// minus hop-by-hop ones, an exact Content-Length for the buffered body, the request id and
/// `X-Forwarded-For`; a body up to [`INLINE_BODY_MAX`] is appended, so a small request costs
/// one `send`.
fn write_upstream_head(
    out: &mut BytesMut,
    req: Request<'_>,
    client: Option<&str>,
    body: &[u8],
    path: &str,
    request_id: &str,
) {
    out.clear();
    out.put_slice(req.method().as_bytes());
    out.put_u8(b' ');
    out.put_slice(path.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let mut has_host = false;
    let declares_hop_headers = req.declares_hop_headers();
    for (name, value) in req.headers() {
        if NOT_FORWARDED
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
            || (declares_hop_headers && req.connection_lists(name))
        {
            continue;
        }
        has_host |= name.eq_ignore_ascii_case(b"host");
        put_header(out, name, value);
    }
    if !has_host {
        // HTTP/1.1 upstreams need Host; an HTTP/1.0 client may not have sent one.
        put_header(
            out,
            b"host",
            req.authority().unwrap_or("localhost").as_bytes(),
        );
    }
    if !body.is_empty() || req.method() == "POST" {
        put_header(
            out,
            b"content-length",
            itoa::Buffer::new().format(body.len()).as_bytes(),
        );
    }
    put_header(out, request_id::HEADER.as_bytes(), request_id.as_bytes());
    if let Some(ip) = client {
        out.put_slice(b"x-forwarded-for: ");
        for prior in req.headers_named("x-forwarded-for") {
            out.put_slice(prior);
            out.put_slice(b", ");
        }
        out.put_slice(ip.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
    if body.len() <= INLINE_BODY_MAX {
        out.put_slice(body);
    }
}

fn put_header(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Writes the request (`head`, with a small body already appended to it, see
/// [`INLINE_BODY_MAX`], and any larger `body`), then reads until the final (non-1xx)
/// response head is parsed in `up`.
async fn send_and_read_head(
    up: &mut UpstreamConn,
    head: &[u8],
    body: &[u8],
    read_timeout: Duration,
) -> Result<(), UpstreamFailure> {
    let write = async {
        up.stream.write_all(head).await?;
        if body.len() > INLINE_BODY_MAX {
            up.stream.write_all(body).await?;
        }
        up.stream.flush().await
    };
    match timeout(read_timeout, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(UpstreamFailure::io("writing the request upstream", &e)),
        Err(_) => {
            return Err(UpstreamFailure::new(
                UpstreamErrorKind::Timeout,
                "writing the request upstream",
            ))
        }
    }
    up.buf.clear();
    loop {
        match up.head.parse(&up.buf) {
            Ok(true) if (100..200).contains(&up.head.status) => {
                up.buf.advance(up.head.len);
                continue;
            }
            Ok(true) => return Ok(()),
            Ok(false) if up.buf.len() <= MAX_UPSTREAM_HEAD => {}
            _ => {
                return Err(UpstreamFailure::new(
                    UpstreamErrorKind::Other,
                    "the backend's response head is not HTTP/1.x",
                ))
            }
        }
        if up.buf.capacity() - up.buf.len() < 1024 {
            up.buf.reserve(4096);
        }
        match timeout(read_timeout, up.stream.read_buf(&mut up.buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => {
                return Err(UpstreamFailure::new(
                    UpstreamErrorKind::Reset,
                    "the backend closed the connection before answering",
                ))
            }
            Ok(Err(e)) => return Err(UpstreamFailure::io("reading the response head", &e)),
            Err(_) => {
                return Err(UpstreamFailure::new(
                    UpstreamErrorKind::Timeout,
                    "no response head in time",
                ))
            }
        }
    }
}

/// Sorts a pingora error into the kinds that metrics and answers distinguish.
fn classify(e: &Error) -> UpstreamErrorKind {
    match e.etype() {
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            UpstreamErrorKind::Timeout
        }
        ErrorType::ConnectRefused
        | ErrorType::ConnectNoRoute
        | ErrorType::ConnectError
        | ErrorType::SocketError => UpstreamErrorKind::Connect,
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError => {
            UpstreamErrorKind::Reset
        }
        _ => UpstreamErrorKind::Other,
    }
}

fn reply_for(kind: UpstreamErrorKind) -> Reply {
    match kind {
        UpstreamErrorKind::Timeout => Reply::UpstreamTimeout,
        UpstreamErrorKind::Connect => Reply::UpstreamConnect,
        UpstreamErrorKind::Reset | UpstreamErrorKind::Other => Reply::UpstreamBroken,
    }
}
