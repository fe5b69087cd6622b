//! Relaying the backend's answer to the client: a pure filter decides which of its headers
//! pass ([`relayed_headers`]) and how its body is framed for the client ([`client_framing`]),
//! then the body moves as it arrives from the backend's buffer into the client's, decoded or
//! chunked on the way when the client needs it so ([`BodyMover`]). The backend's connection
//! goes back to the pool as soon as its part is over.
//!
//! An answer that breaks before any of its body's data has gone to the client is answered by
//! the gateway instead (502, 504), as a failed exchange is; after, the client's connection
//! (or HTTP/2 stream) is aborted, and the framing the client got shows the answer cut short.
//! So is one whose client stopped taking it (`limits.client_send_timeout`).

use std::time::Instant;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;

use super::downstream::Downstream;
use super::pool::UpstreamConn;
use super::upstream::{Upstream, UpstreamResponse};
use crate::api::failure::{UpstreamError, UpstreamErrorKind};
use crate::config::Snapshot;
use crate::http1::{
    reserve_for_read, write_chunk, ChunkError, ChunkedDecoder, Framing, ResponseHead, LAST_CHUNK,
    READ_CHUNK,
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

/// What the relay does to the body's bytes between the backend's framing and the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recode {
    /// They pass as they came.
    Pass,
    /// Chunked framing taken off, for a client that cannot read it.
    Decode,
    /// Chunked framing put on a body that ends with the backend's connection, so that the
    /// client can tell a whole body from one cut short, and keep its connection.
    Encode,
}

/// How the client gets a body the backend framed `backend`, and what that takes: an
/// HTTP/1.1 client reads chunked framing; an HTTP/1.0 client, or an HTTP/2 stream (whose
/// frames end the body), reads the data until its end.
pub fn client_framing(backend: Framing, reads_chunked: bool) -> (Framing, Recode) {
    match (backend, reads_chunked) {
        (Framing::Chunked, false) => (Framing::UntilClose, Recode::Decode),
        (Framing::UntilClose, true) => (Framing::Chunked, Recode::Encode),
        (framing, _) => (framing, Recode::Pass),
    }
}

/// Moves a response body from the backend's read buffer to the client's output as it
/// arrives, recoded as [`client_framing`] decided, and counts its data.
pub struct BodyMover {
    /// The backend's framing.
    framing: Framing,
    recode: Recode,
    decoder: ChunkedDecoder,
    /// Bytes still to come of a body of known length.
    left: u64,
    /// The body's data moved so far, framing left out.
    data: u64,
}

impl BodyMover {
    /// A mover of a body the backend framed `backend` to a client that reads chunked framing
    /// or not, and the framing the client gets it in.
    pub fn for_client(backend: Framing, reads_chunked: bool) -> (Framing, Self) {
        let (to_client, recode) = client_framing(backend, reads_chunked);
        let mover = BodyMover {
            framing: backend,
            recode,
            decoder: ChunkedDecoder::default(),
            left: match backend {
                Framing::Length(n) => n,
                _ => u64::MAX,
            },
            data: 0,
        };
        (to_client, mover)
    }

    /// The body's data moved so far (what the access log's `bytes_out` counts once sent).
    pub fn data(&self) -> u64 {
        self.data
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
                self.data += n as u64;
                Ok(self.left == 0)
            }
            Framing::Chunked => {
                let data = &mut self.data;
                let (used, done) = if self.recode == Recode::Decode {
                    self.decoder.decode(input, |d| {
                        *data += d.len() as u64;
                        out.extend_from_slice(d);
                    })?
                } else {
                    let (used, done) = self.decoder.decode(input, |d| *data += d.len() as u64)?;
                    out.extend_from_slice(&input[..used]);
                    (used, done)
                };
                input.advance(used);
                Ok(done)
            }
            Framing::UntilClose => {
                if input.is_empty() {
                    return Ok(false);
                }
                if self.recode == Recode::Encode {
                    write_chunk(out, input);
                } else {
                    out.extend_from_slice(input);
                }
                self.data += input.len() as u64;
                input.clear();
                Ok(false)
            }
        }
    }

    /// Ends a body that ended with the backend's connection: its last chunk, when it was
    /// chunked on the way.
    pub fn finish(&self, out: &mut BytesMut) {
        if self.recode == Recode::Encode {
            out.extend_from_slice(LAST_CHUNK);
        }
    }
}

