//! Where log lines go: a bounded buffer that a thread of its own writes out, so that logging
//! never makes a request wait on its sink.
//!
//! A line is copied into the buffer under a lock held only for the copy; the writer thread
//! swaps the buffer for an empty one and writes the whole batch with one `write(2)`, at most a
//! period ([`FLUSH_EVERY`] in the binary) after its first line, and as soon as [`WAKE_AT`]
//! bytes or an urgent line (a warning or an error) are waiting. With nothing queued the thread
//! sleeps until a line comes. When the sink is slower than the lines (a full pipe, a stalled disk),
//! the buffer fills to its capacity and further lines are dropped and counted, never waited
//! for, in the sink's own counter, `agent_gateway_log_lines_dropped_total` ([`LineSink::dropped_lines`]).

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use tracing_subscriber::fmt::MakeWriter;

/// The longest a line waits in the buffer when nothing hurries it, in the binary.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Bytes waiting that wake the writer before [`FLUSH_EVERY`]: one batch, one `write(2)`.
/// Some 150 access-log lines: at full load the writer thread wakes about once per 150
/// requests, each wake-up a context switch that, on a busy core, preempts the proxy.
pub const WAKE_AT: usize = 64 * 1024;
/// The buffer's default capacity: about 2,500 access-log lines, some 40 ms of the gateway's
/// peak rate on one core, for the sink to fall behind before lines are dropped.
pub const DEFAULT_CAPACITY: usize = 1024 * 1024;

/// A bounded, non-blocking line buffer in front of a writer (stderr in the binary).
pub struct LineSink {
    pending: Mutex<Pending>,
    /// Wakes the writer thread early.
    wake: Condvar,
    /// Tells [`LineSink::flush`] that a batch was written.
    written: Condvar,
    capacity: usize,
    /// The longest a line waits when nothing hurries it.
    period: Duration,
    /// Lines dropped: `agent_gateway_log_lines_dropped_total` once registered.
    dropped: IntCounter,
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    /// The writer was asked to write now; set once per batch, so one notification each.
    woken: bool,
    /// A batch taken from `lines` is being written.
    writing: bool,
    /// The writer sleeps with nothing queued, with no deadline: the next line wakes it.
    idle: bool,
}

impl LineSink {
    /// A sink of `capacity` bytes whose lines a new thread writes to `out`, each at most a
    /// `period` after it was queued.
    pub fn spawn(out: impl Write + Send + 'static, capacity: usize, period: Duration) -> Arc<Self> {
        let sink = Arc::new(LineSink {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            written: Condvar::new(),
            capacity,
            period,
            dropped: IntCounter::new(
                "agent_gateway_log_lines_dropped_total",
                "Log lines (access log and events) dropped because their sink was slower than \
                 the lines and the log buffer was full, or because writing them failed.",
            )
            .expect("a valid metric definition"),
        });
        let writer = sink.clone();
        std::thread::Builder::new()
            .name("log writer".into())
            .spawn(move || writer.write_out(out))
            .expect("spawning the log writer thread");
        sink
    }

    /// Queues `line` (one or more whole lines, newline included) without waiting: `false`
    /// when the buffer has no room for it, and the line is dropped and counted.
    pub fn push(&self, line: &[u8], urgent: bool) -> bool {
        let mut p = self.lock();
        if p.lines.len() + line.len() > self.capacity {
            drop(p);
            self.dropped.inc();
            return false;
        }
        p.lines.extend_from_slice(line);
        let wake = !p.woken && (urgent || p.lines.len() >= WAKE_AT);
        p.woken |= wake;
        // The first line after a quiet spell starts the period it may wait.
        let first = std::mem::take(&mut p.idle);
        drop(p);
        if wake || first {
            self.wake.notify_one();
        }
        true
    }

    /// Lines dropped so far: the buffer was full, or writing them failed.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// The count of dropped lines as a metric, for a registry to export.
    pub fn dropped_lines(&self) -> &IntCounter {
        &self.dropped
    }

