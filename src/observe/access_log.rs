//! The access log: one line per finished request, target `agent_gateway::access` at `info`.
//!
//! With JSON logs (the default) the line is formatted here, by hand, straight into the log's
//! [`LineSink`]: the fields, their order and their values are those the `tracing` JSON
//! formatter writes for the same event (a test holds the two equal), at a fraction of the
//! cost, with no allocation, and without the request waiting on the sink. With human-readable
//! logs, and in-process tests without a sink, the line is a `tracing` event ([`event`]).
//! Either way the usual filters apply (`--log-level`, `RUST_LOG`).

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http1::put_ip;
use crate::observe::exchange::{method_name, operation_name, version_name, Exchange};
use crate::observe::log_sink::LineSink;

/// The `tracing` target of access-log lines: what filters name to turn them on or off.
pub const TARGET: &str = "agent_gateway::access";

/// Writes each finished request's line where the logs go.
pub struct AccessLog {
    /// Where JSON lines go directly; `None`: through `tracing`.
    sink: Option<Arc<LineSink>>,
}

impl AccessLog {
    /// Lines formatted here into `sink` (JSON logs), or `tracing` events (`None`).
    pub fn new(sink: Option<Arc<LineSink>>) -> Self {
        AccessLog { sink }
    }

    /// Logs `ex`, which took `elapsed`, if the filters let access lines through.
    pub fn write(&self, ex: &Exchange, elapsed: Duration) {
        if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
            return;
        }
        let Some(sink) = &self.sink else {
            return event(ex, elapsed);
        };
        thread_local! {
            static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            // The request's end, on its own clocks: no third clock read for the line.
            json_line(line, ex, elapsed, ex.started_at + elapsed);
            sink.push(line, false);
        });
    }
}

/// The client's path without its query: queries may carry data that must not be logged.
fn without_query(path: &str) -> &str {
    memchr::memchr(b'?', path.as_bytes()).map_or(path, |end| &path[..end])
}

/// A field's key as the text that starts it in the line, `,"key":`: one constant to copy.
/// Made only by [`key!`], so that no field is written with a bare name.
#[derive(Clone, Copy)]
struct Key(&'static str);

macro_rules! key {
    ($name:literal) => {
        Key(concat!(",\"", $name, "\":"))
    };
}

/// Writes the JSON line of `ex` into `out`, newline included, as `tracing`'s JSON formatter
/// writes [`event`] (flattened, `message` first, `target` last; absent options left out).
pub fn json_line(out: &mut Vec<u8>, ex: &Exchange, elapsed: Duration, now: SystemTime) {
    let mut line = JsonLine(out);
    line.0.extend_from_slice(b"{\"timestamp\":\"");
    timestamp(line.0, now);
    line.0
        .extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"request\"");
    line.str(key!("request_id"), &ex.request_id);
    line.name(key!("protocol"), ex.protocol.as_str());
    line.str(key!("method"), method_name(ex.method.as_ref()));
    line.str(key!("path"), &ex.client_path);
    line.str(
        key!("upstream_path"),
        ex.upstream.path.as_deref().map_or("", without_query),
    );
    line.name(key!("api_version"), version_name(ex.version));
    line.name(key!("operation"), operation_name(ex.operation));
    line.str(key!("agent_id"), ex.agent_id.unwrap_or(""));
    line.int(key!("status"), ex.status.into());
    line.float(key!("duration_ms"), as_millis_f64(elapsed));
    if let Some(d) = ex.upstream.duration {
        line.float(key!("upstream_ms"), as_millis_f64(d));
    }
    line.int(key!("bytes_in"), ex.bytes_in as u64);
    line.int(key!("bytes_out"), ex.bytes_out as u64);
    line.name(key!("auth"), ex.auth_outcome());
    line.key(key!("client_aborted"));
    line.0
        .extend_from_slice(if ex.client_aborted { b"true" } else { b"false" });
    if ex.upstream.answer_broken {
        line.key(key!("answer_broken"));
        line.0.extend_from_slice(b"true");
    }
    if ex.closed_by_gateway {
        line.key(key!("closed_by_gateway"));
        line.0.extend_from_slice(b"true");
    }
    if let Some(id) = ex.trace_id() {
        line.key(key!("trace_id"));
        let _ = write!(line.0, "\"{id}\"");
    }
    line.key(key!("client_addr"));
    // An address's text needs no escaping.
    line.0.push(b'"');
    if let Some(ip) = ex.client_addr {
        put_ip(line.0, ip);
    }
    line.0.push(b'"');
    line.str(key!("user_agent"), ex.user_agent.as_deref().unwrap_or(""));
    line.name(key!("target"), TARGET);
    line.0.extend_from_slice(b"}\n");
}

