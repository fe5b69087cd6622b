//! Why a request failed on the way, as typed errors made where it happens: reading the
//! client's head ([`UnreadableHead`]) or body ([`BodyError`]), or talking to the backend
//! ([`UpstreamError`]). Each keeps what caused it as its [`Error::source`], and [`Chain`]
//! prints an error with its causes, for logs and spans.
//!
//! The data plane makes them, but they are defined here, in the api layer, so that
//! [`super::reply`] turns each into the gateway's answer in one place, and the request's
//! record in `observe` keeps them, without either using a layer listed after its own.

use std::error::Error;
use std::fmt;
use std::io;

use crate::http1::{ChunkError, FramingError, HeadError};

/// Why a client's request head could not be read. Not named `HeadError`: that is the codec's
/// parse error ([`HeadError`], which the backend's response heads can have too), one cause
/// here beside the limits a head can break before it is whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnreadableHead {
    #[error("the request head does not parse")]
    Parse(#[from] HeadError),
    /// No line ended within the room for the largest head the limits admit.
    #[error("the request line is longer than the largest head the limits admit")]
    TargetTooLong,
    /// Lines ended, but the head did not, within that room.
    #[error("the request head is larger than the limits admit")]
    TooLarge,
}

/// Why a request body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Known to exceed `limits.max_body_bytes` (declared, or as it arrived): the excess is
    /// never buffered.
    #[error("the request body is larger than {max} bytes")]
    TooLarge { max: usize },
    /// The head's framing could be read two ways, so the body's end is not known.
    #[error("the request body's framing could be read two ways")]
    Ambiguous(#[source] FramingError),
    /// Where the body ends is not known: it would end with the connection (a framing only
    /// responses may have), or the connection has lost its place in the client's bytes.
    #[error("where the request body ends is not known")]
    Unframed,
    #[error("the request body's chunked framing is broken")]
    Chunked(#[source] ChunkError),
    /// The connection ended before the body's declared end.
    #[error("the connection ended before the request body did")]
    Truncated,
    #[error("the request body was not received within limits.client_body_timeout_ms")]
    Timeout,
    /// Reading from the client, or writing the `100 Continue` it waited for, failed.
    #[error("the client went away")]
    ClientGone(#[source] io::Error),
    /// The HTTP/2 stream failed before the body's end: reset, or DATA past its
    /// `content-length`.
    #[error("the HTTP/2 stream failed before the request body's end")]
    Stream(#[source] Box<dyn Error + Send + Sync>),
}

listed_enum! {
    /// How talking to the backend went wrong: the kinds that metrics and answers tell apart.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum UpstreamErrorKind {
        Connect => "connect",
        Timeout => "timeout",
        Reset => "reset",
        Other => "other",
    }
}

/// Talking to a backend failed: how (its kind), what failed, and the error underneath when
/// there is one (the connector's, or the socket's).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct UpstreamError {
    pub kind: UpstreamErrorKind,
    /// What the gateway was doing, or what the backend did wrong.
    what: &'static str,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl UpstreamError {
    pub fn new(kind: UpstreamErrorKind, what: &'static str) -> Self {
        UpstreamError {
            kind,
            what,
            source: None,
        }
    }

    /// Failed with `source` underneath.
    pub fn caused(
        kind: UpstreamErrorKind,
        what: &'static str,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        UpstreamError {
            kind,
            what,
            source: Some(source.into()),
        }
    }

    /// A socket error while `what`: the connection broke.
    pub fn io(what: &'static str, source: io::Error) -> Self {
        Self::caused(UpstreamErrorKind::Reset, what, source)
    }
}

listed_enum! {
    /// Why a request got no backend connection under `upstream.max_connections_per_address`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum OverflowReason {
        /// `upstream.max_pending` requests were waiting already.
        QueueFull => "queue_full",
        /// It waited `upstream.pending_timeout_ms`.
        Timeout => "timeout",
    }
}

/// Every connection the budget allows was busy, and the request could not wait (or waited
/// too long): nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no backend connection free within the connection budget ({})", .reason.as_str())]
pub struct UpstreamOverflow {
    pub reason: OverflowReason,
}

/// The error that made the gateway answer a request itself, as the request's record keeps it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Head(#[from] UnreadableHead),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(transparent)]
    Overflow(#[from] UpstreamOverflow),
}

/// An error and its sources, outermost first, joined by `": "`: how logs and spans print a
/// cause.
pub struct Chain<'e>(pub &'e (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_prints_each_cause_once_outermost_first() {
        let reset = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        let e = UpstreamError::io("reading the response head", reset);
        assert_eq!(
            Chain(&e).to_string(),
            "reading the response head: reset by peer"
        );
        let failure = Failure::from(BodyError::Chunked(ChunkError));
        assert_eq!(
            Chain(&failure).to_string(),
            "the request body's chunked framing is broken: invalid chunked encoding"
        );
        let head = Failure::from(UnreadableHead::from(HeadError::TooManyHeaders));
        assert_eq!(
            Chain(&head).to_string(),
            "the request head does not parse: more than 256 header lines"
        );
        assert_eq!(
            Chain(&UpstreamError::new(
                UpstreamErrorKind::Timeout,
                "no response head in time"
            ))
            .to_string(),
            "no response head in time"
        );
    }

    #[test]
    fn an_upstream_error_keeps_its_source() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "refused");
        let e = UpstreamError::caused(UpstreamErrorKind::Connect, "connecting", refused);
        let source = e.source().expect("a source");
        let io = source.downcast_ref::<io::Error>().expect("the io::Error");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
        assert!(UpstreamError::new(UpstreamErrorKind::Other, "101")
            .source()
            .is_none());
    }
}