    /// Waits, at most `limit`, until every line queued so far is written: before the process
    /// exits.
    pub fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut p = self.lock();
        p.woken = true;
        self.wake.notify_one();
        while !p.lines.is_empty() || p.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            p = self
                .written
                .wait_timeout(p, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves the buffer consistent: keep logging.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer thread: takes what is queued, a batch at a time, and writes it. With
    /// nothing queued it sleeps until a line comes (an idle gateway wakes no thread for its
    /// log); a line then waits at most a period for others to join its batch.
    fn write_out(&self, mut out: impl Write) {
        let mut batch = Vec::new();
        loop {
            let mut p = self.lock();
            while p.lines.is_empty() && !p.woken {
                p.idle = true;
                p = self.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            p.idle = false;
            if !p.woken {
                p = self
                    .wake
                    .wait_timeout(p, self.period)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            p.woken = false;
            std::mem::swap(&mut p.lines, &mut batch);
            p.writing = !batch.is_empty();
            drop(p);
            if !batch.is_empty() {
                if out.write_all(&batch).and_then(|()| out.flush()).is_err() {
                    let lost = batch.iter().filter(|&&b| b == b'\n').count();
                    self.dropped.inc_by(lost as u64);
                }
                batch.clear();
                self.lock().writing = false;
            }
            self.written.notify_all();
        }
    }
}

/// What `tracing`'s formatter writes its events to: the sink, warnings urgently, and errors
/// waited for (at most [`FLUSH_EVERY`]): an error is often the last line before the process
/// exits, and errors are never per request.
#[derive(Clone)]
pub struct SinkWriter(pub Arc<LineSink>);

/// One event's writer (the formatter writes each event whole, in one call).
pub struct EventWriter<'a> {
    sink: &'a LineSink,
    level: tracing::Level,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sink.push(buf, self.level <= tracing::Level::WARN);
        if self.level == tracing::Level::ERROR {
            self.sink.flush(FLUSH_EVERY);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for SinkWriter {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter {
            sink: &self.0,
            level: tracing::Level::INFO,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        EventWriter {
            sink: &self.0,
            level: *meta.level(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes the test can read, and can hold back to play a stalled sink.
    #[derive(Clone, Default)]
    struct Shared {
        bytes: Arc<Mutex<Vec<u8>>>,
        stalled: Arc<Mutex<()>>,
    }

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _wait = self.stalled.lock().unwrap();
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Long enough that nothing in a test is written by the period.
    const NEVER: Duration = Duration::from_secs(3600);

    fn written(out: &Shared) -> Vec<u8> {
        out.bytes.lock().unwrap().clone()
    }

    #[test]
    fn lines_come_out_whole_and_in_order() {
        let out = Shared::default();
        let sink = LineSink::spawn(out.clone(), DEFAULT_CAPACITY, FLUSH_EVERY);
        for i in 0..10_000 {
            assert!(sink.push(format!("line {i}\n").as_bytes(), false));
        }
        sink.flush(Duration::from_secs(10));
        let text = String::from_utf8(written(&out)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10_000);
        assert!(lines
            .iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i}")));
        assert_eq!(sink.dropped(), 0);
    }

    #[test]
    fn a_stalled_sink_costs_lines_not_waiting_and_they_are_counted() {
        let out = Shared::default();
        let stall = out.stalled.lock().unwrap();
        let sink = LineSink::spawn(out.clone(), 100, NEVER);
        // Nothing wakes the writer (100 bytes is under WAKE_AT): the buffer takes ten 10-byte
        // lines and refuses the rest at once.
        let accepted = (0..50).filter(|_| sink.push(b"123456789\n", false)).count();
        assert_eq!(accepted, 10);
        assert_eq!(sink.dropped(), 40);
        drop(stall);
        sink.flush(Duration::from_secs(10));
        assert_eq!(written(&out), b"123456789\n".repeat(10));
    }

    #[test]
    fn urgent_lines_and_full_batches_are_written_before_the_period() {
        let out = Shared::default();
        let sink = LineSink::spawn(out.clone(), DEFAULT_CAPACITY, NEVER);
        sink.push(b"info\n", false);
        sink.push(b"error\n", true);
        wait_for(&out, b"info\nerror\n".len());
        let batch = vec![b'x'; WAKE_AT];
        sink.push(&batch, false);
        wait_for(&out, b"info\nerror\n".len() + WAKE_AT);
    }

    #[test]
    fn a_line_after_a_quiet_spell_is_written_within_the_period() {
        let out = Shared::default();
        let sink = LineSink::spawn(out.clone(), DEFAULT_CAPACITY, Duration::from_millis(10));
        sink.push(b"first\n", false);
        wait_for(&out, b"first\n".len());
        // The writer has nothing queued and sleeps with no deadline: the next line wakes it.
        std::thread::sleep(Duration::from_millis(50));
        sink.push(b"second\n", false);
        wait_for(&out, b"first\nsecond\n".len());
    }

    /// Waits until `len` bytes are written (the test fails by hanging past 10 s otherwise).
    fn wait_for(out: &Shared, len: usize) {
        let start = Instant::now();
        while written(out).len() < len {
            assert!(start.elapsed() < Duration::from_secs(10), "not written");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