/// A duration in milliseconds, as the access log gives it: its nanoseconds over 10^6, one
/// rounding, so that the number is the nanoseconds' digits (770,026 ns is `0.770026`, where
/// `as_secs_f64() * 1000.0` rounds twice and made it `0.7700260000000001`).
fn as_millis_f64(d: Duration) -> f64 {
    // A u64 holds 584 years of nanoseconds.
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX) as f64 / 1e6
}

/// Writes `now` as `humantime::format_rfc3339_micros` does (`2026-11-24T12:34:56.123456Z`, as
/// the `tracing` formatter's timestamps). The text up to the second is kept per thread and
/// made again when the second changes: a calendar date's formatting once a second, not per line.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    /// A second since the epoch and its text up to the fraction's dot.
    type Second = (u64, [u8; 20]);
    thread_local! {
        static SECOND: Cell<Second> = const { Cell::new((u64::MAX, [0; 20])) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (seconds, mut text) = SECOND.get();
    if seconds != since.as_secs() {
        let whole = UNIX_EPOCH + Duration::from_secs(since.as_secs());
        let mut written = &mut text[..];
        // 19 bytes and a dot into 20: cannot fail.
        let _ = write!(written, "{}", humantime::format_rfc3339_seconds(whole));
        text[19] = b'.';
        SECOND.set((since.as_secs(), text));
    }
    out.extend_from_slice(&text);
    let mut fraction = *b"000000Z";
    let mut micros = since.subsec_micros();
    for digit in fraction[..6].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.extend_from_slice(&fraction);
}

/// The fields of a JSON object being written, each after a comma. Each method takes its key
/// as [`key!`] writes it and is inlined, so that the key is copied as the constant it is.
struct JsonLine<'a>(&'a mut Vec<u8>);

