//! The commands of the binary that need more than a call into the library: plain HTTP GETs
//! to the admin listener and to Prometheus.

pub mod demo;

use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};

use agent_gateway::http1::client;
use agent_gateway::observe::fleet::{FleetError, Prometheus};

/// How long the CLI waits for one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an answer the CLI reads.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// A GET of `path` under `base` (`http://host:port`, optionally with a path prefix): the
/// status and body of the answer.
fn http_get(base: &str, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let rest = base
        .strip_prefix("http://")
        .with_context(|| format!("{base} is not an http:// URL"))?
        .trim_end_matches('/');
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let target = format!("{prefix}{path}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let answer = runtime.block_on(async {
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(authority)
                .await
                .with_context(|| format!("cannot connect to {authority}"))?;
            client::get(&mut stream, authority, &target, MAX_ANSWER)
                .await
                .with_context(|| format!("reading {base}{path}"))
        };
        tokio::time::timeout(ANSWER_TIMEOUT, fetch)
            .await
            .with_context(|| format!("{base}{path} did not answer in time"))?
    })?;
    Ok((answer.status(), answer.body().to_vec()))
}

/// A GET of `path` on the admin listener at `base` (`http://host:port`): the body of a 200.
pub fn admin_get(base: &str, path: &str) -> anyhow::Result<String> {
    let (status, body) = http_get(base, path).context("--admin")?;
    if status != 200 {
        bail!("{base}{path} answered {status}");
    }
    String::from_utf8(body).context("the answer is not UTF-8")
}

/// A Prometheus server's query API at `base` (`http://host:port`, or with the path prefix of
/// its `--web.route-prefix`).
pub struct PrometheusApi {
    pub base: String,
}

impl Prometheus for PrometheusApi {
    fn query(&mut self, promql: &str, at: Option<SystemTime>) -> Result<Vec<u8>, FleetError> {
        let mut path = format!("/api/v1/query?query={}", url_encode(promql));
        if let Some(t) = at {
            let secs = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            path.push_str(&format!("&time={secs:.3}"));
        }
        // Prometheus answers errors in JSON too, with a 4xx or 5xx status: the body says why.
        let (_status, body) =
            http_get(&self.base, &path).map_err(|e| FleetError::Fetch(format!("{e:#}")))?;
        Ok(body)
    }
}

/// `s` percent-encoded for a query string: everything but unreserved characters.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
