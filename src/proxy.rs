//! The pingora glue: one HTTP exchange per call, from client request to backend and back.
//!
//! This is pingora-core's [`HttpServerApp`] rather than pingora-proxy's `ProxyHttp`, because the
//! gateway must read and validate a whole request body of up to `limits.max_body_bytes`
//! before a single byte goes upstream; `ProxyHttp` can only replay 64 KiB of a body that was
//! read early. The sequence is plain: read request → size limits → [`plan`] (route, auth,
//! retirement) → rate limit → read and validate the body → send upstream on a pooled
//! connection → stream the response back. A request that may have reached a backend is never
//! sent twice; only a connect failure (nothing sent) moves on to the next address.
//!
//! Decisions are made by pure functions ([`plan`], [`schema::validate`], [`Reply`],
//! [`RateLimiter::check`]); this module only performs them.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::header;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v1::client::HttpSession as UpstreamSession;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use pingora::upstreams::peer::{HttpPeer, Peer};
use pingora::{Error, ErrorType};

use crate::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};
use crate::config::{Limits, Snapshot, ValidationMode};
use crate::exchange::{Exchange, UpstreamErrorKind};
use crate::health::UpstreamHealth;
use crate::plan::{plan, RequestFacts};
use crate::rate_limit::RateLimiter;
use crate::reply::Reply;
use crate::request_id::{self, RequestIds};
use crate::route::ApiVersion;
use crate::schema;
use crate::telemetry::Telemetry;

/// Request headers that describe one hop, not the request; never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// The proxy service: shared by every connection of the listener.
pub struct ProxyApp {
    config: Arc<ArcSwap<Snapshot>>,
    /// Pooled upstream connections; requests are written on them directly (see [`upstream_head`]).
    transport: TransportConnector,
    next_peer: AtomicUsize,
    ids: RequestIds,
    telemetry: Arc<Telemetry>,
    health: Arc<UpstreamHealth>,
    rate_limits: RateLimiter,
}

impl ProxyApp {
    pub fn new(
        config: Arc<ArcSwap<Snapshot>>,
        telemetry: Arc<Telemetry>,
        health: Arc<UpstreamHealth>,
        keepalive_pool_size: usize,
    ) -> Self {
        Self {
            config,
            transport: TransportConnector::new(Some(ConnectorOptions::new(keepalive_pool_size))),
            next_peer: AtomicUsize::new(0),
            ids: RequestIds::default(),
            telemetry,
            health,
            rate_limits: RateLimiter::default(),
        }
    }

