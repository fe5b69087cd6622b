//! Chunked transfer coding (RFC 9112 §7.1): an incremental decoder that takes exactly the
//! grammar, so that no byte sequence reads as one body here and as another elsewhere.
//!
//! ```text
//! chunked-body = *chunk last-chunk trailer-section CRLF
//! chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
//! chunk-ext    = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )
//! ext-val      = token / quoted-string
//! trailer      = *( field-name ":" OWS field-value OWS CRLF )
//! ```
//! Whitespace is only where `BWS`/`OWS` stand (spaces and tabs), quoted strings must close,
//! trailer lines are field lines, and every line ends in CRLF. Extensions and trailers are
//! read and dropped.

use bytes::BufMut;

use super::put_hex;

/// The last chunk of a chunked body with no trailers: what ends it.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes `data` (not empty: an empty chunk is the [`LAST_CHUNK`]) as one chunk: its size in
/// hex, then the data, each line ended.
pub fn write_chunk(out: &mut impl BufMut, data: &[u8]) {
    debug_assert!(!data.is_empty(), "an empty chunk ends the body");
    let size = data.len() as u64;
    // As few digits as the size takes: no leading zeros for a strict reader to count.
    let width = (u64::BITS - size.leading_zeros()).div_ceil(4).max(1) as usize;
    let mut digits = [0u8; 16];
    put_hex(&mut digits[..width], size);
    out.put_slice(&digits[..width]);
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Why a chunked body cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked encoding")]
pub struct ChunkError;

/// An incremental decoder of `Transfer-Encoding: chunked`. Fed whatever bytes have arrived,
/// it hands out the data and says where the body ends.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// Data bytes left in the current chunk, or the size being read.
    size: u64,
    digits: u32,
    /// Bytes of the current size, extension or trailer line, bounded.
    line: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    /// Whitespace after the size: only `;` may follow.
    SizeBws,
    /// After `;`, whitespace, then an extension name.
    ExtNameStart,
    ExtName,
    /// Whitespace after a name: `=` or the next `;` may follow.
    ExtNameBws,
    /// After `=`, whitespace, then a token or a quoted string.
    ExtValueStart,
    ExtToken,
    ExtQuoted,
    ExtQuotedEscape,
    /// Right after a quoted string: `;`, whitespace or the line end may follow.
    ExtValueEnd,
    /// Whitespace after a value: only the next `;` may follow.
    ExtValueBws,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// A trailer line's first byte, or the CR of the empty line that ends the body.
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    EndLf,
    Done,
}

/// Longest chunk-size line (extensions included) or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// A `tchar` (RFC 9110 §5.6.2): a byte of a token.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte of a quoted string's text: `qdtext` without `"` and `\`.
fn is_qdtext(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff)
}

/// A byte a backslash may quote, or a field value may hold: HTAB, SP, visible, obs-text.
fn is_field_byte(b: u8) -> bool {
    matches!(b, b'\t' | b' '..=0x7e | 0x80..=0xff)
}

fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Whether `b` is the one byte the grammar allows here.
fn expect(b: u8, want: u8) -> Result<(), ChunkError> {
    if b == want {
        Ok(())
    } else {
        Err(ChunkError)
    }
}

