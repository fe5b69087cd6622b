//! `agent-gateway hash-token`: the hex SHA-256 of the token on stdin, as `token_sha256` wants
//! it. A published token is refused (`run` would refuse its digest), and a short one is
//! warned of: its digest's first 8 hex digits name it on `/metrics`, against which a short
//! token can be guessed offline.

use std::io::Read;
use std::process::ExitCode;

use anyhow::{bail, Context};

use agent_gateway::config::published::published_token;
use agent_gateway::config::TokenDigest;

/// Tokens shorter than this are warned of: `openssl rand -hex 32` makes 64 characters.
const SHORT_TOKEN: usize = 16;

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
    let digest = TokenDigest::of(token.as_bytes());
    if published_token(&digest).is_some() {
        bail!(
            "this token is published with agent-gateway (its README and demo config): run and \
             check-config refuse its digest. Make one of your own: openssl rand -hex 32"
        );
    }
    if token.len() < SHORT_TOKEN {
        eprintln!(
            "warning: this token is {} bytes: its digest's first 8 hex digits name it on \
             /metrics, and a token this short can be guessed from them offline. Make a long \
             random one: openssl rand -hex 32",
            token.len()
        );
    }
    println!("{}", digest.to_hex());
    Ok(ExitCode::SUCCESS)
}
