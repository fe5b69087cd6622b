//! `cargo xtask demo | test`, the README's two commands: each installs the system packages its
//! task needs and the machine lacks, then runs `cargo run -- demo` or the test suite. And
//! `cargo xtask image`, the container image.
//!
//! - [`packages`]: the one table of system packages and the pure decision of what to do.
//! - [`host`]: what this machine has, and `apt-get`.
//! - [`image`]: which container engine builds the image, and with what.
#![forbid(unsafe_code)]

pub mod host;
pub mod image;
pub mod packages;
