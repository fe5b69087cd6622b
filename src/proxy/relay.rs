//! Relaying the backend's answer to the client: a pure filter decides which of its headers
//! pass ([`relayed_headers`]) and how its body is framed for the client ([`client_framing`]),
//! then the body moves as it arrives from the backend's buffer into the client's, decoded or
//! chunked on the way when the client needs it so ([`BodyMover`]). The backend's connection
//! goes back to the pool as soon as its part is over.
//!
//! An answer that breaks before any of its body has gone to the client is answered by the
//! gateway instead (502, 504), as a failed exchange is; after, the client's connection is
//! aborted, and the framing the client got shows the answer cut short.

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;

use super::downstream::Downstream;
use super::pool::{UpstreamConn, UpstreamPool};
use super::upstream::UpstreamResponse;
use crate::api::failure::{UpstreamError, UpstreamErrorKind};
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
/// arrives, recoded as [`client_framing`] decided.
pub struct BodyMover {
    framing: Framing,
    recode: Recode,
    decoder: ChunkedDecoder,
    /// Bytes still to come of a body of known length.
    left: u64,
}

impl BodyMover {
    /// A mover of a body the backend framed `framing`.
    pub fn new(framing: Framing, recode: Recode) -> Self {
        BodyMover {
            framing,
            recode,
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
                let (used, done) = if self.recode == Recode::Decode {
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
                if self.recode == Recode::Encode && !input.is_empty() {
                    chunk(out, input);
                } else {
                    out.extend_from_slice(input);
                }
                input.clear();
                Ok(false)
            }
        }
    }

