//! The machine the xtask runs on: what is on `PATH`, whether it runs as root, and the one
//! thing it changes there, `apt-get install`.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::packages::{Host, Probe};

/// Whether `program` is an executable file in a directory of `PATH`.
pub fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Whether what `probe` looks for is there.
pub fn present(probe: &Probe) -> bool {
    match *probe {
        Probe::Programs(programs) => programs.iter().all(|p| on_path(p)),
        Probe::Succeeds([program, args @ ..]) => Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        Probe::Succeeds([]) => false,
    }
}

/// Whether this process runs as root: the effective uid on the `Uid:` line of
/// `/proc/self/status` (std has no `geteuid`, and this crate has no dependencies); `id -u`
/// where there is no /proc.
fn is_root() -> bool {
    match std::fs::read_to_string("/proc/self/status") {
        Ok(status) => {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1))
                == Some("0")
        }
        Err(_) => Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0"),
    }
}

/// What this machine lets the xtask do.
pub fn host() -> Host {
    Host {
        root: is_root(),
        apt: on_path("apt-get"),
        sudo: on_path("sudo"),
    }
}

/// How long apt-get waits for another apt or dpkg run to let go of its lock, in seconds.
const APT_LOCK_WAIT_SECONDS: u32 = 600;

/// `apt-get update`, then `apt-get <install_args>`, without questions (CI has no stdin).
/// apt-get's output goes to stderr: stdout is the demo's (the commands it prints).
pub fn apt_get_install(install_args: &[String]) -> Result<(), String> {
    let lock_wait = format!("DPkg::Lock::Timeout={APT_LOCK_WAIT_SECONDS}");
    apt_get(&["update".to_string()], &lock_wait)?;
    apt_get(install_args, &lock_wait)
}

fn apt_get(args: &[String], lock_wait: &str) -> Result<(), String> {
    eprintln!("cargo xtask: apt-get {}", args.join(" "));
    let status = Command::new("apt-get")
        .args(["-o", lock_wait])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("apt-get {} failed ({status})", args.join(" ")))
    }
}

/// The cargo that ran the xtask (`CARGO`, set by `cargo run`), else `cargo` on `PATH`.
pub fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| OsStr::new("cargo").to_owned())
}

/// The workspace root (the gateway's package), where the cargo commands run.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ is inside the workspace")
}
