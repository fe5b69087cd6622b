//! The PROXY protocol (`listen.proxy_protocol`): with it on, every connection to the proxy
//! listener opens with a v1 (text) or v2 (binary) header, as AWS NLB and HAProxy send it,
//! before TLS or HTTP. The header is read here, at accept, parsed by `ppp`, and its source
//! address becomes the connection's client address (the one every later layer is given); the
//! bytes after it are put back for TLS or HTTP to read. A connection whose header is missing,
//! malformed, too long or too slow is closed without an answer: there is no protocol yet to
//! answer in.
//!
//! A `LOCAL` header (a balancer's own connection, such as its health check) keeps the TCP peer.
//! A relayed connection whose source the header does not give (v1 `UNKNOWN`, a v2 `PROXY` of
//! an unspecified or Unix family) has no known client: not the peer, whose `X-Forwarded-For`
//! and `X-Forwarded-Proto` would then be believed, though they are the relayed client's. With
//! `listen.trusted_proxies` set, only those peers may send a header.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;

use crate::config::EdgeConfig;
use crate::policy::client::is_trusted;
use crate::proxy::tcp::TcpConn;

/// The longest header taken: a v1 header is at most 107 bytes; a v2 header's TLVs (AWS' VPC
/// endpoint id, TLS details) stay far below this.
pub const MAX_HEADER_BYTES: usize = 4096;

/// The longest v1 header, its CRLF included (the spec's 107 bytes).
const V1_MAX_BYTES: usize = 107;

/// Why a connection was closed at its PROXY protocol header.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("the connection does not open with a valid PROXY protocol header: {0}")]
    Malformed(String),
    #[error("the PROXY protocol header is longer than {MAX_HEADER_BYTES} bytes")]
    TooLong,
    #[error("the connection closed before its PROXY protocol header was complete")]
    Closed,
    #[error("the PROXY protocol header did not arrive within limits.client_header_timeout")]
    Timeout,
    #[error("a PROXY protocol header from a peer outside listen.trusted_proxies")]
    Untrusted,
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Whom a complete header says the connection is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A client the proxy relays, from this address.
    Relayed(SocketAddr),
    /// The proxy itself (`LOCAL`): its health check, say.
    Local,
    /// A client the proxy relays, from an address it does not give.
    Unknown,
}

/// What a complete header says, and its length; `Ok(None)` while `bytes` could still become
/// a header.
pub fn parse(bytes: &[u8]) -> Result<Option<(usize, Source)>, HeaderError> {
    if v1_line_pending(bytes) {
        return Ok(None);
    }
    let header = HeaderResult::parse(bytes);
    if header.is_incomplete() {
        return Ok(None);
    }
    let malformed = |e: &dyn std::fmt::Display| HeaderError::Malformed(e.to_string());
    match header {
        HeaderResult::V1(Ok(h)) => {
            let source = match h.addresses {
                v1::Addresses::Tcp4(a) => {
                    Source::Relayed(SocketAddr::from((a.source_address, a.source_port)))
                }
                v1::Addresses::Tcp6(a) => {
                    Source::Relayed(SocketAddr::from((a.source_address, a.source_port)))
                }
                v1::Addresses::Unknown => Source::Unknown,
            };
            Ok(Some((h.header.len(), source)))
        }
        HeaderResult::V2(Ok(h)) => {
            let source = match (h.command, h.addresses) {
                (v2::Command::Local, _) => Source::Local,
                (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                    Source::Relayed(SocketAddr::from((a.source_address, a.source_port)))
                }
                (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                    Source::Relayed(SocketAddr::from((a.source_address, a.source_port)))
                }
                (v2::Command::Proxy, _) => Source::Unknown,
            };
            Ok(Some((h.len(), source)))
        }
        HeaderResult::V1(Err(e)) => Err(malformed(&e)),
        HeaderResult::V2(Err(e)) => Err(malformed(&e)),
    }
}

/// Whether `bytes` begin a v1 header whose line has not ended yet. `ppp` is given a v1 header
/// only whole: it takes some lines cut short for broken ones (one cut just after the space
/// before the destination port reads as an empty port), and TCP may cut a balancer's header
/// anywhere.
fn v1_line_pending(bytes: &[u8]) -> bool {
    const PREFIX: &[u8] = b"PROXY ";
    let begins = if bytes.len() < PREFIX.len() {
        PREFIX.starts_with(bytes)
    } else {
        bytes.starts_with(PREFIX)
    };
    begins && bytes.len() < V1_MAX_BYTES && memchr::memchr(b'\n', bytes).is_none()
}

