//! The other programs tests run: finding them on PATH, signalling them, waiting for a state
//! with one bounded deadline, and waiting for a server to listen on its own ports.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use super::ports::listens_on;

/// How long any wait of the harness lasts before it fails the test. Only a guard against a
/// hang: waits end as soon as their state is reached, so it can be generous on a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `cond` until it holds; fails the test after [`PATIENCE`], naming `what`.
pub fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    wait_until_or(what, cond, String::new);
}

/// [`wait_until`], and on failure also prints `context()` (a process's log).
pub fn wait_until_or(what: &str, mut cond: impl FnMut() -> bool, context: impl FnOnce() -> String) {
    poll_until(what, &mut cond, |done| *done, |_| context());
}

/// Calls `probe` until `done` holds for what it returns, and returns that; fails the test
/// after [`PATIENCE`] with `what` and `context` of the last value.
pub fn poll_until<T>(
    what: &str,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
    context: impl FnOnce(&T) -> String,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = probe();
        if done(&value) {
            return value;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {} s waiting for {what}\n{}",
                PATIENCE.as_secs(),
                context(&value)
            );
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// The full path of program `name`; fails the test when it is not on PATH, never skips it.
pub fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            let install = match name {
                "kubectl" => "kubectl 1.21 or later (it has kustomize v4+)",
                _ => {
                    "`cargo xtask deps test` installs every system package the tests need \
                      (xtask/src/packages.rs names them)"
                }
            };
            panic!("`{name}` is not on PATH: {install}")
        })
}

/// Sends signal `sig` (`TERM`, `HUP`, ...) through `kill`, so tests need no libc binding.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}: {status}");
}

/// How a server process came up.
#[derive(Debug, PartialEq, Eq)]
pub enum Listening {
    /// It listens on every port itself.
    Yes,
    /// Another process holds one of its ports: start it again on others.
    PortTaken,
}

/// Waits until `child` itself listens on every one of `ports` (not merely until something
/// answers there: that could be another process). When its log (`log()`) contains
/// `in_use`, what it says when a port is taken, returns [`Listening::PortTaken`]; fails the
/// test, with the log, if it exits first or is not listening within [`PATIENCE`].
pub fn wait_listening(
    child: &mut Child,
    ports: &[u16],
    what: &str,
    in_use: Option<&str>,
    log: impl Fn() -> String,
) -> Listening {
    let deadline = Instant::now() + PATIENCE;
    let taken = |log: &str| in_use.is_some_and(|s| log.to_lowercase().contains(s));
    loop {
        if ports.iter().all(|p| listens_on(child.id(), *p)) {
            return Listening::Yes;
        }
        if let Some(status) = child.try_wait().unwrap() {
            let log = log();
            if taken(&log) {
                return Listening::PortTaken;
            }
            panic!("{what} exited ({status}) before listening on {ports:?}; log:\n{log}");
        }
        if taken(&log()) {
            return Listening::PortTaken;
        }
        assert!(
            Instant::now() < deadline,
            "{what} is not listening on {ports:?} after {} s; log:\n{}",
            PATIENCE.as_secs(),
            log()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills `child` and reaps it.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
