//! A TCP connection as the gateway holds it, a client's or a plaintext backend's: the socket,
//! and bytes read ahead of the protocol that serves it, nothing more.
//!
//! pingora's L4 stream carries what its own proxy logs per connection (a socket digest with
//! three addresses, timing, write and read buffers): about 800 bytes an idle connection holds,
//! and a clock read on each I/O that waits. The gateway knows its client's address from the
//! accept (or the PROXY header) and passes it on as an [`std::net::IpAddr`], and its backend's
//! from its config, so a plaintext connection is this: the socket and, rarely, bytes put
//! back. TLS wraps it; pingora's HTTP/2 server and admin services take it as any other
//! [`pingora::protocols::IO`].
//!
//! Its reads and writes are tokio's readiness with rustix's system calls: tokio's own go
//! through glibc's `recv` and `send`, cancellation points that, in a process with threads,
//! set and clear the thread's cancellation state around the call (two compare-and-swaps,
//! four calls a proxied request). The readiness rules are tokio's: a read that does not fill
//! its buffer, or a write that does not take all of its bytes, found the socket drained or
//! full, and forgets the readiness, so that the next one waits for the runtime rather than
//! making a call to learn that.

use std::io;
use std::os::unix::io::AsRawFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use async_trait::async_trait;
use bytes::{Buf, Bytes};
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The most slices one `sendmsg(2)` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// A TCP connection: reads return the bytes put back first, then the socket's.
#[derive(Debug)]
pub struct TcpConn {
    tcp: TcpStream,
    /// Bytes already read that belong to the protocol that serves the connection: those
    /// past a PROXY protocol header, or an HTTP/2 preface HTTP/1.1 read before it knew.
    rewound: Bytes,
}

impl TcpConn {
    pub fn new(tcp: TcpStream) -> Self {
        TcpConn {
            tcp,
            rewound: Bytes::new(),
        }
    }

    /// Puts `read` back before whatever is still to be read.
    pub fn rewind(&mut self, read: &[u8]) {
        if read.is_empty() {
            return;
        }
        self.rewound = if self.rewound.is_empty() {
            Bytes::copy_from_slice(read)
        } else {
            [read, &self.rewound[..]].concat().into()
        };
    }
}

impl AsyncRead for TcpConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.rewound.is_empty() {
            return self.poll_recv(cx, buf);
        }
        let n = self.rewound.len().min(buf.remaining());
        buf.put_slice(&self.rewound[..n]);
        self.rewound.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl TcpConn {
    /// `recv(2)` into `buf` once the socket is readable.
    #[allow(unsafe_code)]
    fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // SAFETY: `unfilled_mut` asks that no initialised byte be de-initialised: `recv` only
        // writes what it received into the unfilled part.
        let unfilled = unsafe { buf.unfilled_mut() };
        let room = unfilled.len();
        let n = ready!(self.poll_call(cx, Interest::READABLE, room, || {
            let ((filled, _), _) =
                rustix::net::recv(&self.tcp, &mut *unfilled, RecvFlags::empty())?;
            Ok(filled.len())
        }))?;
        // SAFETY: `recv` wrote these `n` bytes (at most the part's length).
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }

    /// Makes `call` (a read or write of at most `room` bytes) once the socket is ready for
    /// `interest`, and again while it finds the socket not ready after all; the bytes it moved.
    fn poll_call(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        room: usize,
        mut call: impl FnMut() -> rustix::io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            if interest.is_readable() {
                ready!(self.tcp.poll_read_ready(cx))?;
            } else {
                ready!(self.tcp.poll_write_ready(cx))?;
            }
            let mut moved = None;
            let outcome = self.tcp.try_io(interest, || {
                let n = call()?;
                moved = Some(n);
                drained(n, room)
            });
            if let Some(n) = moved {
                return Poll::Ready(Ok(n));
            }
            match outcome {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
                Ok(()) => unreachable!("a call that succeeded is returned above"),
            }
        }
    }
}

/// What a read or write that moved `n` of the `room` bytes it could says of its readiness:
/// some but not all means the socket is drained (or full) until the runtime says otherwise,
/// which `WouldBlock` tells [`TcpStream::try_io`] (it then clears the readiness it saw before
/// the call, not any that came since).
fn drained(n: usize, room: usize) -> io::Result<()> {
    if 0 < n && n < room {
        Err(io::ErrorKind::WouldBlock.into())
    } else {
        Ok(())
    }
}

