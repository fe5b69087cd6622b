//! `cargo xtask demo | test`, the README's two commands: each installs the system packages its
//! task needs and the machine lacks, then runs `cargo run -- demo` or the test suite.
//!
//! - [`packages`]: the one table of system packages and the pure decision of what to do.
//! - [`host`]: what this machine has, and `apt-get`.
#![forbid(unsafe_code)]

pub mod host;
pub mod packages;
