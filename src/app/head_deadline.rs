//! A deadline on each request head of an admin listener connection. pingora's HTTP/1.1 server,
//! which serves the admin listener, bounds each read (60 s) but not a whole head, so a client
//! that sends a head a byte now and then would hold its connection (and a file descriptor the
//! proxy listener shares) for ever: the admin listener answers its probes to everyone who can
//! reach it. [`HeadDeadline`] fails a read once a head has been open for
//! `limits.client_header_timeout`, as the proxy listener's own HTTP/1.1 does.
//!
//! A head is open from the connection's start, and from the first byte after each head's end
//! (`\r\n\r\n`), until its end: a kept-alive connection waiting for its next request has no
//! deadline (pingora's keep-alive timeout closes it). A body is read as the next head would
//! be, bounded alike: no admin endpoint reads one, and none of its clients sends one slowly.
//! So a connection whose last request had a body is closed the timeout after the body began,
//! even while it waits for its next request: a cost only to a client that sends an admin
//! request a body and keeps the connection. Empty lines before a request line open a head and
//! end none, as parsers skip them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::proxy::tcp::TcpConn;

/// Where the bytes read stand against the end of a head (an empty line: `\r\n\r\n`, or a bare
/// `\n` as pingora's parser also reads it), across reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeadScan {
    /// The line being read has a byte other than `\r`.
    line: bool,
    /// The open head has a line that is not empty. Only then does an empty line end it:
    /// parsers skip empty lines before a request line, so a client sending `\r\n` now and
    /// then has not ended a head, and must not escape the deadline with them.
    content: bool,
    /// A head has begun and not ended.
    open: bool,
}

/// What one read did to the head in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// A head ended within the bytes.
    pub ended: bool,
    /// A head is open after them.
    pub open: bool,
}

impl HeadScan {
    /// A connection's start: a head is awaited, and open.
    pub fn at_start() -> Self {
        HeadScan {
            line: false,
            content: false,
            open: true,
        }
    }

    /// Reads `bytes`.
    pub fn scan(&mut self, bytes: &[u8]) -> Scanned {
        let mut ended = false;
        for &b in bytes {
            self.open = true;
            match b {
                b'\n' if !self.line && self.content => {
                    self.open = false;
                    self.content = false;
                    ended = true;
                }
                // An empty line before the request line: skipped, the head still open.
                b'\n' if !self.line => {}
                b'\n' => self.line = false,
                b'\r' => {}
                _ => {
                    self.line = true;
                    self.content = true;
                }
            }
        }
        Scanned {
            ended,
            open: self.open,
        }
    }
}

/// A connection whose reads fail (`TimedOut`) once a request head has been open for longer
/// than its timeout.
#[derive(Debug)]
pub struct HeadDeadline {
    inner: TcpConn,
    timeout: Duration,
    scan: HeadScan,
    /// When the open head began; `None` while no head is open.
    open_since: Option<Instant>,
    /// Its timer, made on the runtime that reads the connection (not the accepting one).
    timer: Option<Pin<Box<Sleep>>>,
}

impl HeadDeadline {
    /// `inner`, just accepted: its first head must be complete within `timeout`.
    pub fn new(inner: TcpConn, timeout: Duration) -> Self {
        HeadDeadline {
            inner,
            timeout,
            scan: HeadScan::at_start(),
            open_since: Some(Instant::now()),
            timer: None,
        }
    }

    /// Whether the open head's time is up (its timer, if one is open, registered with `cx`).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(since) = self.open_since else {
            return false;
        };
        let timeout = self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(since + timeout)));
        timer.as_mut().poll(cx).is_ready()
    }
}

impl AsyncRead for HeadDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.expired(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not complete within limits.client_header_timeout",
            )));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let scanned = this.scan.scan(&buf.filled()[before..]);
        match (scanned.open, scanned.ended || this.open_since.is_none()) {
            // A new head begun: its own time.
            (true, true) => {
                this.open_since = Some(Instant::now());
                this.timer = None;
            }
            (true, false) => {}
            (false, _) => {
                this.open_since = None;
                this.timer = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for HeadDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for HeadDeadline {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut self.inner).await;
    }
}

impl UniqueID for HeadDeadline {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeadDeadline {}

impl GetTimingDigest for HeadDeadline {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for HeadDeadline {
    fn get_proxy_digest(&self) -> Option<std::sync::Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

/// The admin listener's loopback check reads the socket's addresses.
impl GetSocketDigest for HeadDeadline {
    fn get_socket_digest(&self) -> Option<std::sync::Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for HeadDeadline {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_open_from_its_first_byte_to_its_blank_line_across_reads() {
        let mut scan = HeadScan::at_start();
        let open = Scanned {
            ended: false,
            open: true,
        };
        assert_eq!(scan.scan(b""), open, "awaited from the start");
        assert_eq!(scan.scan(b"GET / HTTP/1.1\r\nHost: x\r"), open);
        assert_eq!(
            scan.scan(b"\n\r"),
            open,
            "a blank line split over reads is not yet the end"
        );
        assert_eq!(
            scan.scan(b"\n"),
            Scanned {
                ended: true,
                open: false
            }
        );
        // Kept alive: nothing is open until the next request's first byte.
        assert_eq!(
            scan.scan(b""),
            Scanned {
                ended: false,
                open: false
            }
        );
        assert_eq!(scan.scan(b"G"), open);
        // Pipelined: one head ends and the next begins in the same read.
        assert_eq!(
            scan.scan(b"ET / HTTP/1.1\r\n\r\nGET"),
            Scanned {
                ended: true,
                open: true
            }
        );
        // Bare line feeds end a head as pingora reads it; a lone `\r` ends no line.
        let mut scan = HeadScan::at_start();
        assert!(scan.scan(b"GET / HTTP/1.1\nHost: x\n\n").ended);
        let mut scan = HeadScan::at_start();
        assert!(!scan.scan(b"X\r\r\r").ended);
        // Empty lines before a request line end nothing, at the start or between requests:
        // the head they opened stays open.
        let mut scan = HeadScan::at_start();
        assert_eq!(scan.scan(b"\r\n\r\n\n"), open);
        assert!(scan.scan(b"GET / HTTP/1.1\r\n\r\n").ended);
        assert_eq!(scan.scan(b"\r\n"), open);
        assert_eq!(scan.scan(b"\r\n"), open);
    }
}
