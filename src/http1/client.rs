//! The client side of HTTP/1.1 over any async stream (TCP, TLS, in-memory): responses read
//! one after another from a kept-alive connection, with the same head parser and chunked
//! decoder the proxy uses. The load generator and the health checker read their answers
//! through [`ResponseReader`]. (The CLI and the Prometheus client, which need TLS roots and
//! credentials, use [`crate::client`].)

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{ChunkedDecoder, Framing, RequestWriter, ResponseHead};

/// Why a response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the response is not valid HTTP/1.1")]
    Malformed,
    #[error("the response is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the connection closed before the response was complete")]
    Closed,
}

/// Reads responses from one connection into buffers it keeps from one response to the next.
#[derive(Debug, Default)]
pub struct ResponseReader {
    /// What has been read: the current response, then any bytes after it.
    buf: BytesMut,
    head: ResponseHead,
    /// The current response's body, decoded.
    body: Vec<u8>,
    /// Bytes at the front of `buf` that the current response took.
    consumed: usize,
}

impl ResponseReader {
    /// Reads the next final response (interim 1xx answers are skipped), head and whole body,
    /// at most `max_bytes` of it.
    pub async fn read<S>(&mut self, stream: &mut S, max_bytes: usize) -> Result<(), ClientError>
    where
        S: AsyncRead + Unpin + ?Sized,
    {
        self.buf.advance(self.consumed);
        self.consumed = 0;
        self.body.clear();
        loop {
            match self.head.parse(&self.buf) {
                Ok(true) if (100..200).contains(&self.head.status) => {
                    self.buf.advance(self.head.len);
                    continue;
                }
                Ok(true) => break,
                Ok(false) => {}
                Err(_) => return Err(ClientError::Malformed),
            }
            if self.buf.len() > max_bytes {
                return Err(ClientError::TooLarge(max_bytes));
            }
            if self.fill(stream).await? == 0 {
                return Err(ClientError::Closed);
            }
        }
        let start = self.head.len;
        self.consumed = match self.head.framing {
            Framing::Length(n) => {
                let end = usize::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_add(start))
                    .filter(|end| *end <= max_bytes)
                    .ok_or(ClientError::TooLarge(max_bytes))?;
                while self.buf.len() < end {
                    if self.fill(stream).await? == 0 {
                        return Err(ClientError::Closed);
                    }
                }
                self.body.extend_from_slice(&self.buf[start..end]);
                end
            }
            Framing::Chunked => {
                let mut decoder = ChunkedDecoder::default();
                let mut at = start;
                loop {
                    let body = &mut self.body;
                    let (used, done) = decoder
                        .decode(&self.buf[at..], |data| body.extend_from_slice(data))
                        .map_err(|_| ClientError::Malformed)?;
                    at += used;
                    if done {
                        break at;
                    }
                    if self.body.len() > max_bytes {
                        return Err(ClientError::TooLarge(max_bytes));
                    }
                    if self.fill(stream).await? == 0 {
                        return Err(ClientError::Closed);
                    }
                }
            }
            Framing::UntilClose => {
                while self.fill(stream).await? > 0 {
                    if self.buf.len() > max_bytes {
                        return Err(ClientError::TooLarge(max_bytes));
                    }
                }
                self.body.extend_from_slice(&self.buf[start..]);
                self.buf.len()
            }
        };
        Ok(())
    }

    async fn fill<S>(&mut self, stream: &mut S) -> std::io::Result<usize>
    where
        S: AsyncRead + Unpin + ?Sized,
    {
        if self.buf.capacity() - self.buf.len() < 2048 {
            self.buf.reserve(8192);
        }
        stream.read_buf(&mut self.buf).await
    }

    /// Forgets what was read: for a new connection.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.body.clear();
        self.consumed = 0;
    }

    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// The body of the last response read, decoded.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Whether the server keeps the connection open after the last response.
    pub fn keep_alive(&self) -> bool {
        self.head.keep_alive
    }

    /// The first value of a header of the last response (`name` in any case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head
            .headers(&self.buf)
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }
}

/// A `GET` of `path` on a connection the server may close after answering, read whole (at
/// most `max_bytes`).
pub async fn get<S>(
    stream: &mut S,
    host: &str,
    path: &str,
    max_bytes: usize,
) -> Result<ResponseReader, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut request = BytesMut::with_capacity(128);
    let mut w = RequestWriter::new(&mut request, "GET", path);
    w.header("host", host)
        .header(
            "user-agent",
            concat!("agent-gateway/", env!("CARGO_PKG_VERSION")),
        )
        .header("connection", "close");
    w.end();
    stream.write_all(&request).await?;
    stream.flush().await?;
    let mut reader = ResponseReader::default();
    reader.read(stream, max_bytes).await?;
    Ok(reader)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads every response that `wire` holds, split into reads of `piece` bytes.
    async fn read_all(wire: &[u8], piece: usize) -> Vec<Result<(u16, Vec<u8>, bool), String>> {
        let mut stream = tokio_test::io::Builder::new();
        for part in wire.chunks(piece) {
            stream.read(part);
        }
        let mut stream = stream.build();
        let mut reader = ResponseReader::default();
        let mut out = Vec::new();
        loop {
            match reader.read(&mut stream, 1 << 20).await {
                Ok(()) => out.push(Ok((
                    reader.status(),
                    reader.body().to_vec(),
                    reader.keep_alive(),
                ))),
                Err(ClientError::Closed) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[tokio::test]
    async fn responses_of_every_framing_are_read_one_after_another() {
        let wire = b"HTTP/1.1 100 Continue\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello\
            HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\n\
            HTTP/1.1 204 No Content\r\n\r\n\
            HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end";
        for piece in [1, 7, wire.len()] {
            assert_eq!(
                read_all(wire, piece).await,
                vec![
                    Ok((200, b"hello".to_vec(), true)),
                    Ok((404, b"abc".to_vec(), true)),
                    Ok((204, vec![], true)),
                    Ok((200, b"until the end".to_vec(), false)),
                ],
                "in pieces of {piece}"
            );
        }
    }

    #[tokio::test]
    async fn a_close_or_http10_answer_ends_the_connection() {
        for wire in [
            &b"HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        ] {
            let answers = read_all(wire, 64).await;
            assert_eq!(answers.len(), 1);
            assert!(!answers[0].as_ref().unwrap().2, "kept alive after {wire:?}");
        }
    }

    #[tokio::test]
    async fn broken_and_short_responses_are_errors() {
        assert_eq!(
            read_all(b"garbage\r\n\r\n", 64).await,
            vec![Err("the response is not valid HTTP/1.1".into())]
        );
        // A response cut short is not a response.
        assert_eq!(
            read_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf", 64).await,
            vec![]
        );
        assert_eq!(
            read_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
                64
            )
            .await,
            vec![Err("the response is not valid HTTP/1.1".into())]
        );
    }

    #[tokio::test]
    async fn a_get_writes_one_request_and_reads_the_answer() {
        let mut stream = tokio_test::io::Builder::new()
            .write(b"GET /readyz HTTP/1.1\r\nhost: gw:9090\r\nuser-agent: ")
            .write(concat!("agent-gateway/", env!("CARGO_PKG_VERSION")).as_bytes())
            .write(b"\r\nconnection: close\r\n\r\n")
            .read(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}")
            .build();
        let r = get(&mut stream, "gw:9090", "/readyz", 1024).await.unwrap();
        assert_eq!((r.status(), r.body()), (503, &b"{}"[..]));
        assert_eq!(r.header("x-a"), Some(&b"b"[..]));
    }
}
