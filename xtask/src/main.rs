//! `cargo xtask`: parses the command, makes sure the machine has what the task needs, then
//! hands over to cargo (`exec`, so signals and the exit code are cargo's own); or builds the
//! container image with the engine that answers.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use xtask::host;
use xtask::image::{self, Build};
use xtask::packages::{self, Plan, Task};

const USAGE: &str = "\
usage: cargo xtask <command> [ARGS]

  demo [ARGS]        install what the demo needs, then `cargo run -- demo ARGS`
  test [ARGS]        install what the tests need, then `cargo test --workspace --all-targets`
                     (ARGS, when given, go to `cargo test` instead of those two flags)
  deps [demo|test]   only install what the demo or (by default) the tests need
  image [ARGS]       build the container image (Containerfile) with podman or docker, whichever
                     answers (CONTAINER_ENGINE=docker to choose), tagged agent-gateway:<version>;
                     ARGS go to `<engine> build` (e.g. --build-arg RUST_IMAGE=mirror/rust:...).
                     Prints the image reference on its last line.

Cargo runs in the workspace root, so relative paths in ARGS are taken from there.
Missing system packages are installed with apt-get (after apt-get update) when running as
root on Debian; otherwise it stops before building and prints the command to run.
XTASK_ASSUME_MISSING=cmake,prometheus treats those packages as missing (to try that path).
";

/// The environment variable naming packages to treat as missing.
const ASSUME_MISSING: &str = "XTASK_ASSUME_MISSING";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("cargo xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return Ok(ExitCode::FAILURE);
    };
    match command.as_str() {
        "demo" => {
            if !ensure(Task::Demo)? {
                return Ok(ExitCode::FAILURE);
            }
            let mut cargo_args = vec!["run", "--", "demo"];
            cargo_args.extend(rest.iter().map(String::as_str));
            Err(exec_cargo(&cargo_args))
        }
        "test" => {
            if !ensure(Task::Test)? {
                return Ok(ExitCode::FAILURE);
            }
            let mut cargo_args = vec!["test"];
            if rest.is_empty() {
                cargo_args.extend(["--workspace", "--all-targets"]);
            } else {
                cargo_args.extend(rest.iter().map(String::as_str));
            }
            Err(exec_cargo(&cargo_args))
        }
        "deps" => {
            let task = match rest {
                [] => Task::Test,
                [name] => Task::parse(name).ok_or_else(|| format!("deps {name}?\n{USAGE}"))?,
                _ => return Err(format!("deps takes one task\n{USAGE}")),
            };
            if !ensure(task)? {
                return Ok(ExitCode::FAILURE);
            }
            eprintln!("cargo xtask: this machine has what `{}` needs", task.name());
            Ok(ExitCode::SUCCESS)
        }
        "image" => build_image(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    }
}

/// The packages named in `XTASK_ASSUME_MISSING`, each checked against the table.
fn assume_missing() -> Result<Vec<&'static str>, String> {
    let value = std::env::var(ASSUME_MISSING).unwrap_or_default();
    value
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            packages::by_name(name).map(|p| p.debian).ok_or_else(|| {
                let known: Vec<_> = packages::PACKAGES.iter().map(|p| p.debian).collect();
                format!(
                    "{ASSUME_MISSING}: no package {name:?} (known: {})",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// Makes sure the machine has what `task` needs, installing it when it can. `Ok(false)`: it
/// cannot, and has said what to run.
fn ensure(task: Task) -> Result<bool, String> {
    let assumed = assume_missing()?;
    let missing = packages::missing(task, host::present, &assumed);
    match packages::plan(task, &missing, host::host()) {
        Plan::Ready => Ok(true),
        Plan::Stop(text) => {
            eprint!("{text}");
            Ok(false)
        }
        Plan::Install(install_args) => {
            let names: Vec<_> = missing.iter().map(|p| p.debian).collect();
            eprintln!("cargo xtask: installing {}", names.join(", "));
            host::apt_get_install(&install_args)?;
            let still = packages::missing(task, host::present, &[]);
            if still.is_empty() {
                Ok(true)
            } else {
                let names: Vec<_> = still.iter().map(|p| p.debian).collect();
                Err(format!(
                    "still missing after apt-get install: {}",
                    names.join(", ")
                ))
            }
        }
    }
}

/// Whether `<engine> info` succeeds: the engine can build and run here.
fn answers(engine: &str) -> bool {
    Command::new(engine)
        .arg("info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What `git args` prints, trimmed; `None` when git fails (no git, not a checkout).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(host::workspace_root())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The commit the image is built from, `-dirty` when the work tree has changes git sees.
fn revision() -> String {
    match git(&["rev-parse", "HEAD"]) {
        Some(commit) if git(&["status", "--porcelain"]).is_some() => format!("{commit}-dirty"),
        Some(commit) => commit,
        None => "unknown".into(),
    }
}

/// `cargo xtask image`: builds, says how long it took and how big the image is (stderr), and
/// prints the reference (stdout, the last line).
fn build_image(extra: &[String]) -> Result<ExitCode, String> {
    let named = std::env::var(image::ENGINE_VARIABLE).ok();
    let engine = image::choose_engine(named.as_deref(), answers)?;
    let root = host::workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| format!("cannot read Cargo.toml: {e}"))?;
    let build = Build {
        version: image::package_version(&manifest).ok_or("Cargo.toml has no [package] version")?,
        revision: revision(),
        source: git(&["remote", "get-url", "origin"])
            .map_or_else(|| "unknown".into(), |url| image::public_url(&url)),
    };
    let args = build.arguments(&root.display().to_string(), extra);
    eprintln!("cargo xtask: {engine} {}", args.join(" "));
    let started = Instant::now();
    // The engine's output goes to stderr: stdout is the reference alone.
    let status = Command::new(&engine)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| format!("cannot run {engine}: {e}"))?;
    if !status.success() {
        return Err(format!("{engine} build failed ({status})"));
    }
    let seconds = started.elapsed().as_secs();
    let reference = build.reference();
    let size = Command::new(&engine)
        .args(["image", "inspect", "--format", "{{.Size}}", &reference])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    match size {
        Some(bytes) => eprintln!(
            "cargo xtask: built {reference} in {seconds} s: {:.1} MB",
            bytes as f64 / 1e6
        ),
        None => eprintln!("cargo xtask: built {reference} in {seconds} s"),
    }
    println!("{reference}");
    Ok(ExitCode::SUCCESS)
}

/// Replaces this process with `cargo <args>` in the workspace root; returns only on failure.
fn exec_cargo(args: &[&str]) -> String {
    let cargo = host::cargo();
    let error = Command::new(&cargo)
        .args(args)
        .current_dir(host::workspace_root())
        .exec();
    format!("cannot run {}: {error}", cargo.to_string_lossy())
}