/// Relays the answer whose head `response` holds, with the request id and the `retirement`
/// headers added. `Err` when the answer broke before any of its body's data went to the
/// client: nothing of it was sent, and the failure is the gateway's to answer.
pub(super) async fn relay<D: Downstream>(
    upstream: &Upstream,
    d: &mut D,
    response: UpstreamResponse,
    snap: &Snapshot,
    ex: &mut Exchange<'_>,
    retirement: &RetirementHeaders<'_>,
) -> Result<(), UpstreamError> {
    let UpstreamResponse { mut conn, started } = response;
    let (to_client, mut body) = BodyMover::for_client(conn.head.framing, d.reads_chunked());
    ex.status = conn.head.status;
    {
        let up = &conn;
        let headers = relayed_headers(&up.head, &up.buf)
            .chain([(request_id::HEADER.as_bytes(), ex.request_id.as_bytes())])
            .chain(retirement.headers());
        d.start_response(up.head.status, up.head.reason(&up.buf), headers, to_client);
    }
    conn.buf.advance(conn.head.len);
    // The data counted as sent: a client gone mid-response got none of what was not.
    let mut sent = 0;
    let read_timeout = snap.upstream.read_timeout;
    let moved = loop {
        let done = match body.step(&mut conn.buf, d.out()) {
            Ok(done) => done,
            Err(ChunkError) => {
                break Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's answer has broken chunked framing",
                ))
            }
        };
        if done {
            break Ok(());
        }
        // The head waits for the first of the body's data: an answer that breaks before it
        // is still the gateway's to answer whole.
        if body.data() > 0 {
            if let Err(e) = d.send(false).await {
                tracing::debug!(request_id = %ex.request_id, error = %e, "client connection gone mid-response");
                ex.answer_lost(d.closed_by_gateway(), sent > 0);
                // A client still there (one too slow to read) must not take the part it got
                // for the whole answer.
                d.abort();
                return Ok(());
            }
            ex.bytes_out += (body.data() - sent) as usize;
            sent = body.data();
        }
        match read_more(&mut conn, read_timeout).await {
            Ok(true) => {}
            Ok(false) if conn.head.framing == Framing::UntilClose => {
                body.finish(d.out());
                break Ok(());
            }
            Ok(false) => {
                break Err(UpstreamError::new(
                    UpstreamErrorKind::Reset,
                    "the backend closed the connection before the end of its answer",
                ))
            }
            Err(failure) => break Err(failure),
        }
    };
    let ended = Instant::now();
    ex.upstream.duration = Some(ended - started);
    if let Err(failure) = moved {
        ex.upstream.errors.push(failure.kind);
        let kind = failure.kind.as_str();
        // It counts against the address as a failed exchange does, however much of it went
        // out: that is how the backend's bytes fell into reads, not how healthy it is.
        upstream.answer_broke(snap, conn.slot.address(), failure.kind);
        if sent == 0 {
            // Nothing of it went out: the gateway answers for it.
            tracing::warn!(request_id = %ex.request_id, kind, error = %failure, "upstream answer broke before its body; answering for it");
            return Err(failure);
        }
        // The head is out: the only honest signal left is to abort the client's connection
        // (HTTP/1.1) or stream (HTTP/2).
        ex.upstream.answer_broken = true;
        tracing::warn!(request_id = %ex.request_id, kind, error = %failure, "upstream broke mid-response; aborting the client connection");
        d.abort();
        return Ok(());
    }
    // The backend's part is over, and whole: its address's streak of failures ends, and its
    // connection goes back to the pool before the client has the last bytes, so the
    // client's next request can have it.
    conn.slot.address().succeeded();
    if conn.head.keep_alive {
        upstream.pool().put(conn, ended.into());
    }
    match d.send(true).await {
        Ok(()) => ex.bytes_out += (body.data() - sent) as usize,
        Err(e) => {
            tracing::debug!(request_id = %ex.request_id, error = %e, "client connection gone at the end of the response");
            ex.answer_lost(d.closed_by_gateway(), sent > 0);
            d.abort();
        }
    }
    Ok(())
}

