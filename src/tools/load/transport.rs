//! Connections to the target: TCP, TLS on an `https://` target (rustls, through pingora's
//! tokio-rustls), and with `--http2` the HTTP/2 handshake over either: ALPN `h2` on TLS, prior
//! knowledge (h2c) on plaintext.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use pingora::tls::{ClientTlsStream, TlsConnector};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Tcp(io::Error),
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
    #[error("the server did not agree to HTTP/2 in the TLS handshake (ALPN h2)")]
    NoH2,
    #[error("HTTP/2 handshake: {0}")]
    H2(h2::Error),
}

/// Makes the connections of a run, all alike.
#[derive(Clone)]
pub struct Connector {
    pub addr: SocketAddr,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("addr", &self.addr)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

impl Connector {
    /// Plain TCP to `addr`.
    pub fn plain(addr: SocketAddr) -> Connector {
        Connector { addr, tls: None }
    }

    /// TLS to `addr` with `config`, asking for and checking `name`.
    pub fn tls(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> Connector {
        Connector {
            addr,
            tls: Some((TlsConnector::from(config), name)),
        }
    }

    /// Whether its connections speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A connection, TLS done if the target is https.
    pub async fn stream(&self) -> Result<Stream, ConnectError> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(ConnectError::Tcp)?;
        tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
        match &self.tls {
            None => Ok(Stream::Plain(tcp)),
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(ConnectError::Tls)?;
                Ok(Stream::Tls(Box::new(tls)))
            }
        }
    }

    /// An HTTP/2 connection, its frames read and written by a task of its own until every
    /// handle to it is dropped or it fails.
    pub async fn h2(&self) -> Result<h2::client::SendRequest<Bytes>, ConnectError> {
        let io = self.stream().await?;
        if let Stream::Tls(tls) = &io {
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(ConnectError::NoH2);
            }
        }
        let (send, connection) = h2::client::handshake(io).await.map_err(ConnectError::H2)?;
        tokio::spawn(async move {
            // How it ended shows in the requests that were on it.
            let _ = connection.await;
        });
        Ok(send)
    }
}

/// A client connection, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<ClientTlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
