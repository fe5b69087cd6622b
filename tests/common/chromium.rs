//! Debian's chromium, headless: what a person's browser makes of a page the gateway or a tool
//! writes (its DOM after its scripts ran, or a screenshot).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Debian's chromium, headless, on a fresh profile, without the background connections this
/// machine's closed network refuses. Waits at most two minutes (a hung browser fails the
/// test rather than the suite).
pub fn chromium(profile: &Path, args: &[&str]) -> Output {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let mut child = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {bin} ({e}): install Debian's chromium package (.ci/run does)")
        });
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
        out
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within two minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    Output {
        status,
        stdout: reader.join().unwrap(),
        stderr,
    }
}