    /// Serves one request; returns whether the client connection may be kept.
    async fn serve(&self, session: &mut ServerSession, snap: &Snapshot, ex: &mut Exchange) -> bool {
        let req = session.req_header();
        ex.request_id = match req.headers.get(request_id::HEADER) {
            Some(v) if request_id::is_sane(v.as_bytes()) => {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            }
            _ => self.ids.next_id(),
        };
        if let Err(reply) = check_request_size(req, &snap.limits) {
            return self.reply(session, reply, snap, ex).await;
        }
        let facts = RequestFacts {
            method: req.method.as_str(),
            path: req.uri.path(),
            query: req.uri.query(),
            agent_id: req.headers.get(AGENT_ID_HEADER).map(|v| v.as_bytes()),
            token: req.headers.get(AUTH_TOKEN_HEADER).map(|v| v.as_bytes()),
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
                return self
                    .reply_with(session, refusal.reply, refusal.hint.as_deref(), snap, ex)
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
                    return self.reply(session, reply, snap, ex).await;
                }
            }
        }
        let operation = forward.operation;
        if operation.method() == "POST" && !is_json(session.req_header()) {
            return self
                .reply(session, Reply::UnsupportedMediaType, snap, ex)
                .await;
        }

        let body = match read_body(session, &snap.limits).await {
            Ok(b) => b,
            Err(reply) => return self.reply(session, reply, snap, ex).await,
        };
        ex.bytes_in = body.len();
        if snap.validation != ValidationMode::Off {
            if let Err(violation) = schema::validate(operation, &body) {
                let message = violation.message();
                tracing::info!(request_id = %ex.request_id, %message, "request body breaks the schema");
                ex.validation_failure = Some(violation.rule);
                if snap.validation == ValidationMode::Enforce {
                    return self
                        .reply_with(session, Reply::InvalidBody, Some(&message), snap, ex)
                        .await;
                }
            }
        }
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(SocketAddr::ip);
        let head = upstream_head(
            session.req_header(),
            client,
            &forward.upstream_path,
            &ex.request_id,
            &body,
        );
        ex.upstream_path = Some(forward.upstream_path);
        self.forward(session, snap, head, body, ex).await
    }

    /// Sends the request to one backend (trying the next address only when connecting
    /// failed, so nothing was sent) and streams the answer back.
    async fn forward(
        &self,
        session: &mut ServerSession,
        snap: &Snapshot,
        head: BytesMut,
        body: Bytes,
        ex: &mut Exchange,
    ) -> bool {
        let peers = &snap.upstream.peers;
        let first = self.next_peer.fetch_add(1, Ordering::Relaxed);
        // Addresses that failed their health check leave the rotation, unless all have.
        let any_up = snap.upstream.addresses.iter().any(|a| self.health.is_up(a));
        let idempotent = session.req_header().method == http::Method::GET;
        let mut last_failure = Reply::UpstreamConnect;
        let mut resent_on_stale = false;
        let mut attempt = 0;
        while attempt < peers.len() {
            let index = (first + attempt) % peers.len();
            let peer = &peers[index];
            attempt += 1;
            if any_up && !self.health.is_up(&snap.upstream.addresses[index]) {
                continue;
            }
            let started = Instant::now();
            let (stream, reused) = match self.transport.get_stream(peer).await {
                Ok(s) => s,
                Err(e) => {
                    let kind = classify(&e);
                    ex.upstream_errors.push(kind);
                    tracing::warn!(request_id = %ex.request_id, peer = %peer, error = %e, "upstream connect failed");
                    last_failure = reply_for(kind);
                    continue;
                }
            };
            match send_and_read_header(stream, peer, &head, &body, snap.upstream.read_timeout).await
            {
                Ok(up) => {
                    ex.upstream_header_time = Some(started.elapsed());
                    return self
                        .relay_response(session, up, peer, snap, ex, started)
                        .await;
                }
                Err(e) => {
                    let kind = classify(&e);
                    ex.upstream_errors.push(kind);
                    tracing::warn!(request_id = %ex.request_id, peer = %peer, reused, error = %e, "upstream exchange failed");
                    // A kept-alive connection the backend had already closed: an idempotent
                    // GET may go once more on a fresh connection. A POST never does.
                    if reused && idempotent && !resent_on_stale && kind == UpstreamErrorKind::Reset
                    {
                        resent_on_stale = true;
                        attempt -= 1;
                        continue;
                    }
                    ex.upstream_header_time = Some(started.elapsed());
                    return self.reply(session, reply_for(kind), snap, ex).await;
                }
            }
        }
        self.reply(session, last_failure, snap, ex).await
    }

    /// Streams the backend's response to the client and returns the connection to the pool.
    async fn relay_response(
        &self,
        session: &mut ServerSession,
        mut up: UpstreamSession,
        peer: &HttpPeer,
        snap: &Snapshot,
        ex: &mut Exchange,
        started: Instant,
    ) -> bool {
        let Some(resp) = up.resp_header() else {
            return self.reply(session, Reply::UpstreamBroken, snap, ex).await;
        };
        let mut resp: Box<ResponseHeader> = Box::new(resp.clone());
        for name in ["connection", "keep-alive", "proxy-connection"] {
            resp.remove_header(name);
        }
        let _ = resp.insert_header(request_id::HEADER, ex.request_id.as_str());
        add_retirement_signals(&mut resp, snap, ex);
        ex.status = resp.status.as_u16();
        if let Err(e) = session.write_response_header(resp).await {
            tracing::debug!(request_id = %ex.request_id, error = %e, "client went away before the response header");
            ex.client_aborted = true;
            return false;
        }
        loop {
            match up.read_body_bytes().await {
                Ok(Some(chunk)) => {
                    ex.bytes_out += chunk.len();
                    if let Err(e) = session.write_response_body(chunk, false).await {
                        tracing::debug!(request_id = %ex.request_id, error = %e, "client went away mid-response");
                        ex.client_aborted = true;
                        return false;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The header is already out: the only honest signal left is to close.
                    let kind = classify(&e);
                    ex.upstream_errors.push(kind);
                    tracing::warn!(request_id = %ex.request_id, error = %e, "upstream broke mid-response; closing client connection");
                    return false;
                }
            }
        }
        ex.upstream_duration = Some(started.elapsed());
        if session
            .write_response_body(Bytes::new(), true)
            .await
            .is_err()
        {
            ex.client_aborted = true;
            return false;
        }
        up.respect_keepalive();
        if let Some(stream) = up.reuse().await {
            self.transport.release_stream(
                stream,
                peer.reuse_hash(),
                Some(snap.upstream.idle_timeout),
            );
        }
        true
    }

    /// Answers a request pingora could not parse (400, or 431 for oversized headers), then
    /// the connection closes: its framing can no longer be trusted.
    async fn answer_unreadable(&self, session: &mut ServerSession, e: &pingora::Error) {
        let text = e.to_string();
        let reply = if text.contains("larger than") || text.contains("too many headers") {
            Reply::HeadersTooLarge
        } else {
            Reply::Malformed
        };
        // Only the kind: pingora's message quotes the raw request, credentials included.
        tracing::debug!(
            kind = e.etype().as_str(),
            status = reply.status(),
            "unreadable request"
        );
        let mut ex = Exchange::start(&http::Method::GET, "");
        ex.request_id = self.ids.next_id();
        ex.status = reply.status();
        session.set_keepalive(None);
        let body = reply.body(None);
        let header = reply.header(body.len(), &ex.request_id);
        if session
            .write_response_header(Box::new(header))
            .await
            .is_ok()
        {
            let _ = session.write_response_body(body, true).await;
        }
        self.telemetry.record(&ex);
    }

    /// Writes one of the gateway's own answers. A request body left unread is drained when it
    /// is within the size limit (so the client reads the answer, not a reset), else the
    /// connection closes.
    async fn reply(
        &self,
        session: &mut ServerSession,
        reply: Reply,
        snap: &Snapshot,
        ex: &mut Exchange,
    ) -> bool {
        self.reply_with(session, reply, None, snap, ex).await
    }

    /// [`Self::reply`] with a hint appended to the message.
    async fn reply_with(
        &self,
        session: &mut ServerSession,
        reply: Reply,
        hint: Option<&str>,
        snap: &Snapshot,
        ex: &mut Exchange,
    ) -> bool {
        let body = reply.body(hint);
        let mut header = reply.header(body.len(), &ex.request_id);
        add_retirement_signals(&mut header, snap, ex);
        ex.status = reply.status();
        ex.bytes_out = body.len();
        let mut keep = true;
        if !session.is_body_done() {
            // A body that broke its framing, its size or its deadline is not worth waiting for.
            let drainable = !matches!(
                reply,
                Reply::PayloadTooLarge | Reply::BodyTimeout | Reply::BadBody
            ) && declared_length(session.req_header())
                .is_some_and(|n| n <= snap.limits.max_body_bytes as u64);
            keep = drainable
                && tokio::time::timeout(
                    snap.limits.client_body_timeout,
                    session.drain_request_body(),
                )
                .await
                .is_ok_and(|r| r.is_ok());
            if !keep {
                session.set_keepalive(None);
            }
        }
        if session
            .write_response_header(Box::new(header))
            .await
            .is_err()
            || session.write_response_body(body, true).await.is_err()
        {
            ex.client_aborted = true;
            return false;
        }
        keep
    }
}

