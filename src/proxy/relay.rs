//! Relaying the backend's answer to the client: a pure filter decides which of its headers
//! pass ([`relayed_headers`]), then the body moves as it arrives from the backend's buffer
//! into the client's, decoded when the client needs it so ([`BodyMover`]). The backend's
//! connection goes back to the pool as soon as its part is over.

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;

use super::downstream::Downstream;
use super::pool::{UpstreamConn, UpstreamPool};
use super::upstream::UpstreamResponse;
use crate::api::failure::UpstreamErrorKind;
use crate::config::Snapshot;
use crate::http1::{
    reserve_for_read, ChunkError, ChunkedDecoder, Framing, ResponseHead, READ_CHUNK,
};
use crate::observe::exchange::Exchange;
use crate::policy::admit::RetirementHeaders;
use crate::policy::headers::NOT_RELAYED;
use crate::policy::request_id;

/// The backend's headers that reach the client: all but those of its hop and its framing
/// ([`NOT_RELAYED`], and any it named in `Connection`). The client's framing headers are the
/// downstream's to write, from the framing the gateway read.
pub fn relayed_headers<'a>(
    head: &'a ResponseHead,
    buf: &'a [u8],
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    head.headers(buf).filter(move |(name, _)| {
        !(NOT_RELAYED.contains(name)
            || (head.declares_hop_headers && head.connection_lists(buf, name)))
    })
}

/// Moves a response body from the backend's read buffer to the client's output as it
/// arrives: as framed (chunked bytes pass through) or decoded.
pub struct BodyMover {
    framing: Framing,
    decode: bool,
    decoder: ChunkedDecoder,
    /// Bytes still to come of a body of known length.
    left: u64,
}

impl BodyMover {
    pub fn new(framing: Framing, decode: bool) -> Self {
        BodyMover {
            framing,
            decode,
            decoder: ChunkedDecoder::default(),
            left: match framing {
                Framing::Length(n) => n,
                _ => u64::MAX,
            },
        }
    }

    /// Moves what `input` holds of the body into `out`, taking it out of `input`; says
    /// whether the body is complete.
    pub fn step(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<bool, ChunkError> {
        match self.framing {
            Framing::Length(_) => {
                let n = input
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[..n]);
                input.advance(n);
                self.left -= n as u64;
                Ok(self.left == 0)
            }
            Framing::Chunked => {
                let (used, done) = if self.decode {
                    self.decoder
                        .decode(input, |data| out.extend_from_slice(data))?
                } else {
                    let (used, done) = self.decoder.decode(input, |_| {})?;
                    out.extend_from_slice(&input[..used]);
                    (used, done)
                };
                input.advance(used);
                Ok(done)
            }
            Framing::UntilClose => {
                out.extend_from_slice(input);
                input.clear();
                Ok(false)
            }
        }
    }
}

/// Relays the answer whose head `response` holds, with the request id and the `retirement` headers added.
pub(super) async fn relay<D: Downstream>(
    pool: &UpstreamPool,
    d: &mut D,
    response: UpstreamResponse,
    snap: &Snapshot,
    ex: &mut Exchange<'_>,
    retirement: &RetirementHeaders<'_>,
) {
    let UpstreamResponse { mut conn, started } = response;
    let framing = conn.head.framing;
    let decode = framing == Framing::Chunked && d.wants_decoded();
    ex.status = conn.head.status;
    {
        let up = &conn;
        let headers = relayed_headers(&up.head, &up.buf)
            .chain([(request_id::HEADER.as_bytes(), ex.request_id.as_bytes())])
            .chain(retirement.headers());
        // A decoded body has no framing left for the client: it ends when the connection does.
        let to_client = if decode { Framing::UntilClose } else { framing };
        d.start_response(up.head.status, up.head.reason(&up.buf), headers, to_client);
    }
    conn.buf.advance(conn.head.len);
    // Only body bytes count as sent; the head goes out with the first of them.
    let mut head_bytes = d.out().len();
    let mut body = BodyMover::new(framing, decode);
    let read_timeout = snap.upstream.read_timeout;
    loop {
        let done = match body.step(&mut conn.buf, d.out()) {
            Ok(done) => done,
            Err(ChunkError) => {
                ex.upstream.errors.push(UpstreamErrorKind::Other);
                ex.upstream.answer_broken = true;
                tracing::warn!(request_id = %ex.request_id, "upstream sent broken chunked framing; closing client connection");
                d.abort();
                return;
            }
        };
        if done {
            break;
        }
        // Counted once sent: a client gone mid-response got none of them.
        let body_bytes = d.out().len() - head_bytes;
        head_bytes = 0;
        if let Err(e) = d.send(false).await {
            tracing::debug!(request_id = %ex.request_id, error = %e, "client went away mid-response");
            ex.client_aborted = true;
            return;
        }
        ex.bytes_out += body_bytes;
        match read_more(&mut conn, read_timeout).await {
            Ok(true) => {}
            Ok(false) if framing == Framing::UntilClose => break,
            result => {
                // The head is already out: the only honest signal left is to close.
                let kind = match result {
                    Err(kind) => kind,
                    Ok(_) => UpstreamErrorKind::Reset,
                };
                ex.upstream.errors.push(kind);
                ex.upstream.answer_broken = true;
                tracing::warn!(request_id = %ex.request_id, kind = kind.as_str(), "upstream broke mid-response; closing client connection");
                d.abort();
                return;
            }
        }
    }
    // The backend's part is over: its connection goes back to the pool before the client
    // has the last bytes, so the client's next request can have it.
    let ended = std::time::Instant::now();
    ex.upstream.duration = Some(ended - started);
    if conn.head.keep_alive {
        pool.put(conn, ended.into());
    }
    let body_bytes = d.out().len() - head_bytes;
    match d.send(true).await {
        Ok(()) => ex.bytes_out += body_bytes,
        Err(e) => {
            tracing::debug!(request_id = %ex.request_id, error = %e, "client went away at the end of the response");
            ex.client_aborted = true;
        }
    }
}

