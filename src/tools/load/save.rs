//! `--save FILE.jsonl`: a run kept as it goes, one JSON line per request, so that
//! `agent-gateway load report FILE.jsonl` draws the same report again without the target
//! (vegeta's `encode`, k6's JSON output).
//!
//! The first line describes the run: `{"agent_gateway_load":1,"setup":{...},"thresholds":[...],
//! "started_at":"..."}` (the [`Setup`] its report describes; no address, no credential). Then
//! one line per request, as [`Record`]s:
//!
//! ```text
//! {"start_us":1234,"latency_us":870,"status":200,"operation":"verify_request","agent":"agent-1"}
//! {"start_us":2234,"latency_us":10000012,"error":"timeout","operation":"credential_offer","agent":"agent-2","late":true}
//! ```
//!
//! `start_us` is when it was due (open model) or sent (closed), µs since the run's start;
//! `error` (connect, timeout, closed, io, protocol, reset, unsent, cancelled) replaces `status`
//! for a request that got no answer; `late` marks one sent more than 1 ms after it was due.
//! Once the run's hard deadline has passed, the rest of the schedule is unsent and saved as
//! one line per agent with a `count` (`"error":"unsent",...,"count":120000`): that many
//! requests, which would have been due from `start_us` on.
//! The last line says how the run ended: `{"end":{"elapsed_ns":10004312876,"interrupted":false}}`;
//! a file without it (the generator was killed) is read as a run interrupted at its last
//! request. Lines come in the order connections hand them over (a batch at a time), not
//! sorted by time.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::api::operation::Operation;

use super::plan::Setup;
use super::report::Measured;
use super::stats::{ConnErrorKind, End, Record};
use super::LoadError;

/// The version of the file's format this build writes and reads.
const FORMAT: u32 = 1;

/// A worker hands its lines over once it has this many bytes of them (or its second ends).
const BATCH_BYTES: usize = 16 * 1024;

/// The first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The format's version: [`FORMAT`].
    pub agent_gateway_load: u32,
    pub setup: Setup,
    /// The run's `--threshold`s as given, judged again when the report is redrawn.
    pub thresholds: Vec<String>,
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
}

/// The last line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Ending {
    end: RunEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct RunEnd {
    elapsed_ns: u64,
    interrupted: bool,
}

/// A request's line as read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    start_us: u64,
    latency_us: u64,
    status: Option<u16>,
    error: Option<String>,
    operation: String,
    agent: String,
    #[serde(default)]
    late: bool,
    /// Unsent lines only: the requests it stands for (1 when absent).
    count: Option<u64>,
}

/// The `error` of a line that got no answer.
fn error_name(end: End) -> Option<&'static str> {
    match end {
        End::Answered(_) => None,
        End::Failed(kind) => Some(kind.as_str()),
        End::Unsent => Some("unsent"),
        End::Cancelled => Some("cancelled"),
    }
}

fn end_named(name: &str) -> Option<End> {
    match name {
        "unsent" => Some(End::Unsent),
        "cancelled" => Some(End::Cancelled),
        _ => ConnErrorKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .map(End::Failed),
    }
}

/// The file being written: lines arrive from the workers in batches and a thread of its own
/// writes them, so that no worker waits on the disk.
pub struct Saver {
    path: PathBuf,
    thresholds: Vec<String>,
    batches: mpsc::Sender<Vec<u8>>,
    writer: JoinHandle<io::Result<()>>,
}

impl Saver {
    /// Creates (or empties) the file, before anything is sent, so that a path that cannot be
    /// written fails the command at once.
    pub fn create(path: &Path, thresholds: Vec<String>) -> Result<Saver, LoadError> {
        let error = |source| LoadError::Save {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(error)?;
        let (batches, received) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name("load-save".into())
            .spawn(move || {
                let mut out = BufWriter::with_capacity(256 * 1024, file);
                for batch in received {
                    out.write_all(&batch)?;
                }
                out.flush()
            })
            .map_err(error)?;
        Ok(Saver {
            path: path.to_owned(),
            thresholds,
            batches,
            writer,
        })
    }

    /// Writes the first line.
    pub fn start(&self, setup: &Setup, started_at: SystemTime) {
        let header = Header {
            agent_gateway_load: FORMAT,
            setup: setup.clone(),
            thresholds: self.thresholds.clone(),
            started_at: humantime::format_rfc3339_seconds(started_at).to_string(),
        };
        self.send_line(&header);
    }

    /// A writer of request lines for one worker.
    pub fn lines(&self, setup: &Setup) -> LineWriter {
        LineWriter {
            agents: setup
                .agents
                .iter()
                .map(|a| serde_json::to_string(&a.id).expect("a string serializes"))
                .collect(),
            buf: Vec::with_capacity(BATCH_BYTES + 512),
            batches: self.batches.clone(),
        }
    }

    /// Writes the last line.
    pub fn end(&self, elapsed: Duration, interrupted: bool) {
        self.send_line(&Ending {
            end: RunEnd {
                elapsed_ns: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
                interrupted,
            },
        });
    }

    fn send_line<T: Serialize>(&self, line: &T) {
        let mut bytes = serde_json::to_vec(line).expect("plain data serializes");
        bytes.push(b'\n');
        // The writer only stops on an error, which `finish` reports.
        let _ = self.batches.send(bytes);
    }

    /// Waits for every line to be on disk.
    pub fn finish(self) -> Result<(), LoadError> {
        let Saver {
            path,
            batches,
            writer,
            ..
        } = self;
        drop(batches);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")));
        written.map_err(|source| LoadError::Save {
            path: path.display().to_string(),
            source,
        })
    }
}

/// One worker's lines, handed to the [`Saver`] a batch at a time.
pub struct LineWriter {
    /// The agents' ids as JSON strings, indexed like the run's agents.
    agents: Vec<String>,
    buf: Vec<u8>,
    batches: mpsc::Sender<Vec<u8>>,
}

impl LineWriter {
    /// Adds the line of `r`.
    pub fn push(&mut self, r: &Record) {
        self.push_count(r, 1);
    }

