//! A Python virtualenv with the pinned third-party tools some tests drive (the OpenAPI
//! validator, schemathesis, the `h2` HTTP/2 library, REDbot), built on first use under
//! `target/py-venv`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// What the virtualenv gets; bump a pin here to upgrade a tool.
pub const PACKAGES: [&str; 4] = [
    "openapi-spec-validator==0.9.0",
    "schemathesis==4.32.5",
    "h2==4.4.1",
    "redbot==2.7.1",
];

/// The modules that must import for the venv to count as complete.
const IMPORTS: &str = "import openapi_spec_validator, openapi_schema_validator, schemathesis, \
                       h2, hyperframe, redbot, thor";

/// Runs `cmd`, panicking with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn complete(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", IMPORTS])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The venv's `bin` directory: `AGENT_GATEWAY_PYTHON_BIN` if set, else `target/py-venv/bin`,
/// built once if missing or incomplete. It is built beside its final place and renamed into
/// it, so a cut-short run leaves nothing half-made and concurrent runs cannot collide.
pub fn venv_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(find_or_build).clone()
}

fn find_or_build() -> PathBuf {
    if let Some(p) = std::env::var_os("AGENT_GATEWAY_PYTHON_BIN") {
        return PathBuf::from(p);
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is target/tmp")
        .to_path_buf();
    let venv = target.join("py-venv");
    let bin = venv.join("bin");
    if complete(&bin.join("python")) {
        return bin;
    }
    let building = target.join(format!("py-venv.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    run(Command::new("python3").arg("-m").arg("venv").arg(&building));
    run(Command::new(building.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PACKAGES));
    let _ = std::fs::remove_dir_all(&venv);
    if std::fs::rename(&building, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    // A venv's scripts name their interpreter by absolute path: the renamed venv's python
    // is what runs them, so call tools as `python -m tool`.
    assert!(
        complete(&bin.join("python")),
        "{} lacks the tools",
        venv.display()
    );
    bin
}
