//! The backend side of a request: pick an address, take a pooled connection or make one,
//! send the request and read the answer's head.
//!
//! A request that may have reached a backend is never sent twice. Only a connect failure
//! (nothing was sent) moves on to the next address, and a read (GET) whose kept-alive
//! connection the backend had already closed goes once more, to the next address in
//! rotation, on a new connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use pingora::{Error, ErrorType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::connect::Connect;
use super::forwarding::UpstreamRequest;
use super::health::UpstreamHealth;
use super::pool::{UpstreamConn, UpstreamPool};
use crate::api::failure::{Chain, UpstreamError, UpstreamErrorKind};
use crate::config::Snapshot;
use crate::http1::HeadError;
use crate::observe::exchange::UpstreamRecord;
use crate::policy::admit::RequestView;

/// Longest response head accepted from a backend.
const MAX_UPSTREAM_HEAD: usize = 64 * 1024;

/// The backends of the current snapshot, as the proxy reaches them.
pub struct Upstream {
    connector: Arc<dyn Connect>,
    pool: Arc<UpstreamPool>,
    health: Arc<UpstreamHealth>,
    next_peer: AtomicUsize,
}

/// The backend's answer to an [`UpstreamRequest`]: its head read into the connection's
/// buffer, its body still to come, for [`super::relay`] to pass on.
pub struct UpstreamResponse {
    pub conn: UpstreamConn,
    /// The connection's pool key, to return it when the answer is done.
    pub key: u64,
    /// When the request was sent.
    pub started: Instant,
}

impl Upstream {
    pub fn new(
        connector: Arc<dyn Connect>,
        pool: Arc<UpstreamPool>,
        health: Arc<UpstreamHealth>,
    ) -> Self {
        Upstream {
            connector,
            pool,
            health,
            next_peer: AtomicUsize::new(0),
        }
    }

    pub fn pool(&self) -> &Arc<UpstreamPool> {
        &self.pool
    }

    /// Sends `request` to one backend and reads the head of its answer; the failures on the
    /// way are noted in `record` and logged. `Err` is the one that ended the exchange.
    pub async fn exchange<R: RequestView>(
        &self,
        snap: &Snapshot,
        request: &UpstreamRequest<'_, R>,
        idempotent: bool,
        record: &mut UpstreamRecord,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let request_id = request.request_id;
        let upstream = &snap.upstream;
        let count = upstream.backends.len();
        let first = self.next_peer.fetch_add(1, Ordering::Relaxed);
        // Addresses that failed their health check leave the rotation, unless all have.
        let any_up = upstream.backends.iter().any(|b| self.health.is_up(&b.addr));
        let mut last_failure = UpstreamError::new(
            UpstreamErrorKind::Connect,
            "no backend address to connect to",
        );
        let mut resent = false;
        let mut rotation = (0..count).map(|i| (first + i) % count).peekable();
        while let Some(&index) = rotation.peek() {
            let backend = &upstream.backends[index];
            let (peer, key) = (&backend.peer, backend.pool_key);
            if any_up && !self.health.is_up(&backend.addr) {
                rotation.next();
                continue;
            }
            let started = Instant::now();
            // A resent request goes on a new connection, never on another pooled one.
            let pooled = if resent {
                None
            } else {
                self.pool.take(key, upstream.idle_timeout)
            };
            let reused = pooled.is_some();
            record.attempt(backend.addr, started, reused);
            let mut conn = match pooled {
                Some(conn) => conn,
                None => match self.connector.connect(peer, upstream.connect_timeout).await {
                    Ok(stream) => {
                        record.connect_time = Some(started.elapsed());
                        UpstreamConn::new(stream)
                    }
                    Err(e) => {
                        let failure =
                            UpstreamError::caused(classify(&e), "connecting to the backend", e);
                        record.errors.push(failure.kind);
                        tracing::warn!(request_id = %request_id, peer = %peer, error = %Chain(&failure), "upstream connect failed");
                        last_failure = failure;
                        rotation.next();
                        continue;
                    }
                },
            };
            match send_and_read_head(&mut conn, request, upstream.read_timeout).await {
                Ok(()) => {
                    record.header_time = Some(started.elapsed());
                    return Ok(UpstreamResponse { conn, key, started });
                }
                Err(failure) => {
                    record.errors.push(failure.kind);
                    tracing::warn!(request_id = %request_id, peer = %peer, reused, error = %Chain(&failure), "upstream exchange failed");
                    // A kept-alive connection the backend had already closed: a read goes
                    // once more, to the next address (this one just failed) unless it is the
                    // only one, on a new connection. A POST never does.
                    if reused && idempotent && !resent && failure.kind == UpstreamErrorKind::Reset {
                        resent = true;
                        if count > 1 {
                            rotation.next();
                        }
                        continue;
                    }
                    record.header_time = Some(started.elapsed());
                    return Err(failure);
                }
            }
        }
        Err(last_failure)
    }
}

/// Writes the request (its head, with a small body inside the same buffer, and any larger
/// body from where it lies), then reads until the final (non-1xx) answer head is parsed.
async fn send_and_read_head<R: RequestView>(
    up: &mut UpstreamConn,
    request: &UpstreamRequest<'_, R>,
    read_timeout: Duration,
) -> Result<(), UpstreamError> {
    request.write_head(&mut up.buf);
    let (stream, head) = (&mut up.stream, &up.buf);
    let write = async {
        stream.write_all(head).await?;
        if let Some(body) = request.separate_body() {
            stream.write_all(body).await?;
        }
        stream.flush().await
    };
    match up.timer.limit(read_timeout, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(UpstreamError::io("writing the request upstream", e)),
        Err(_) => {
            return Err(UpstreamError::new(
                UpstreamErrorKind::Timeout,
                "writing the request upstream",
            ))
        }
    }
    up.buf.clear();
    loop {
        match up.head.parse(&up.buf) {
            // The gateway never asks for an upgrade: a 101 is no interim answer to skip.
            Ok(true) if up.head.status == 101 => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend switched protocols unasked (101)",
                ))
            }
            Ok(true) if (100..200).contains(&up.head.status) => {
                up.buf.advance(up.head.len);
                continue;
            }
            Ok(true) => return Ok(()),
            Ok(false) if up.buf.len() <= MAX_UPSTREAM_HEAD => {}
            Err(HeadError::UnsupportedTransferCoding) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's answer has a transfer coding other than chunked",
                ))
            }
            _ => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's response head is not HTTP/1.x",
                ))
            }
        }
        if up.buf.capacity() - up.buf.len() < 1024 {
            up.buf.reserve(4096);
        }
        match up.timer.limit(read_timeout, up.stream.read_buf(&mut up.buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Reset,
                    "the backend closed the connection before answering",
                ))
            }
            Ok(Err(e)) => return Err(UpstreamError::io("reading the response head", e)),
            Err(_) => {
                return Err(UpstreamError::new(
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
