//! `cargo xtask`: parses the command, makes sure the machine has what the task needs, then
//! hands over to cargo (`exec`, so signals and the exit code are cargo's own).

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use xtask::host;
use xtask::packages::{self, Plan, Task};

const USAGE: &str = "\
usage: cargo xtask <command> [ARGS]

  demo [ARGS]        install what the demo needs, then `cargo run -- demo ARGS`
  test [ARGS]        install what the tests need, then `cargo test --workspace --all-targets`
                     (ARGS, when given, go to `cargo test` instead of those two flags)
  deps [demo|test]   only install what the demo or (by default) the tests need

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

/// Replaces this process with `cargo <args>` in the workspace root; returns only on failure.
fn exec_cargo(args: &[&str]) -> String {
    let cargo = host::cargo();
    let error = Command::new(&cargo)
        .args(args)
        .current_dir(host::workspace_root())
        .exec();
    format!("cannot run {}: {error}", cargo.to_string_lossy())
}