/// Reads more of the answer: `Ok(false)` when the backend closed the connection.
async fn read_more(
    conn: &mut UpstreamConn,
    read_timeout: std::time::Duration,
) -> Result<bool, UpstreamErrorKind> {
    // The answer goes on past its head's buffer: read it a chunk at a time.
    reserve_for_read(&mut conn.buf, READ_CHUNK);
    match conn
        .timer
        .limit(read_timeout, conn.stream.read_buf(&mut conn.buf))
        .await
    {
        Ok(Ok(n)) => Ok(n > 0),
        Ok(Err(_)) => Err(UpstreamErrorKind::Reset),
        Err(_) => Err(UpstreamErrorKind::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8]) -> ResponseHead {
        let mut head = ResponseHead::default();
        assert_eq!(head.parse(raw), Ok(true));
        head
    }

    fn relayed(raw: &[u8]) -> Vec<String> {
        let h = head(raw);
        relayed_headers(&h, raw)
            .map(|(n, v)| {
                format!(
                    "{}: {}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                )
            })
            .collect()
    }

    #[test]
    fn the_backends_hop_and_framing_headers_are_filtered() {
        let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n\
            X-Request-Id: backend\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nX-Kept: y\r\n\r\n";
        assert_eq!(relayed(raw), ["X-Kept: y"]);
    }

    /// Feeds `wire` in pieces of `piece` bytes; returns what reached the client and whether
    /// the mover saw the end.
    fn moved(framing: Framing, decode: bool, wire: &[u8], piece: usize) -> (Vec<u8>, bool) {
        let mut mover = BodyMover::new(framing, decode);
        let (mut input, mut out) = (BytesMut::new(), BytesMut::new());
        for part in wire.chunks(piece) {
            input.extend_from_slice(part);
            if mover.step(&mut input, &mut out).unwrap() {
                return (out.to_vec(), true);
            }
        }
        (out.to_vec(), false)
    }

    #[test]
    fn bodies_move_as_framed_or_decoded_whatever_the_pieces() {
        let chunked = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        for piece in [1, 4, chunked.len()] {
            assert_eq!(
                moved(Framing::Chunked, false, chunked, piece),
                (chunked.to_vec(), true)
            );
            assert_eq!(
                moved(Framing::Chunked, true, chunked, piece),
                (b"abcde".to_vec(), true)
            );
            assert_eq!(
                moved(Framing::Length(5), false, b"hello", piece.min(5)),
                (b"hello".to_vec(), true)
            );
        }
        assert_eq!(
            moved(Framing::UntilClose, false, b"to the end", 3),
            (b"to the end".to_vec(), false)
        );
    }

    #[test]
    fn bytes_after_a_body_of_known_length_stay_in_the_input() {
        let mut mover = BodyMover::new(Framing::Length(2), false);
        let (mut input, mut out) = (BytesMut::from(&b"okEXTRA"[..]), BytesMut::new());
        assert_eq!(mover.step(&mut input, &mut out), Ok(true));
        assert_eq!((&out[..], &input[..]), (&b"ok"[..], &b"EXTRA"[..]));
    }
}
