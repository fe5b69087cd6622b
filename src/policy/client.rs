//! Who is calling: the client's address from the connection's peer and, when that peer is a
//! trusted proxy (`listen.trusted_proxies`), from `X-Forwarded-For`; the scheme the backend is
//! told in `X-Forwarded-Proto`. Pure: addresses and header bytes in, an address out.
//!
//! The peer is the TCP peer, or the source a PROXY protocol header gave (`listen.proxy_protocol`,
//! read at accept in `app::proxy_protocol`). Only a trusted peer's `X-Forwarded-For` is read,
//! and only from the right: each proxy appends the address it saw, so the right-most address
//! that is not a trusted proxy is the first one no trusted party vouches for beyond: the
//! client. Anything left of it could have been written by the client itself.

use std::net::IpAddr;

use crate::config::IpNet;

pub const FORWARDED_FOR: &str = "x-forwarded-for";
pub const FORWARDED_PROTO: &str = "x-forwarded-proto";

/// Whether `ip` is one of the `trusted` proxies.
pub fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(ip))
}

/// The client's address: `peer` itself, unless `peer` is trusted; then the right-most address
/// of the `X-Forwarded-For` headers (`forwarded_for`, in the order they came) that is not
/// trusted. A list that is all trusted proxies gives its left-most; an entry that is not an
/// address stops the walk at the last trusted one (nothing left of a broken entry is believed).
/// An empty header (`X-Forwarded-For:`) is no entry: the backend gets none for it
/// (`proxy::forwarding`), so it must not stop the walk here either.
pub fn client_address<'h>(
    peer: IpAddr,
    forwarded_for: impl Iterator<Item = &'h [u8]>,
    trusted: &[IpNet],
) -> IpAddr {
    let mut client = peer;
    if !is_trusted(peer, trusted) {
        return client;
    }
    // Read only from a trusted peer: collected then, to be walked from the right.
    let headers: Vec<&[u8]> = forwarded_for.collect();
    for header in headers.into_iter().rev() {
        if header.trim_ascii().is_empty() {
            continue;
        }
        for entry in header.rsplit(|&b| b == b',') {
            let Some(ip) = std::str::from_utf8(entry.trim_ascii())
                .ok()
                .and_then(|s| s.parse::<IpAddr>().ok())
            else {
                return client;
            };
            client = ip.to_canonical();
            if !is_trusted(client, trusted) {
                return client;
            }
        }
    }
    client
}

/// What `X-Forwarded-Proto` says to the backend: a trusted peer's `claimed` `http` or `https`
/// (the proxy in front terminated the client's TLS), else the gateway's own listener's scheme.
pub fn forwarded_proto(peer_trusted: bool, claimed: Option<&[u8]>, tls: bool) -> &'static str {
    match claimed.map(<[u8]>::trim_ascii) {
        Some(b"https") if peer_trusted => "https",
        Some(b"http") if peer_trusted => "http",
        _ if tls => "https",
        _ => "http",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| IpNet::parse(n).unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn client(peer: &str, headers: &[&str], trusted: &[&str]) -> IpAddr {
        let headers: Vec<&[u8]> = headers.iter().map(|h| h.as_bytes()).collect();
        client_address(ip(peer), headers.into_iter(), &nets(trusted))
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        assert_eq!(
            client("203.0.113.9", &["198.51.100.1"], &[]),
            ip("203.0.113.9")
        );
        let trusted = ["10.0.0.0/8"];
        assert_eq!(
            client("203.0.113.9", &["198.51.100.1"], &trusted),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_right_most_untrusted_address_is_the_client() {
        let trusted = ["10.0.0.0/8", "192.0.2.7"];
        // The client put a forged address first; the balancer appended the real one.
        let forged = "6.6.6.6, 198.51.100.1, 10.1.1.1";
        assert_eq!(client("10.0.0.2", &[forged], &trusted), ip("198.51.100.1"));
        // Split over two headers, read as one list.
        let split = ["6.6.6.6", "198.51.100.1 , 192.0.2.7"];
        assert_eq!(client("10.0.0.2", &split, &trusted), ip("198.51.100.1"));
        // No header: the proxy itself.
        assert_eq!(client("10.0.0.2", &[], &trusted), ip("10.0.0.2"));
        // All trusted: the left-most.
        assert_eq!(
            client("10.0.0.2", &["10.9.9.9, 10.1.1.1"], &trusted),
            ip("10.9.9.9")
        );
        // An empty header, wherever it is, is no entry.
        let empty_last = ["198.51.100.1", "", " "];
        assert_eq!(
            client("10.0.0.2", &empty_last, &trusted),
            ip("198.51.100.1")
        );
        // A broken entry stops the walk at the last trusted address.
        let broken = "198.51.100.1, unknown, 10.1.1.1";
        assert_eq!(client("10.0.0.2", &[broken], &trusted), ip("10.1.1.1"));
        assert_eq!(
            client("10.0.0.2", &["2001:db8::5"], &trusted),
            ip("2001:db8::5")
        );
    }

    #[test]
    fn only_a_trusted_peer_says_the_scheme() {
        assert_eq!(forwarded_proto(true, Some(b"https"), false), "https");
        assert_eq!(forwarded_proto(false, Some(b"https"), false), "http");
        assert_eq!(forwarded_proto(true, Some(b"gopher"), true), "https");
        assert_eq!(forwarded_proto(false, None, true), "https");
        assert_eq!(forwarded_proto(true, None, false), "http");
    }
}
