//! `X-Request-Id`: keep a sane client value, otherwise mint a unique one.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::request::RequestView;
use crate::http1::put_hex;

pub const HEADER: &str = "x-request-id";

/// Whether a client-sent id can be passed on: 1 to 128 of `A-Z a-z 0-9 - _ . : +`.
fn is_sane(value: &[u8]) -> bool {
    (1..=128).contains(&value.len())
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'+'))
}

/// The id a client sent, when it can be passed on as is.
pub fn client_value<R: RequestView>(req: &R) -> Option<String> {
    req.header(HEADER)
        .filter(|v| is_sane(v))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Mints ids `<process prefix>-<counter>`: unique within the process, unlikely to collide
/// across processes, and cheap (no syscall, no lock).
pub struct RequestIds {
    prefix: u64,
    counter: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        // RandomState is seeded from the OS; hashing the pid and time through it gives a
        // random per-process prefix without another dependency.
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        Self {
            prefix: h.finish(),
            counter: AtomicU64::new(0),
        }
    }
}

impl RequestIds {
    pub fn next_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // Hand-written hex into a buffer on the stack, then one allocation: no formatter.
        let mut id = [b'-'; 16 + 1 + 16];
        put_hex(&mut id[..16], self.prefix);
        let len = if n >> 32 == 0 { 16 + 1 + 8 } else { id.len() };
        put_hex(&mut id[17..len], n);
        // Hex digits and a dash: ASCII, so never the default.
        String::from_utf8(id[..len].to_vec()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sane_ids() {
        assert!(is_sane(b"abc-123_x.y:z+1"));
        for bad in [
            &b""[..],
            b"a b",
            b"a\r\nb",
            b"a\0",
            &[b'a'; 129][..],
            b"\xff",
        ] {
            assert!(!is_sane(bad), "{bad:?}");
        }
    }

    #[test]
    fn minted_ids_are_unique_and_sane() {
        let ids = RequestIds::default();
        let a = ids.next_id();
        let b = ids.next_id();
        assert_ne!(a, b);
        assert!(is_sane(a.as_bytes()));
        assert_eq!(a.len(), 25);
        assert!(
            a.ends_with("-00000000") && b.ends_with("-00000001"),
            "{a} {b}"
        );
    }
}
