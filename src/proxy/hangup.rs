//! Whether a client has hung up, seen on its socket without reading from it: for the time a
//! request waits for a backend connection, when nothing reads the client's connection.
//!
//! The watch is on a second descriptor of the socket (`dup(2)`), registered with the runtime on
//! its own. It takes nothing from the connection, which the waiting request borrows, and its
//! readiness is its own: bytes the client sends meanwhile (a pipelined request, a TLS record)
//! stay for the connection to read, and the watch waits on for the hang-up. A hang-up is the
//! client's FIN or reset (`EPOLLRDHUP`, `EPOLLHUP`), as nginx reads it while a request waits
//! upstream (`ngx_http_upstream_check_broken_connection`): a client that half-closes after its
//! request counts as gone, as it does there. The descriptor is made on the first poll, so a
//! request that never waits costs nothing.
//!
//! An error alone (`EPOLLERR` without `EPOLLHUP`) is no hang-up. Linux reports every end of a
//! TCP connection with `EPOLLHUP` (`tcp_done`: a reset, a retransmission or keepalive timeout,
//! `ss -K`); an error without it is news on a live connection (an ICMP error on a socket with
//! `IP_RECVERR`, an entry on its error queue, such as a send timestamp), none of which the
//! gateway asks for. nginx, reading epoll with `EPOLLRDHUP`, ends a waiting request on the
//! hang-up alone too.

use std::io;
use std::os::fd::BorrowedFd;

use pingora::protocols::tls::TlsStream;
use pingora::protocols::Stream;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::tcp::TcpConn;

/// Ready once the client at the other end of `stream` has hung up; pending for good when its
/// socket cannot be watched (logged).
pub async fn hung_up(stream: &Stream) {
    match watch(stream) {
        Ok(socket) => until_hung_up(&socket).await,
        Err(e) => {
            tracing::debug!(error = %e, "the client's socket cannot be watched for a hang-up");
            std::future::pending().await
        }
    }
}

/// A second descriptor of the socket under `stream`, registered with the runtime.
#[allow(unsafe_code)]
fn watch(stream: &Stream) -> io::Result<TcpStream> {
    let any = stream.as_any();
    if !any.is::<TcpConn>() && !any.is::<TlsStream<TcpConn>>() {
        return Err(io::Error::other("not a TCP connection"));
    }
    // SAFETY: a `TcpConn`'s id is its socket's descriptor (a TLS stream's is its TCP
    // connection's), open while `stream` is borrowed, which is longer than this call. pingora
    // gives no other way to the socket under a TLS stream.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.id()) };
    TcpStream::from_std(std::net::TcpStream::from(fd.try_clone_to_owned()?))
}

async fn until_hung_up(socket: &TcpStream) {
    loop {
        match socket.ready(Interest::READABLE).await {
            Ok(ready) if !ready.is_read_closed() => {
                // Bytes to read, which are the connection's: this descriptor forgets that it
                // is readable (the connection's own registration does not), and waits for
                // what comes next.
                let _ = socket.try_io(Interest::READABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A client and the accepted end of its connection, the latter as the gateway holds it.
    async fn connected() -> (TcpStream, Stream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (client, Box::new(TcpConn::new(accepted)))
    }

    /// Bytes the client sends are no hang-up, and stay for the connection to read; the
    /// client's FIN after them is one.
    #[tokio::test]
    async fn bytes_are_left_for_the_connection_and_the_close_after_them_is_seen() {
        let (mut client, mut stream) = connected().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        {
            let mut watch = std::pin::pin!(hung_up(&stream));
            let waited = tokio::time::timeout(Duration::from_millis(200), &mut watch).await;
            assert!(waited.is_err(), "bytes taken for a hang-up");
            client.shutdown().await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), watch)
                .await
                .expect("the FIN after the bytes was not seen");
        }
        let mut read = Vec::new();
        stream.read_to_end(&mut read).await.unwrap();
        assert_eq!(
            read, b"GET / HTTP/1.1\r\n\r\n",
            "the connection reads them whole"
        );
    }

    /// A client's reset is a hang-up: the kernel reports it with `EPOLLHUP` (and `EPOLLERR`).
    #[tokio::test]
    async fn a_reset_is_seen() {
        let (client, stream) = connected().await;
        let mut watch = std::pin::pin!(hung_up(&stream));
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut watch).await;
        assert!(waited.is_err(), "a hang-up before the client left");
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client);
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .expect("the reset was not seen");
    }

    /// An error reported alone, on a connection that lives on, is no hang-up: here a send
    /// timestamp on the socket's error queue (`EPOLLERR`, no `EPOLLHUP`). The client's close
    /// after it is one.
    #[tokio::test]
    async fn an_error_alone_is_no_hang_up() {
        use std::io::Write;

        use std::os::fd::AsRawFd;

        use nix::sys::socket::{recvmsg, setsockopt, sockopt, MsgFlags, TimestampingFlag};

        let (mut client, stream) = connected().await;
        let watched = &stream;
        let mut gone = std::pin::pin!(hung_up(watched));
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut gone).await;
        assert!(waited.is_err(), "a hang-up before anything happened");

        // The same socket, to stamp and send on while the watch is on.
        let socket = watch(watched).unwrap().into_std().unwrap();
        setsockopt(
            &socket,
            sockopt::Timestamping,
            &(TimestampingFlag::SOF_TIMESTAMPING_TX_SOFTWARE
                | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE
                | TimestampingFlag::SOF_TIMESTAMPING_OPT_TSONLY),
        )
        .unwrap();
        (&socket).write_all(b"x").unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(200), &mut gone).await;
        assert!(waited.is_err(), "an error alone taken for a hang-up");
        // The error was there all along (else this test would test nothing): the stamp is on
        // the error queue still.
        let mut control = nix::cmsg_space!([u8; 64]);
        let stamped = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut [],
            Some(&mut control),
            MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
        );
        assert!(stamped.is_ok(), "no error on the queue: {stamped:?}");

        let mut byte = [0; 1];
        client.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x", "the connection lives on");
        client.shutdown().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the FIN after the error was not seen");
    }
}
