//! `agent-gateway hash-token`: the hex SHA-256 of the token on stdin, as `token_sha256` wants it.

use std::io::Read;
use std::process::ExitCode;

use anyhow::{bail, Context};

use agent_gateway::config::TokenDigest;

pub fn run() -> anyhow::Result<ExitCode> {
    let mut token = String::new();
    std::io::stdin()
        .read_to_string(&mut token)
        .context("reading the token from stdin")?;
    // A trailing newline from `echo` or a terminal is not part of the token.
    let token = token.strip_suffix('\n').unwrap_or(&token);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.is_empty() {
        bail!("no token on stdin");
    }
    println!("{}", TokenDigest::of(token.as_bytes()).to_hex());
    Ok(ExitCode::SUCCESS)
}