#[async_trait]
impl HttpServerApp for ProxyApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        // The whole header must arrive in time: a slowloris client is cut off. (Only the
        // timeout is read here; the snapshot is taken once the request is in.)
        let header_timeout = self.config.load().limits.client_header_timeout;
        match tokio::time::timeout(header_timeout, session.read_request()).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return None,
            Ok(Err(e)) => {
                self.answer_unreadable(&mut session, &e).await;
                return None;
            }
            Err(_) => {
                tracing::debug!("request header not received in time; closing");
                return None;
            }
        }
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });

        // One snapshot per request, start to end: a reload never changes a request in flight.
        let snap = self.config.load_full();
        let req = session.req_header();
        let mut ex = Exchange::start(&req.method, req.uri.path());
        let _in_flight = self.telemetry.in_flight();
        let keep = self.serve(&mut session, &snap, &mut ex).await;
        self.telemetry.record(&ex);
        if !keep {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(stream) => stream.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)),
            Err(_) => None,
        }
    }
}

/// Whether a request declares a JSON body (`application/json`, any parameters).
fn is_json(req: &RequestHeader) -> bool {
    req.headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Refuses request lines and headers over the configured limits.
fn check_request_size(req: &RequestHeader, limits: &Limits) -> Result<(), Reply> {
    let target = req.uri.path_and_query().map_or(0, |p| p.as_str().len());
    if target > limits.max_uri_bytes {
        return Err(Reply::UriTooLong);
    }
    if req.headers.len() > limits.max_headers {
        return Err(Reply::HeadersTooLarge);
    }
    let bytes: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if bytes > limits.max_header_bytes {
        return Err(Reply::HeadersTooLarge);
    }
    Ok(())
}

/// Adds the configured `Deprecation`, `Sunset` and `Link` headers to a v1 response.
fn add_retirement_signals(resp: &mut ResponseHeader, snap: &Snapshot, ex: &Exchange) {
    if ex.version == Some(ApiVersion::V1) {
        for (name, value) in &snap.retirement.headers {
            let _ = resp.append_header(*name, value.clone());
        }
    }
}

/// The declared Content-Length, if any.
fn declared_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// Reads the whole request body within `client_body_timeout`, refusing it as soon as it is
/// known to exceed `max_body_bytes` (the excess is never buffered).
async fn read_body(session: &mut ServerSession, limits: &Limits) -> Result<Bytes, Reply> {
    tokio::time::timeout(
        limits.client_body_timeout,
        read_body_within(session, limits.max_body_bytes),
    )
    .await
    .unwrap_or(Err(Reply::BodyTimeout))
}

async fn read_body_within(session: &mut ServerSession, max: usize) -> Result<Bytes, Reply> {
    if declared_length(session.req_header()).is_some_and(|n| n > max as u64) {
        return Err(Reply::PayloadTooLarge);
    }
    if session.is_body_done() {
        return Ok(Bytes::new());
    }
    if session.req_header().headers.contains_key(header::EXPECT) {
        session
            .write_continue_response()
            .await
            .map_err(|_| Reply::BadBody)?;
    }
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    loop {
        let chunk = match session.read_request_body().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) if matches!(e.etype(), ErrorType::ReadTimedout) => {
                return Err(Reply::BodyTimeout)
            }
            Err(_) => return Err(Reply::BadBody),
        };
        let so_far = first.as_ref().map_or(0, |f| f.len()) + rest.len();
        if so_far + chunk.len() > max {
            return Err(Reply::PayloadTooLarge);
        }
        // The common case, a body in one read, is passed on without a copy.
        match &first {
            None if rest.is_empty() => first = Some(chunk),
            _ => {
                if let Some(f) = first.take() {
                    rest.extend_from_slice(&f);
                }
                rest.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}

/// The request head sent upstream, serialized once: the new path, the client's headers minus
/// hop-by-hop ones, an exact Content-Length for the buffered body, the request id and
/// `X-Forwarded-For`; a body up to [`INLINE_BODY_MAX`] is appended. Written straight to the
/// pooled connection, a small request costs one `send`, where pingora's client session
/// sends header and body separately.
fn upstream_head(
    req: &RequestHeader,
    client: Option<IpAddr>,
    path: &str,
    request_id: &str,
    body: &[u8],
) -> BytesMut {
    let body_len = body.len();
    let headers_len: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    let mut out = BytesMut::with_capacity(
        path.len() + headers_len + request_id.len() + 128 + inline_body_len(body_len),
    );
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut has_host = false;
    for (name, value) in &req.headers {
        let name = name.as_str();
        if HOP_BY_HOP.contains(&name)
            || matches!(name, "content-length" | "x-request-id" | "x-forwarded-for")
        {
            continue;
        }
        has_host |= name == "host";
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        // HTTP/2 clients send :authority instead; HTTP/1.1 upstreams need Host.
        out.extend_from_slice(b"host: ");
        let authority = req.uri.authority().map_or("localhost", |a| a.as_str());
        out.extend_from_slice(authority.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || req.method == http::Method::POST {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-request-id: ");
    out.extend_from_slice(request_id.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(ip) = client {
        out.extend_from_slice(b"x-forwarded-for: ");
        for prior in req.headers.get_all("x-forwarded-for") {
            out.extend_from_slice(prior.as_bytes());
            out.extend_from_slice(b", ");
        }
        // Writing into BytesMut cannot fail.
        let _ = write!(out, "{ip}");
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if inline_body_len(body_len) > 0 {
        out.extend_from_slice(body);
    }
    out
}

/// Bodies up to this size travel in the same buffer as the head: one `send` per request.
const INLINE_BODY_MAX: usize = 16 * 1024;

fn inline_body_len(body_len: usize) -> usize {
    if body_len <= INLINE_BODY_MAX {
        body_len
    } else {
        0
    }
}

/// Writes the head (with a small body already appended to it, see [`INLINE_BODY_MAX`]) and
/// any larger body, then waits for the final (non-1xx) response header.
async fn send_and_read_header(
    mut stream: pingora::protocols::Stream,
    peer: &HttpPeer,
    head: &[u8],
    body: &[u8],
    timeout: Duration,
) -> pingora::Result<UpstreamSession> {
    let write = async {
        stream.write_all(head).await?;
        if inline_body_len(body.len()) == 0 {
            stream.write_all(body).await?;
        }
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(Error::because(
                ErrorType::WriteError,
                "writing the request upstream",
                e,
            ))
        }
        Err(_) => {
            return Error::e_explain(ErrorType::WriteTimedout, "writing the request upstream")
        }
    }
    let mut up = UpstreamSession::new_with_options(stream, peer);
    up.read_timeout = Some(timeout);
    up.write_timeout = Some(timeout);
    loop {
        up.read_response().await?;
        match up.resp_header() {
            Some(h) if h.status.is_informational() => continue,
            _ => return Ok(up),
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