impl JsonLine<'_> {
    #[inline(always)]
    fn key(&mut self, key: Key) {
        self.0.extend_from_slice(key.0.as_bytes());
    }

    /// A string value with serde_json's escaping (the tracing formatter's), which changes only
    /// `"`, `\\` and control characters: a value without them is copied as it is.
    #[inline(always)]
    fn str(&mut self, key: Key, value: &str) {
        self.key(key);
        if !needs_escape(value.as_bytes()) {
            self.0.push(b'"');
            self.0.extend_from_slice(value.as_bytes());
            self.0.push(b'"');
        } else {
            // Cannot fail into a Vec.
            let _ = serde_json::to_writer(&mut *self.0, value);
        }
    }

    /// One of the gateway's own names (a protocol, version, operation, outcome): nothing to
    /// escape, so not looked at.
    #[inline(always)]
    fn name(&mut self, key: Key, value: &'static str) {
        debug_assert!(!value.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\'));
        self.key(key);
        self.0.push(b'"');
        self.0.extend_from_slice(value.as_bytes());
        self.0.push(b'"');
    }

    #[inline(always)]
    fn int(&mut self, key: Key, value: u64) {
        self.key(key);
        self.0
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn float(&mut self, key: Key, value: f64) {
        self.key(key);
        let _ = serde_json::to_writer(&mut *self.0, &value);
    }
}

/// Whether `value` has a byte JSON escapes: a control character, `"` or `\\`. Eight bytes
/// at a time, as one word: the values are mostly shorter than a vector, and a loop over
/// bytes cost three instructions a byte.
fn needs_escape(value: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A high bit for each byte under `n` (n <= 0x80), exact as a whole: nonzero when any is.
    let under = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS;
    let equal = |word: u64, b: u8| under(word ^ (ONES * u64::from(b)), 1);
    let mut words = value.chunks_exact(8);
    for chunk in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(chunk);
        let word = u64::from_ne_bytes(bytes);
        if under(word, 0x20) | equal(word, b'"') | equal(word, b'\\') != 0 {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// The access-log line as a `tracing` event: for human-readable logs, and without a sink.
pub fn event(ex: &Exchange, elapsed: Duration) {
    tracing::info!(
        target: TARGET,
        request_id = %ex.request_id,
        protocol = ex.protocol.as_str(),
        method = method_name(ex.method.as_ref()),
        path = %ex.client_path,
        upstream_path = ex.upstream.path.as_deref().map_or("", without_query),
        api_version = version_name(ex.version),
        operation = operation_name(ex.operation),
        agent_id = ex.agent_id.unwrap_or(""),
        status = ex.status,
        duration_ms = as_millis_f64(elapsed),
        upstream_ms = ex.upstream.duration.map(as_millis_f64),
        bytes_in = ex.bytes_in,
        bytes_out = ex.bytes_out,
        auth = ex.auth_outcome(),
        client_aborted = ex.client_aborted,
        // Only when the backend broke its answer off after its head went out.
        answer_broken = ex.upstream.answer_broken.then_some(true),
        // Only when the gateway closed the connection before the answer was through.
        closed_by_gateway = ex.closed_by_gateway.then_some(true),
        // Joins the line to the request's trace (absent when tracing is off).
        trace_id = ex.trace_id().map(tracing::field::display),
        client_addr = %ex.client_addr.map_or_else(String::new, |ip| ip.to_string()),
        user_agent = ex.user_agent.as_deref().unwrap_or(""),
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time check says what a check of each byte says.
        #[test]
        fn needs_escape_is_a_check_of_each_byte(value in proptest::collection::vec(any::<u8>(), 0..40)) {
            let each = value.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
            prop_assert_eq!(needs_escape(&value), each);
        }

        /// Up to 10^9 ms (11 days), a duration is logged as its nanoseconds' digits, with no
        /// float noise: whole milliseconds, a dot, the fraction without trailing zeros.
        #[test]
        fn durations_are_logged_as_their_nanoseconds_digits(nanos in 10..1_000_000_000_000_000u64) {
            let mut line = Vec::new();
            JsonLine(&mut line).float(key!("ms"), as_millis_f64(Duration::from_nanos(nanos)));
            let fraction = format!("{:06}", nanos % 1_000_000);
            let fraction = match fraction.trim_end_matches('0') {
                "" => "0",
                digits => digits,
            };
            let want = format!(",\"ms\":{}.{fraction}", nanos / 1_000_000);
            prop_assert_eq!(String::from_utf8(line).unwrap(), want);
        }
    }

    #[test]
    fn each_escaped_byte_is_found_wherever_it_is() {
        for bad in [0u8, 0x1f, b'"', b'\\'] {
            for at in 0..20 {
                let mut value = vec![b'a'; 20];
                value[at] = bad;
                assert!(needs_escape(&value), "{bad:#x} at {at}");
            }
        }
        for fine in [0x20u8, 0x7f, 0x80, 0xff, b'a', b'!', b'#', b'['] {
            assert!(!needs_escape(&[fine; 19]), "{fine:#x}");
        }
    }
    use crate::api::operation::{ApiVersion, Operation};
    use crate::observe::exchange::Protocol;
    use std::sync::Mutex;

    /// What a `tracing` JSON subscriber, configured as the binary's, writes for `event`.
    fn through_tracing(ex: &Exchange, elapsed: Duration) -> serde_json::Value {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        crate::observe::register_a_second_dispatcher();
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || event(ex, elapsed));
        let bytes = out.0.lock().unwrap().clone();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn by_hand(ex: &Exchange, elapsed: Duration) -> (String, serde_json::Value) {
        let mut line = Vec::new();
        json_line(&mut line, ex, elapsed, SystemTime::now());
        let text = String::from_utf8(line).unwrap();
        let value = serde_json::from_str(&text).unwrap();
        (text, value)
    }

    fn forwarded() -> Exchange<'static> {
        let mut ex = Exchange::start(
            Protocol::Http1,
            Some(&http::Method::POST),
            "/api/v1/verify/request",
        );
        ex.request_id = "req-\"quoted\"\\ \u{1}é".into();
        ex.version = Some(ApiVersion::V1);
        ex.operation = Some(Operation::VerifyRequest);
        ex.agent_id = Some("agent-1");
        ex.status = 200;
        ex.upstream.path = Some("/api/v2/verify/S/request?secret=1".into());
        ex.upstream.duration = Some(Duration::from_micros(1234));
        ex.bytes_in = 23;
        ex.bytes_out = 109;
        ex.client_addr = Some("2001:db8::7".parse().unwrap());
        ex.user_agent = Some("agent-sdk/1.2 \"quoted\"".into());
        ex
    }

    /// Every field but the timestamp, which differs by when each was written.
    fn fields(mut v: serde_json::Value) -> serde_json::Value {
        let ts = v["timestamp"].take();
        assert!(
            ts.as_str()
                .is_some_and(|t| humantime::parse_rfc3339(t).is_ok()),
            "{ts}"
        );
        v
    }

    #[test]
    fn the_line_is_the_one_tracing_writes_for_the_event() {
        let refused = {
            let mut ex = Exchange::start(Protocol::Http2, Some(&http::Method::GET), "/nope");
            ex.request_id = "r-2".into();
            ex.status = 404;
            ex.client_aborted = true;
            ex
        };
        let unreadable = {
            let mut ex = Exchange::start(Protocol::Http1, None, "");
            ex.request_id = "r-3".into();
            ex.status = 400;
            ex
        };
        let broken = {
            let mut ex = forwarded();
            ex.upstream.answer_broken = true;
            ex
        };
        let cut = {
            let mut ex = forwarded();
            ex.answer_lost(true, false);
            ex
        };
        let field = |ex: &Exchange, name| by_hand(ex, Duration::ZERO).1.get(name).cloned();
        assert_eq!(
            field(&broken, "answer_broken"),
            Some(serde_json::Value::Bool(true))
        );
        assert_eq!(
            field(&cut, "closed_by_gateway"),
            Some(serde_json::Value::Bool(true))
        );
        for name in ["answer_broken", "closed_by_gateway"] {
            assert_eq!(
                field(&forwarded(), name),
                None,
                "{name} present only when true"
            );
        }
        for (ex, elapsed) in [
            (forwarded(), Duration::from_nanos(520_694_999)),
            (refused, Duration::from_micros(29)),
            (unreadable, Duration::from_micros(3)),
            (broken, Duration::from_micros(7)),
            (cut, Duration::from_micros(11)),
        ] {
            let (text, hand) = by_hand(&ex, elapsed);
            assert!(text.ends_with("}\n") && text.matches('\n').count() == 1);
            assert_eq!(
                fields(hand),
                fields(through_tracing(&ex, elapsed)),
                "{text}"
            );
        }
    }

    #[test]
    fn timestamps_are_the_text_humantime_writes() {
        let base = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        // Within a second, across seconds forward and back (the kept second is made again),
        // leading zeros in the fraction, nanoseconds cut to microseconds, and now.
        let times = [
            0,
            1,
            999_999,
            1_000_000,
            1_000_001,
            5,
            86_400_000_123,
            59_999_999,
        ]
        .map(|micros| base + Duration::from_micros(micros))
        .into_iter()
        .chain([
            base + Duration::from_nanos(7_123_456_789),
            SystemTime::now(),
        ]);
        for t in times {
            let mut out = Vec::new();
            timestamp(&mut out, t);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                humantime::format_rfc3339_micros(t).to_string()
            );
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for value in [
            "plain",
            "",
            "é ünïcode \u{7f}",
            "q\"uote",
            "back\\slash",
            "tab\t",
            "\u{1}",
        ] {
            let mut line = Vec::new();
            JsonLine(&mut line).str(key!("k"), value);
            let want = format!(",\"k\":{}", serde_json::to_string(value).unwrap());
            assert_eq!(String::from_utf8(line).unwrap(), want, "{value:?}");
        }
    }

    #[test]
    fn fields_keep_their_order_and_the_query_stays_out() {
        let (text, v) = by_hand(&forwarded(), Duration::from_millis(1));
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        // serde_json's map sorts keys; the order on the line is checked on the text.
        assert_eq!(keys.len(), 21);
        let order = [
            "timestamp",
            "level",
            "message",
            "request_id",
            "protocol",
            "method",
            "path",
            "upstream_path",
            "api_version",
            "operation",
            "agent_id",
            "status",
            "duration_ms",
            "upstream_ms",
            "bytes_in",
            "bytes_out",
            "auth",
            "client_aborted",
            "client_addr",
            "user_agent",
            "target",
        ];
        let at: Vec<usize> = order
            .iter()
            .filter_map(|k| text.find(&format!("\"{k}\":")))
            .collect();
        assert_eq!(at.len(), order.len(), "{text}");
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(v["upstream_path"], "/api/v2/verify/S/request");
        assert_eq!(v["client_addr"], "2001:db8::7");
        assert_eq!(v["user_agent"], "agent-sdk/1.2 \"quoted\"");
        assert!(!text.contains("secret"));
    }
}