impl ChunkedDecoder {
    /// The state after byte `b` of a size line or trailer line.
    fn next_line_state(&self, b: u8) -> Result<ChunkState, ChunkError> {
        use ChunkState::*;
        let next = match (self.state, b) {
            (Size, _) => unreachable!("sizes are read apart"),
            (SizeBws | ExtNameBws | ExtValueEnd | ExtValueBws, b';') => ExtNameStart,
            (SizeBws, b) if is_ws(b) => SizeBws,
            (ExtNameStart, b) if is_ws(b) => ExtNameStart,
            (ExtNameStart, b) if is_tchar(b) => ExtName,
            (ExtName, b) if is_tchar(b) => ExtName,
            (ExtName, b';') | (ExtToken, b';') => ExtNameStart,
            (ExtName, b'=') | (ExtNameBws, b'=') => ExtValueStart,
            (ExtName, b) | (ExtNameBws, b) if is_ws(b) => ExtNameBws,
            (ExtValueStart, b) if is_ws(b) => ExtValueStart,
            (ExtValueStart, b'"') => ExtQuoted,
            (ExtValueStart, b) if is_tchar(b) => ExtToken,
            (ExtToken, b) if is_tchar(b) => ExtToken,
            (ExtToken | ExtValueEnd | ExtValueBws, b) if is_ws(b) => ExtValueBws,
            (ExtQuoted, b'"') => ExtValueEnd,
            (ExtQuoted, b'\\') => ExtQuotedEscape,
            (ExtQuoted, b) if is_qdtext(b) => ExtQuoted,
            (ExtQuotedEscape, b) if is_field_byte(b) => ExtQuoted,
            (ExtName | ExtToken | ExtValueEnd, b'\r') => SizeLf,
            (TrailerName, b) if is_tchar(b) => TrailerName,
            (TrailerName, b':') => TrailerValue,
            (TrailerValue, b'\r') => TrailerLf,
            (TrailerValue, b) if is_field_byte(b) => TrailerValue,
            _ => return Err(ChunkError),
        };
        Ok(next)
    }