    /// Adds the line of `n` requests that ended as `r` did (`count` when more than one).
    pub fn push_count(&mut self, r: &Record, n: u64) {
        let out = &mut self.buf;
        out.extend_from_slice(b"{\"start_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(r.start_us).as_bytes());
        out.extend_from_slice(b",\"latency_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(r.latency_us).as_bytes());
        match (r.end, error_name(r.end)) {
            (End::Answered(status), _) => {
                out.extend_from_slice(b",\"status\":");
                out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
            }
            (_, Some(error)) => {
                out.extend_from_slice(b",\"error\":\"");
                out.extend_from_slice(error.as_bytes());
                out.push(b'"');
            }
            (_, None) => unreachable!("only an answer has no error name"),
        }
        out.extend_from_slice(b",\"operation\":\"");
        out.extend_from_slice(r.op.as_str().as_bytes());
        out.extend_from_slice(b"\",\"agent\":");
        out.extend_from_slice(self.agents[r.agent].as_bytes());
        if r.late {
            out.extend_from_slice(b",\"late\":true");
        }
        if n != 1 {
            out.extend_from_slice(b",\"count\":");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        }
        out.extend_from_slice(b"}\n");
        if out.len() >= BATCH_BYTES {
            self.flush();
        }
    }

    /// Hands what it has to the writer.
    pub fn flush(&mut self) {
        if !self.buf.is_empty() {
            let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(BATCH_BYTES + 512));
            let _ = self.batches.send(batch);
        }
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A saved run read back: how it was set up and what it measured.
#[derive(Debug)]
pub struct Saved {
    pub header: Header,
    pub measured: Measured,
}

/// Reads a file `--save` wrote, counting each request as the run did.
pub fn read_saved(path: &Path) -> Result<Saved, LoadError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| LoadError::SavedRead {
        path: shown.clone(),
        source,
    })?;
    read_lines(BufReader::new(file), &shown)
}

/// Reads the lines of a saved run (`path` names it in errors).
pub fn read_lines(input: impl BufRead, path: &str) -> Result<Saved, LoadError> {
    let bad = |line: usize, message: String| LoadError::SavedFormat {
        path: path.to_owned(),
        line,
        message,
    };
    let mut lines = input.lines();
    let first = lines
        .next()
        .ok_or_else(|| bad(1, "the file is empty".into()))?
        .map_err(|source| LoadError::SavedRead {
            path: path.to_owned(),
            source,
        })?;
    let header: Header = serde_json::from_str(&first).map_err(|e| {
        bad(
            1,
            format!("not the first line of a run saved by `load --save`: {e}"),
        )
    })?;
    if header.agent_gateway_load != FORMAT {
        return Err(bad(
            1,
            format!(
                "format {} (this build reads {FORMAT})",
                header.agent_gateway_load
            ),
        ));
    }
    let started_at = humantime::parse_rfc3339(&header.started_at)
        .map_err(|e| bad(1, format!("started_at: {e}")))?;
    let agents: HashMap<&str, usize> = header
        .setup
        .agents
        .iter()
        .enumerate()
        .map(|(k, a)| (a.id.as_str(), k))
        .collect();
    let mut measured = Measured::new(started_at);
    let mut ending = None;
    let mut last_us = 0;
    for (k, line) in lines.enumerate() {
        let n = k + 2;
        let line = line.map_err(|source| LoadError::SavedRead {
            path: path.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        if ending.is_some() {
            return Err(bad(n, "a line after the run's last".into()));
        }
        if line.starts_with("{\"end\"") {
            let e: Ending = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
            ending = Some(e.end);
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
        let end = match (l.status, l.error.as_deref()) {
            (Some(status), None) => End::Answered(status),
            (None, Some(error)) => {
                end_named(error).ok_or_else(|| bad(n, format!("unknown error {error:?}")))?
            }
            _ => return Err(bad(n, "give one of status and error".into())),
        };
        let op = Operation::ALL
            .into_iter()
            .find(|o| o.as_str() == l.operation)
            .ok_or_else(|| bad(n, format!("unknown operation {:?}", l.operation)))?;
        let agent = *agents
            .get(l.agent.as_str())
            .ok_or_else(|| bad(n, format!("agent {:?} is not in the first line", l.agent)))?;
        let r = Record {
            start_us: l.start_us,
            latency_us: l.latency_us,
            end,
            op,
            agent,
            late: l.late,
        };
        match l.count {
            None => {
                measured.stats.record(&r);
                if end != End::Cancelled {
                    measured.timeline.record(&r);
                }
            }
            Some(count) if count > 0 && end == End::Unsent => {
                measured.stats.record_unsent(agent, count);
                measured.timeline.record_unsent(&r, count);
            }
            Some(_) => return Err(bad(n, "a count is for unsent lines, at least 1".into())),
        }
        last_us = last_us.max(r.start_us.saturating_add(r.latency_us));
    }
    let end = ending.unwrap_or(RunEnd {
        elapsed_ns: last_us.saturating_mul(1000),
        interrupted: true,
    });
    measured.elapsed = Duration::from_nanos(end.elapsed_ns);
    measured.interrupted = end.interrupted;
    measured
        .timeline
        .extend_to(measured.elapsed.as_secs_f64().ceil() as usize);
    Ok(Saved { header, measured })
}
