//! Decisions about the backend's addresses, as plain functions and structs over plain data
//! and a clock passed in: which addresses a request tries and in what order (here), when a
//! name is looked up again ([`dns`]), whether a request connects, waits or is refused at an
//! address's connection budget ([`budget`]), and when failures eject an address
//! ([`outlier`]). `crate::proxy` carries them out; these need no socket to test or bench.

pub mod budget;
pub mod dns;
pub mod outlier;

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::config::{Host, Target};
use dns::NameRecord;

/// The addresses of the rotation, each with the index of the target it comes from: the
/// targets in the order written, a name's every address (in its record's order) at the
/// target's port, a name not answered yet none. An address reached twice is listed once, at
/// its first place.
pub fn rotation(
    targets: &[Target],
    names: &HashMap<String, NameRecord>,
) -> Vec<(usize, SocketAddr)> {
    let mut set: Vec<(usize, SocketAddr)> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let ips = match &t.host {
            Host::Ip(ip) => std::slice::from_ref(ip),
            Host::Name(name) => names.get(name).map_or(&[][..], |r| &r.addresses[..]),
        };
        for ip in ips {
            let addr = SocketAddr::new(*ip, t.port);
            if !set.iter().any(|(_, a)| *a == addr) {
                set.push((i, addr));
            }
        }
    }
    set
}

/// The order in which a request tries `count` addresses: round from `first`, only those
/// `in_rotation` says are; every one of them when none is (an address that failed its check
/// may still answer, and a refusal by the gateway certainly will not).
pub fn order(
    first: usize,
    count: usize,
    in_rotation: impl Fn(usize) -> bool,
) -> impl Iterator<Item = usize> {
    let any = (0..count).any(&in_rotation);
    (0..count)
        .map(move |i| (first + i) % count)
        .filter(move |&i| !any || in_rotation(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::Target;
    use tokio::time::Instant;

    fn target(host: Host, port: u16) -> Target {
        Target {
            host,
            port,
            sni: String::new(),
        }
    }

    #[test]
    fn the_rotation_has_every_address_of_every_name_once() {
        let ip = |s: &str| s.parse().unwrap();
        let targets = [
            target(Host::Ip(ip("10.0.0.9")), 80),
            target(Host::Name("a.example".into()), 8080),
            target(Host::Name("unknown.example".into()), 80),
            target(Host::Ip(ip("10.0.0.1")), 8080),
        ];
        let mut record = NameRecord::unknown(Instant::now());
        record.addresses = vec![ip("10.0.0.1"), ip("10.0.0.2")];
        let names = HashMap::from([("a.example".to_owned(), record)]);
        let addrs: Vec<(usize, String)> = rotation(&targets, &names)
            .into_iter()
            .map(|(i, a)| (i, a.to_string()))
            .collect();
        assert_eq!(
            addrs,
            [
                (0, "10.0.0.9:80".to_owned()),
                (1, "10.0.0.1:8080".to_owned()),
                (1, "10.0.0.2:8080".to_owned()),
            ]
        );
    }

    #[test]
    fn the_rotation_skips_addresses_out_of_it_unless_all_are() {
        let up = [true, false, true];
        assert_eq!(order(1, 3, |i| up[i]).collect::<Vec<_>>(), [2, 0]);
        assert_eq!(order(4, 3, |_| false).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(order(0, 0, |_| true).count(), 0);
    }
}