/// Reads more of the answer: `Ok(false)` when the backend closed the connection.
async fn read_more(
    conn: &mut UpstreamConn,
    read_timeout: std::time::Duration,
) -> Result<bool, UpstreamError> {
    // The answer goes on past its head's buffer: read it a chunk at a time.
    reserve_for_read(&mut conn.buf, READ_CHUNK);
    match conn
        .timer
        .limit(read_timeout, conn.stream.read_buf(&mut conn.buf))
        .await
    {
        Ok(Ok(n)) => Ok(n > 0),
        Ok(Err(e)) => Err(UpstreamError::io("reading the response body", e)),
        Err(_) => Err(UpstreamError::new(
            UpstreamErrorKind::Timeout,
            "the rest of the response body not in time",
        )),
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

    /// Feeds `wire` in pieces of `piece` bytes, as a client that reads chunked framing
    /// (`reads_chunked`) or not would get it; returns what reached the client, the data
    /// counted, and whether the mover saw the end (a body until close ends with the backend's
    /// connection then).
    fn moved(
        framing: Framing,
        reads_chunked: bool,
        wire: &[u8],
        piece: usize,
    ) -> (Vec<u8>, u64, bool) {
        let (_, mut mover) = BodyMover::for_client(framing, reads_chunked);
        let (mut input, mut out) = (BytesMut::new(), BytesMut::new());
        for part in wire.chunks(piece) {
            input.extend_from_slice(part);
            if mover.step(&mut input, &mut out).unwrap() {
                return (out.to_vec(), mover.data(), true);
            }
        }
        if framing == Framing::UntilClose {
            mover.finish(&mut out);
        }
        (out.to_vec(), mover.data(), false)
    }

    #[test]
    fn a_client_gets_a_body_in_framing_it_reads() {
        use Framing::*;
        for (backend, reads_chunked, client, recode) in [
            (Length(5), true, Length(5), Recode::Pass),
            (Length(5), false, Length(5), Recode::Pass),
            (Chunked, true, Chunked, Recode::Pass),
            (Chunked, false, UntilClose, Recode::Decode),
            // Chunked for HTTP/1.1: a cut body shows as one, and the connection is kept.
            (UntilClose, true, Chunked, Recode::Encode),
            (UntilClose, false, UntilClose, Recode::Pass),
        ] {
            assert_eq!(
                client_framing(backend, reads_chunked),
                (client, recode),
                "{backend:?}, reads chunked: {reads_chunked}"
            );
        }
    }

    #[test]
    fn bodies_move_as_framed_decoded_or_chunked_whatever_the_pieces() {
        let chunked = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        for piece in [1, 4, chunked.len()] {
            assert_eq!(
                moved(Framing::Chunked, true, chunked, piece),
                (chunked.to_vec(), 5, true)
            );
            assert_eq!(
                moved(Framing::Chunked, false, chunked, piece),
                (b"abcde".to_vec(), 5, true)
            );
            assert_eq!(
                moved(Framing::Length(5), true, b"hello", piece.min(5)),
                (b"hello".to_vec(), 5, true)
            );
        }
        assert_eq!(
            moved(Framing::UntilClose, false, b"to the end", 3),
            (b"to the end".to_vec(), 10, false)
        );
        let (out, data, _) = moved(Framing::UntilClose, true, b"to the end", 4);
        assert_eq!(out, b"4\r\nto t\r\n4\r\nhe e\r\n2\r\nnd\r\n0\r\n\r\n");
        assert_eq!(data, 10, "the data, not its framing");
        let mut decoder = ChunkedDecoder::default();
        let mut decoded = Vec::new();
        assert_eq!(
            decoder.decode(&out, |d| decoded.extend_from_slice(d)),
            Ok((out.len(), true)),
            "the gateway's own chunks read back whole"
        );
        assert_eq!(decoded, b"to the end");
        // A body of no length that was empty: the last chunk alone.
        assert_eq!(
            moved(Framing::UntilClose, true, b"", 1),
            (LAST_CHUNK.to_vec(), 0, false)
        );
    }

    #[test]
    fn framing_alone_is_no_data() {
        // A chunk's size line, its data not yet come: nothing of the body to send yet.
        let (out, data, done) = moved(Framing::Chunked, true, b"1f4\r\n", 5);
        assert_eq!((out.len(), data, done), (5, 0, false));
    }

    #[test]
    fn bytes_after_a_body_of_known_length_stay_in_the_input() {
        let (_, mut mover) = BodyMover::for_client(Framing::Length(2), true);
        let (mut input, mut out) = (BytesMut::from(&b"okEXTRA"[..]), BytesMut::new());
        assert_eq!(mover.step(&mut input, &mut out), Ok(true));
        assert_eq!((&out[..], &input[..]), (&b"ok"[..], &b"EXTRA"[..]));
    }
}