    /// Decodes from `input`, passing each run of data to `on_data`. Returns how many bytes of
    /// `input` were consumed and whether the body is complete (input after the end is left).
    pub fn decode(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<(usize, bool), ChunkError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() && self.state != Done {
            let b = input[i];
            match self.state {
                Data => {
                    let n = (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    on_data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                Size => match (b as char).to_digit(16) {
                    // Leading zeros are digits like any; past them at most 15 (a size under
                    // 2^60), and zeros alone no longer than a line.
                    Some(d) if self.size >> 56 == 0 && (self.digits as usize) < MAX_CHUNK_LINE => {
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    None if self.digits > 0 => {
                        self.state = match b {
                            b'\r' => SizeLf,
                            b';' => ExtNameStart,
                            b if is_ws(b) => SizeBws,
                            _ => return Err(ChunkError),
                        };
                    }
                    _ => return Err(ChunkError),
                },
                SizeLf => {
                    expect(b, b'\n')?;
                    self.digits = 0;
                    self.line = 0;
                    self.state = if self.size == 0 { TrailerStart } else { Data };
                }
                DataCr => self.state = expect(b, b'\r').map(|()| DataLf)?,
                DataLf => {
                    expect(b, b'\n')?;
                    self.line = 0;
                    self.state = Size;
                }
                TrailerStart => {
                    self.line = 0;
                    self.state = match b {
                        b'\r' => EndLf,
                        b if is_tchar(b) => TrailerName,
                        _ => return Err(ChunkError),
                    };
                }
                TrailerLf => self.state = expect(b, b'\n').map(|()| TrailerStart)?,
                EndLf => self.state = expect(b, b'\n').map(|()| Done)?,
                Done => unreachable!("the loop stops at Done"),
                _ => {
                    self.line += 1;
                    if self.line > MAX_CHUNK_LINE {
                        return Err(ChunkError);
                    }
                    self.state = self.next_line_state(b)?;
                }
            }
            i += 1;
        }
        Ok((i, self.state == Done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut out = Vec::new();
        let (n, done) = ChunkedDecoder::default().decode(input, |d| out.extend_from_slice(d))?;
        Ok((out, n, done))
    }

    #[test]
    fn extensions_and_trailers_take_the_whole_grammar() {
        for good in [
            &b"5;a\r\nhello\r\n0\r\n\r\n"[..],
            b"5 ;a=b\r\nhello\r\n0\r\n\r\n",
            b"5\t;\ta\t=\tb\t;c\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"q \\\" ;x\"\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"\" ; b\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0;last=1\r\nX-Sum: abc\r\nEmpty:\r\nT:\tv \r\n\r\n",
        ] {
            let (data, used, done) = decode_all(good)
                .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(good)));
            assert_eq!((data, used, done), (b"hello".to_vec(), good.len(), true));
        }
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let body = b"5;ext=1\r\nhello\r\n6 ;a=\"b c\"\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        assert_eq!(
            decode_all(body),
            Ok((b"hello world".to_vec(), body.len() - 4, true))
        );
        assert_eq!(decode_all(b"0\r\n\r\n"), Ok((vec![], 5, true)));
        assert_eq!(
            decode_all(b"A\r\n0123456789\r\n"),
            Ok((b"0123456789".to_vec(), 15, false))
        );
        // Leading zeros count for nothing: 15 digits after them are still a size.
        let zeros = b"0000000000000000005\r\nhello\r\n00000000000000000000\r\n\r\n";
        assert_eq!(
            decode_all(zeros),
            Ok((b"hello".to_vec(), zeros.len(), true))
        );
        let widest = b"000000000000000000000fffffffffffffff\r\n";
        assert_eq!(decode_all(widest), Ok((vec![], widest.len(), false)));
        assert_eq!(
            decode_all(b"0001000000000000000\r\n"),
            Err(ChunkError),
            "16 digits"
        );
        // Zeros alone are bounded like any line.
        let endless = [b'0'; MAX_CHUNK_LINE + 1];
        assert_eq!(decode_all(&endless), Err(ChunkError));
        for bad in [
            &b"x\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"\r\n",
            b"5\nhello",
            b"fffffffffffffffff\r\n",
            // A bare LF ending the body or a trailer: another parser could end it elsewhere.
            b"0\r\n\nGET /x HTTP/1.1\r\n\r\n",
            b"0\r\nX: a\n\r\n",
            b"5 garbage\r\n",
            b"5;a\x01\r\n",
            b"0\r\n: no name\r\n\r\n",
            // Whitespace only where the grammar has BWS, and never before the line end.
            b"17 \r\n",
            b"17\t\r\n",
            b"17;\r\n",
            b"17;a =\r\n",
            b"17;a=b \r\n",
            b"17; =b\r\n",
            b"17;a=b c\r\n",
            // A quoted string must close, and escape only what a field may hold.
            b"17;a=\"abc\r\n",
            b"17;a=\"a\\\x01\"\r\n",
            // Trailers are field lines: a name, a colon with nothing before it, a value.
            b"0\r\nX : y\r\n\r\n",
            b"0\r\nXYZ\r\n\r\n",
            b"0\r\n X: y\r\n\r\n",
            b"0\r\nX: \x7f\r\n\r\n",
        ] {
            assert_eq!(
                decode_all(bad),
                Err(ChunkError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_chunk_size_is_written_in_as_few_hex_digits_as_it_takes() {
        for (len, size_line) in [(1, "1"), (15, "f"), (16, "10"), (255, "ff"), (4096, "1000")] {
            let mut out = Vec::new();
            write_chunk(&mut out, &vec![b'x'; len]);
            assert!(
                out.starts_with(format!("{size_line}\r\n").as_bytes()),
                "{len}"
            );
            assert_eq!(out.len(), size_line.len() + 2 + len + 2);
        }
    }

    proptest! {
        /// Any body, chunked any way and fed in any pieces, decodes to itself and ends where
        /// the encoding ends.
        #[test]
        fn chunked_decoding_is_split_invariant(
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            chunk in 1usize..300,
            piece in 1usize..64,
        ) {
            let mut encoded = Vec::new();
            for c in body.chunks(chunk) {
                write_chunk(&mut encoded, c);
            }
            encoded.extend_from_slice(LAST_CHUNK);
            encoded.extend_from_slice(b"rest");
            let mut decoder = ChunkedDecoder::default();
            let mut out = Vec::new();
            let mut at = 0;
            let mut done = false;
            while !done {
                let end = (at + piece).min(encoded.len());
                let (n, d) = decoder.decode(&encoded[at..end], |x| out.extend_from_slice(x)).unwrap();
                at += n;
                done = d;
                prop_assert!(at < encoded.len());
            }
            prop_assert_eq!(out, body);
            prop_assert_eq!(&encoded[at..], b"rest");
        }
    }
}
