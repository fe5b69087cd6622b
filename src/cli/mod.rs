//! The commands of the binary that need more than a call into the library.

pub mod demo;

use std::time::Duration;

use anyhow::{bail, Context};

use agent_gateway::http1::client;

/// How long the CLI waits for the admin listener.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an admin answer the CLI reads.
const MAX_ADMIN_ANSWER: usize = 64 * 1024 * 1024;

/// A GET of `path` on the admin listener at `base` (`http://host:port`): the body of a 200.
pub fn admin_get(base: &str, path: &str) -> anyhow::Result<String> {
    let authority = base
        .strip_prefix("http://")
        .context("--admin must be an http:// URL")?
        .trim_end_matches('/')
        .to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let answer = runtime.block_on(async {
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(&authority)
                .await
                .with_context(|| format!("cannot connect to {authority}"))?;
            client::get(&mut stream, &authority, path, MAX_ADMIN_ANSWER)
                .await
                .with_context(|| format!("reading {base}{path}"))
        };
        tokio::time::timeout(ADMIN_TIMEOUT, fetch)
            .await
            .with_context(|| format!("{base}{path} did not answer in time"))?
    })?;
    if answer.status() != 200 {
        bail!("{base}{path} answered {}", answer.status());
    }
    String::from_utf8(answer.body().to_vec()).context("the answer is not UTF-8")
}