/// Reads the header `stream` from `peer` opens with, within `timeout`: the client's address
/// (its source, or `peer` for the proxy's own connection; `None` when the header does not say).
/// The bytes read past it are put back.
pub async fn accept(
    stream: &mut TcpConn,
    peer: SocketAddr,
    edge: &EdgeConfig,
    timeout: Duration,
) -> Result<Option<IpAddr>, HeaderError> {
    if !edge.trusted_proxies.is_empty() && !is_trusted(peer.ip(), &edge.trusted_proxies) {
        return Err(HeaderError::Untrusted);
    }
    let (length, source, buf) = tokio::time::timeout(timeout, read_header(stream))
        .await
        .map_err(|_| HeaderError::Timeout)??;
    stream.rewind(&buf[length..]);
    Ok(match source {
        Source::Relayed(source) => Some(source.ip()),
        Source::Local => Some(peer.ip()),
        Source::Unknown => None,
    })
}

/// Reads until `buf` holds a whole header: its length, its source, and every byte read.
async fn read_header(stream: &mut TcpConn) -> Result<(usize, Source, Vec<u8>), HeaderError> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(HeaderError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((length, source)) = parse(&buf)? {
            return Ok((length, source, buf));
        }
        if buf.len() >= MAX_HEADER_BYTES {
            return Err(HeaderError::TooLong);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_give_the_source_and_their_length() {
        let v1 = b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 8080\r\nGET / HTTP/1.1\r\n";
        let (len, source) = parse(v1).unwrap().unwrap();
        assert_eq!(
            &v1[..len],
            b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 8080\r\n"
        );
        assert_eq!(
            source,
            Source::Relayed("203.0.113.9:51000".parse().unwrap())
        );
        let unknown = b"PROXY UNKNOWN\r\n";
        assert_eq!(
            parse(unknown).unwrap(),
            Some((unknown.len(), Source::Unknown))
        );

        let addresses: v2::Addresses = (
            "[2001:db8::7]:443".parse::<SocketAddr>().unwrap(),
            "[2001:db8::1]:8080".parse::<SocketAddr>().unwrap(),
        )
            .into();
        let header = v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Proxy,
            v2::Protocol::Stream,
            addresses,
        )
        .build()
        .unwrap();
        let (len, source) = parse(&header).unwrap().unwrap();
        assert_eq!(len, header.len());
        assert_eq!(
            source,
            Source::Relayed("[2001:db8::7]:443".parse().unwrap())
        );
    }

    #[test]
    fn the_proxy_s_own_connection_is_local_and_a_relayed_one_without_a_source_unknown() {
        let v2 = |command, addresses| {
            let header = v2::Builder::with_addresses(
                v2::Version::Two | command,
                v2::Protocol::Unspecified,
                addresses,
            )
            .build()
            .unwrap();
            parse(&header).unwrap().unwrap().1
        };
        assert_eq!(
            v2(v2::Command::Local, v2::Addresses::Unspecified),
            Source::Local
        );
        assert_eq!(
            v2(v2::Command::Proxy, v2::Addresses::Unspecified),
            Source::Unknown
        );
    }

    /// Every piece a header may arrive in, short of the whole, waits for more; the whole is
    /// the header.
    #[test]
    fn a_header_cut_anywhere_waits_for_the_rest() {
        let addresses: v2::Addresses = (
            "[2001:db8::7]:443".parse::<SocketAddr>().unwrap(),
            "[2001:db8::1]:8080".parse::<SocketAddr>().unwrap(),
        )
            .into();
        let v2 = v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Proxy,
            v2::Protocol::Stream,
            addresses,
        )
        .write_tlv(v2::Type::Authority, b"gw.example")
        .unwrap()
        .build()
        .unwrap();
        for header in [
            &b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 8080\r\n"[..],
            b"PROXY TCP6 2001:db8::7 2001:db8::1 443 8080\r\n",
            b"PROXY UNKNOWN 203.0.113.9 10.0.0.1 51000 8080\r\n",
            &v2,
        ] {
            let shown = String::from_utf8_lossy(header);
            for cut in 1..header.len() {
                let piece = &header[..cut];
                let parsed = parse(piece);
                assert!(
                    matches!(parsed, Ok(None)),
                    "{shown:?} cut at {cut}: {parsed:?}"
                );
            }
            let mut whole = header.to_vec();
            whole.extend(b"GET / HTTP/1.1\r\n");
            assert_eq!(parse(&whole).unwrap().unwrap().0, header.len(), "{shown:?}");
        }
    }

    #[test]
    fn a_partial_header_waits_and_a_broken_one_is_refused() {
        assert!(parse(b"PROXY TCP4 203.0.113.9").unwrap().is_none());
        // Up to the spec's longest line, one with no end yet is waited for.
        let longest_unended = [&b"PROXY "[..], &[b'1'; V1_MAX_BYTES - 7]].concat();
        assert!(parse(&longest_unended).unwrap().is_none());
        assert!(parse(b"\r\n\r\n\0\r\nQUIT\n").unwrap().is_none());
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n"[..],
            b"PROXY TCP4 999.0.113.9 10.0.0.1 51000 8080\r\n",
            b"PROXY TCP9 203.0.113.9 10.0.0.1 51000 8080\r\n",
            b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 \r\n",
            // A v1 line with no end past the spec's longest is refused, not waited for.
            &[&b"PROXY "[..], &[b'1'; V1_MAX_BYTES - 6]].concat()[..],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
