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

use std::os::unix::io::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::{Buf, Bytes};
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

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
    ) -> Poll<std::io::Result<()>> {
        if self.rewound.is_empty() {
            return Pin::new(&mut self.tcp).poll_read(cx, buf);
        }
        let n = self.rewound.len().min(buf.remaining());
        buf.put_slice(&self.rewound[..n]);
        self.rewound.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TcpConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
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
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn bytes_put_back_are_read_first_in_order_then_the_sockets() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let mut stream = TcpConn::new(tcp);
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