    /// Ends a body that ended with the backend's connection: its last chunk, when it was
    /// chunked on the way.
    pub fn finish(&self, out: &mut BytesMut) {
        if self.recode == Recode::Encode {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }
}

/// Writes `data` as one chunk: its size in hex, then the data, each line ended.
fn chunk(out: &mut BytesMut, data: &[u8]) {
    use std::fmt::Write;
    // A usize's hex digits always fit: writing to a BytesMut does not fail.
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Relays the answer whose head `response` holds, with the request id and the `retirement`
/// headers added. `Err` when the answer broke before any of its body went to the client:
/// nothing of it was sent, and the failure is the gateway's to answer.
pub(super) async fn relay<D: Downstream>(
    pool: &UpstreamPool,
    d: &mut D,
    response: UpstreamResponse,
    snap: &Snapshot,
    ex: &mut Exchange<'_>,
    retirement: &RetirementHeaders<'_>,
) -> Result<(), UpstreamError> {
    let UpstreamResponse { mut conn, started } = response;
    let (to_client, recode) = client_framing(conn.head.framing, d.reads_chunked());
    ex.status = conn.head.status;
    {
        let up = &conn;
        let headers = relayed_headers(&up.head, &up.buf)
            .chain([(request_id::HEADER.as_bytes(), ex.request_id.as_bytes())])
            .chain(retirement.headers());
        d.start_response(up.head.status, up.head.reason(&up.buf), headers, to_client);
    }
    conn.buf.advance(conn.head.len);
    // Only body bytes count as sent; the head goes out with the first of them.
    let mut head_bytes = d.out().len();
    let mut sent = false;
    let mut body = BodyMover::new(conn.head.framing, recode);
    let read_timeout = snap.upstream.read_timeout;
    loop {
        let done = match body.step(&mut conn.buf, d.out()) {
            Ok(done) => done,
            Err(ChunkError) => {
                let broken = UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's answer has broken chunked framing",
                );
                return broke(d, ex, sent, broken);
            }
        };
        if done {
            break;
        }
        // The head waits for the first of the body: an answer that breaks before it is
        // still the gateway's to answer whole.
        if sent || d.out().len() > head_bytes {
            // Counted once sent: a client gone mid-response got none of them.
            let body_bytes = d.out().len() - head_bytes;
            head_bytes = 0;
            if let Err(e) = d.send(false).await {
                tracing::debug!(request_id = %ex.request_id, error = %e, "client went away mid-response");
                ex.client_aborted = true;
                return Ok(());
            }
            sent = true;
            ex.bytes_out += body_bytes;
        }
        match read_more(&mut conn, read_timeout).await {
            Ok(true) => {}
            Ok(false) if conn.head.framing == Framing::UntilClose => {
                body.finish(d.out());
                break;
            }
            Ok(false) => {
                let cut = UpstreamError::new(
                    UpstreamErrorKind::Reset,
                    "the backend closed the connection before the end of its answer",
                );
                return broke(d, ex, sent, cut);
            }
            Err(failure) => return broke(d, ex, sent, failure),
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
    Ok(())
}

/// The backend broke its answer off (`failure`). Before any of it was `sent`, the failure
/// is handed back for the gateway to answer; after, the only honest signal left is to abort
/// the client's connection. The backend's connection is dropped either way.
fn broke<D: Downstream>(
    d: &mut D,
    ex: &mut Exchange<'_>,
    sent: bool,
    failure: UpstreamError,
) -> Result<(), UpstreamError> {
    ex.upstream.errors.push(failure.kind);
    if !sent {
        tracing::warn!(request_id = %ex.request_id, kind = failure.kind.as_str(), error = %failure, "upstream answer broke before its body; answering for it");
        return Err(failure);
    }
    ex.upstream.answer_broken = true;
    tracing::warn!(request_id = %ex.request_id, kind = failure.kind.as_str(), error = %failure, "upstream broke mid-response; aborting the client connection");
    d.abort();
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
    /// (`reads_chunked`) or not would get it; returns what reached the client, and whether
    /// the mover saw the end (a body until close ends with the backend's connection then).
    fn moved(framing: Framing, reads_chunked: bool, wire: &[u8], piece: usize) -> (Vec<u8>, bool) {
        let mut mover = BodyMover::new(framing, client_framing(framing, reads_chunked).1);
        let (mut input, mut out) = (BytesMut::new(), BytesMut::new());
        for part in wire.chunks(piece) {
            input.extend_from_slice(part);
            if mover.step(&mut input, &mut out).unwrap() {
                return (out.to_vec(), true);
            }
        }
        if framing == Framing::UntilClose {
            mover.finish(&mut out);
        }
        (out.to_vec(), false)
    }

    #[test]
    fn a_client_gets_a_body_in_framing_it_reads() {
        for (backend, reads_chunked, client) in [
            (Framing::Length(5), true, Framing::Length(5)),
            (Framing::Length(5), false, Framing::Length(5)),
            (Framing::Chunked, true, Framing::Chunked),
            (Framing::Chunked, false, Framing::UntilClose),
            // Chunked for HTTP/1.1: a cut body shows as one, and the connection is kept.
            (Framing::UntilClose, true, Framing::Chunked),
            (Framing::UntilClose, false, Framing::UntilClose),
        ] {
            assert_eq!(
                client_framing(backend, reads_chunked).0,
                client,
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
                (chunked.to_vec(), true)
            );
            assert_eq!(
                moved(Framing::Chunked, false, chunked, piece),
                (b"abcde".to_vec(), true)
            );
            assert_eq!(
                moved(Framing::Length(5), true, b"hello", piece.min(5)),
                (b"hello".to_vec(), true)
            );
        }
        assert_eq!(
            moved(Framing::UntilClose, false, b"to the end", 3),
            (b"to the end".to_vec(), false)
        );
        let (out, _) = moved(Framing::UntilClose, true, b"to the end", 4);
        assert_eq!(out, b"4\r\nto t\r\n4\r\nhe e\r\n2\r\nnd\r\n0\r\n\r\n");
        let mut decoder = ChunkedDecoder::default();
        let mut data = Vec::new();
        assert_eq!(
            decoder.decode(&out, |d| data.extend_from_slice(d)),
            Ok((out.len(), true)),
            "the gateway's own chunks read back whole"
        );
        assert_eq!(data, b"to the end");
    }

    #[test]
    fn bytes_after_a_body_of_known_length_stay_in_the_input() {
        let mut mover = BodyMover::new(Framing::Length(2), Recode::Pass);
        let (mut input, mut out) = (BytesMut::from(&b"okEXTRA"[..]), BytesMut::new());
        assert_eq!(mover.step(&mut input, &mut out), Ok(true));
        assert_eq!((&out[..], &input[..]), (&b"ok"[..], &b"EXTRA"[..]));
    }
}
