//! Chunked transfer coding (RFC 9112 §7.1): an incremental, strict decoder.

/// Why a chunked body cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked encoding")]
pub struct ChunkError;

/// An incremental decoder of `Transfer-Encoding: chunked` (RFC 9112 §7.1). Fed whatever bytes
/// have arrived, it hands out the data and says where the body ends; chunk extensions and
/// trailers are read and dropped.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// Data bytes left in the current chunk, or the size being read.
    size: u64,
    digits: u32,
    /// Bytes of the current extension or trailer line, bounded.
    line: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    /// Spaces after the size, before `;` or the line end.
    SizeSpace,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// Longest chunk extension or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// The state after a chunk size and its spaces: an extension or the line end.
fn after_size(b: u8) -> Result<ChunkState, ChunkError> {
    match b {
        b';' => Ok(ChunkState::Extension),
        b'\r' => Ok(ChunkState::SizeLf),
        _ => Err(ChunkError),
    }
}

/// A byte allowed inside a chunk extension or a trailer line: never a control byte (a bare
/// LF in particular, which another parser could take for a line end).
fn is_line_byte(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
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
    /// One byte of a chunk extension or trailer line, which ends at CR (then `at_cr`).
    fn line_byte(&mut self, b: u8, at_cr: ChunkState) -> Result<ChunkState, ChunkError> {
        self.line += 1;
        if b == b'\r' {
            Ok(at_cr)
        } else if is_line_byte(b) && self.line <= MAX_CHUNK_LINE {
            Ok(self.state)
        } else {
            Err(ChunkError)
        }
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
                    Some(d) if self.digits < 15 => {
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    None if self.digits > 0 && matches!(b, b' ' | b'\t') => self.state = SizeSpace,
                    None if self.digits > 0 => self.state = after_size(b)?,
                    _ => return Err(ChunkError),
                },
                SizeSpace => {
                    if !matches!(b, b' ' | b'\t') {
                        self.state = after_size(b)?;
                    }
                }
                Extension => self.state = self.line_byte(b, SizeLf)?,
                SizeLf => {
                    expect(b, b'\n')?;
                    self.digits = 0;
                    self.line = 0;
                    self.state = if self.size == 0 { TrailerStart } else { Data };
                }
                DataCr => self.state = expect(b, b'\r').map(|()| DataLf)?,
                DataLf => self.state = expect(b, b'\n').map(|()| Size)?,
                TrailerStart => {
                    self.line = 0;
                    self.state = match b {
                        b'\r' => EndLf,
                        // A trailer field starts with its name.
                        b if b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b) => {
                            Trailer
                        }
                        _ => return Err(ChunkError),
                    };
                }
                Trailer => self.state = self.line_byte(b, TrailerLf)?,
                TrailerLf => self.state = expect(b, b'\n').map(|()| TrailerStart)?,
                EndLf => self.state = expect(b, b'\n').map(|()| Done)?,
                Done => unreachable!("the loop stops at Done"),
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
        ] {
            assert_eq!(
                decode_all(bad),
                Err(ChunkError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
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
                encoded.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                encoded.extend_from_slice(c);
                encoded.extend_from_slice(b"\r\n");
            }
            encoded.extend_from_slice(b"0\r\n\r\nrest");
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
