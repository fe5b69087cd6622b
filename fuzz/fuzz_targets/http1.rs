//! Fuzzes the HTTP/1.1 framing that reads raw client and backend bytes (`agent_gateway::http1`):
//! request and response heads with every accessor, and the chunked decoder, whose output
//! must not depend on how the input is split across reads.
//!
//! Run from the repository root with a nightly toolchain:
//! `cargo +nightly fuzz run http1 fuzz/corpus/http1 fuzz/seeds/http1 -- -max_total_time=300`.
#![no_main]

use agent_gateway::http1::{ChunkedDecoder, RequestHead, ResponseHead};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut head = RequestHead::default();
    if let Ok(true) = head.parse(data) {
        assert!(head.len <= data.len());
        let req = head.view(data);
        let _ = (req.method(), req.path(), req.query(), req.authority(), req.target());
        let _ = (req.framing(), req.wants_keep_alive(), req.headers_named("host").next());
        assert!(req.headers().count() == req.header_count());
    }
    let mut response = ResponseHead::default();
    if let Ok(true) = response.parse(data) {
        assert!(response.len <= data.len());
        assert!((100..=599).contains(&response.status));
        // A connection is only kept for a body whose end is known.
        if response.keep_alive {
            assert_ne!(response.framing, agent_gateway::http1::Framing::UntilClose);
        }
        let _ = (response.reason(data), response.headers(data).count());
    }

    // The first byte picks the piece size; the rest is the chunked input.
    let Some((&piece, input)) = data.split_first() else { return };
    let piece = usize::from(piece).max(1);
    let mut whole = Vec::new();
    let at_once = ChunkedDecoder::default().decode(input, |d| whole.extend_from_slice(d));
    let mut decoder = ChunkedDecoder::default();
    let mut pieces = Vec::new();
    let mut used = 0;
    let mut outcome = Ok((0, false));
    while used < input.len() {
        let end = (used + piece).min(input.len());
        match decoder.decode(&input[used..end], |d| pieces.extend_from_slice(d)) {
            Ok((n, done)) => {
                used += n;
                outcome = Ok((used, done));
                if done {
                    break;
                }
                assert_eq!(used, end, "an unfinished body consumes all its input");
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    match (at_once, outcome) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            assert_eq!(whole, pieces);
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("split-dependent result: {a:?} vs {b:?}"),
    }
});