impl AsyncWrite for TcpConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_call(cx, Interest::WRITABLE, buf.len(), || {
            rustix::net::send(&self.tcp, buf, SendFlags::NOSIGNAL)
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // The kernel refuses more slices than IOV_MAX in one call; std's `writev` sends the
        // first IOV_MAX, and so does this.
        let bufs = &bufs[..bufs.len().min(IOV_MAX)];
        let offered = bufs.iter().map(|b| b.len()).sum();
        self.poll_call(cx, Interest::WRITABLE, offered, || {
            let mut no_control = SendAncillaryBuffer::default();
            rustix::net::sendmsg(&self.tcp, bufs, &mut no_control, SendFlags::NOSIGNAL)
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for TcpConn {
    async fn shutdown(&mut self) {
        // The client may be gone already: there is nothing to tell it then.
        let _ = AsyncWriteExt::shutdown(&mut self.tcp).await;
    }
}

impl UniqueID for TcpConn {
    fn id(&self) -> UniqueIDType {
        self.tcp.as_raw_fd() as UniqueIDType
    }
}

impl Ssl for TcpConn {}

impl GetTimingDigest for TcpConn {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        Vec::new()
    }
}

impl GetProxyDigest for TcpConn {
    fn get_proxy_digest(&self) -> Option<std::sync::Arc<ProxyDigest>> {
        None
    }
}

/// The client's address travels beside the stream, from the accept (or the PROXY header).
/// A digest is made when pingora asks (an admin request's session, an HTTP/2 connection's),
/// not held by the connection: its addresses are read from the socket only if someone reads
/// them (the admin listener's loopback check).
impl GetSocketDigest for TcpConn {
    fn get_socket_digest(&self) -> Option<std::sync::Arc<SocketDigest>> {
        Some(std::sync::Arc::new(SocketDigest::from_raw_fd(
            self.tcp.as_raw_fd(),
        )))
    }
}

#[async_trait]
impl Peek for TcpConn {}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use super::*;
    use tokio::io::AsyncReadExt;

    /// A client and the accepted end of its connection, the latter as the gateway holds it.
    async fn connected() -> (TcpStream, TcpConn) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        (client, TcpConn::new(tcp))
    }

    /// Whether the runtime still takes `conn`'s socket for ready for `interest`: `try_io`
    /// calls its function only then, and a function that succeeds leaves the readiness as
    /// it was.
    fn still_ready(conn: &TcpConn, interest: Interest) -> bool {
        conn.tcp.try_io(interest, || Ok(())).is_ok()
    }

    #[tokio::test]
    async fn a_read_that_leaves_room_forgets_the_readiness_and_a_full_one_keeps_it() {
        let (mut client, mut conn) = connected().await;
        client.write_all(b"0123456789").await.unwrap();
        // Both reads are whole: the bytes are there once the first read is woken.
        let mut four = [0u8; 4];
        conn.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"0123");
        assert!(
            still_ready(&conn, Interest::READABLE),
            "a read that filled its buffer may have left bytes: the next one reads"
        );
        let mut room = [0u8; 64];
        let n = conn.read(&mut room).await.unwrap();
        assert_eq!(&room[..n], b"456789");
        assert!(
            !still_ready(&conn, Interest::READABLE),
            "a short read drained the socket: the next read waits for the runtime"
        );
        client.write_all(b"more").await.unwrap();
        let n = conn.read(&mut room).await.unwrap();
        assert_eq!(&room[..n], b"more", "and it is woken by the next bytes");
        drop(client);
        assert_eq!(
            conn.read(&mut room).await.unwrap(),
            0,
            "the end of the stream"
        );
    }

    #[tokio::test]
    async fn writes_reach_the_peer_and_a_write_the_socket_cannot_take_whole_forgets_the_readiness()
    {
        let (mut client, mut conn) = connected().await;
        conn.write_all(b"head ").await.unwrap();
        let parts = [IoSlice::new(b"and "), IoSlice::new(b"body")];
        let n = conn.write_vectored(&parts).await.unwrap();
        assert_eq!(n, 8, "both slices in one call");
        assert!(still_ready(&conn, Interest::WRITABLE));
        let mut got = [0u8; 13];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"head and body");
        // Nobody reads: a write larger than both sockets' buffers is taken in part.
        let big = vec![b'x'; 64 * 1024 * 1024];
        let n = conn.write(&big).await.unwrap();
        assert!(0 < n && n < big.len(), "{n} bytes taken");
        assert!(
            !still_ready(&conn, Interest::WRITABLE),
            "a full socket: the next write waits for the runtime"
        );
    }

    #[tokio::test]
    async fn a_write_of_more_slices_than_one_call_takes_sends_the_first_ones() {
        let (mut client, mut conn) = connected().await;
        let byte = [b'x'];
        let slices = vec![IoSlice::new(&byte); IOV_MAX + 1];
        let n = conn.write_vectored(&slices).await.unwrap();
        assert_eq!(n, IOV_MAX, "one byte a slice, IOV_MAX of them");
        let mut got = vec![0u8; IOV_MAX];
        client.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == b'x'));
    }

    #[tokio::test]
    async fn a_reset_connection_is_an_error_on_read_and_write() {
        let (client, mut conn) = connected().await;
        socket2::SockRef::from(&client)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(client);
        let mut room = [0u8; 16];
        let read = conn.read(&mut room).await;
        assert_eq!(
            read.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset)
        );
        let written = conn.write_all(b"anyone?").await;
        assert!(written.is_err(), "{written:?}");
    }

    #[tokio::test]
    async fn bytes_put_back_are_read_first_in_order_then_the_sockets() {
        let (mut client, mut stream) = connected().await;
        client.write_all(b"socket").await.unwrap();
        stream.rewind(b"second ");
        stream.rewind(b"first ");
        stream.rewind(b"");
        let mut small = [0u8; 4];
        stream.read_exact(&mut small).await.unwrap();
        assert_eq!(
            &small, b"firs",
            "a short read takes part of what was put back"
        );
        let mut rest = vec![0u8; "t second socket".len()];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest, b"t second socket");
    }
}
