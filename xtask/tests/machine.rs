//! The xtask binary on a made-up machine: a `PATH` of stand-in programs (the packages'
//! programs, `apt-get`, `sudo`) and a stand-in `cargo` (through `CARGO`), each writing what it
//! was asked to a log. Root runs as the test's user when that is root, else as root of a user
//! namespace (`unshare --map-root-user`); the user runs as `nobody` (`setpriv`) when the test
//! is root, from a copy of the binary in the made-up machine (the checkout may be out of its
//! reach), so only where it stops before running cargo in the workspace. Nothing on the real
//! machine is installed or built.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xtask::packages::{Probe, PACKAGES};

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

/// The programs whose presence tells that `debian` is installed.
fn programs_of(debian: &str) -> Vec<&'static str> {
    let package = xtask::packages::by_name(debian).expect("a package of the table");
    match package.probe {
        Probe::Programs(programs) => programs.to_vec(),
        // The stand-in runs any command and exits 0, so its program is enough.
        Probe::Succeeds(command) => vec![command[0]],
    }
}

/// A made-up machine in a temporary directory: `bin/` is the whole `PATH`, `log` what the
/// stand-ins were asked.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    /// A machine with every package of the table but `lacking`, and apt-get unless `apt` is
    /// false. Its apt-get "installs" a package by adding its programs to `bin/`, unless
    /// `apt_installs` is false.
    fn new(lacking: &[&str], apt: bool, apt_installs: bool) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let machine = Machine { dir };
        std::fs::create_dir(machine.bin()).unwrap();
        // Open to `nobody` too, so what a stand-in does as that user is logged.
        for path in [machine.dir.path(), &machine.bin()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        std::fs::write(machine.log(), "").unwrap();
        std::fs::set_permissions(machine.log(), std::fs::Permissions::from_mode(0o666)).unwrap();
        for package in PACKAGES.iter().filter(|p| !lacking.contains(&p.debian)) {
            for program in programs_of(package.debian) {
                machine.stand_in(program, "exit 0");
            }
        }
        if apt {
            // Then apt-get's own output, which must not reach the xtask's stdout.
            let mut script = String::from(
                "echo \"apt-get $* (DEBIAN_FRONTEND=$DEBIAN_FRONTEND)\" >> \"$LOG\"\n\
                 echo Reading package lists...\n",
            );
            if apt_installs {
                script.push_str("for name in \"$@\"; do\n  case \"$name\" in\n");
                for package in PACKAGES {
                    script.push_str(&format!("    {})", package.debian));
                    for program in programs_of(package.debian) {
                        script.push_str(&format!(
                            " printf '#!/bin/sh\\nexit 0\\n' > \"$BIN/{program}\"; /bin/chmod +x \"$BIN/{program}\";"
                        ));
                    }
                    script.push_str(" ;;\n");
                }
                script.push_str("  esac\ndone\n");
            }
            machine.stand_in("apt-get", &script);
        }
        machine
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn cargo(&self) -> PathBuf {
        self.dir.path().join("cargo")
    }

    /// An executable `bin/<program>` running `body` (with `$LOG` and `$BIN` set).
    fn stand_in(&self, program: &str, body: &str) {
        write_script(&self.bin().join(program), body);
    }

    /// `xtask <args>` on this machine, as `user`, with `env` added.
    fn run(&self, user: User, args: &[&str], env: &[(&str, &str)]) -> Output {
        write_script(&self.cargo(), "echo \"cargo $* (in $PWD)\" >> \"$LOG\"");
        // `unshare` and `setpriv` are found on the test's PATH; the xtask gets the made-up one.
        let mut command = match (user, running_as_root()) {
            (User::Root, true) | (User::Nobody, false) => Command::new(XTASK),
            (User::Root, false) => {
                let mut c = Command::new(which("unshare"));
                c.args(["--map-root-user", XTASK]);
                c
            }
            (User::Nobody, true) => {
                let copy = self.dir.path().join("xtask");
                std::fs::copy(XTASK, &copy).unwrap();
                let mut c = Command::new(which("setpriv"));
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
                c.arg(copy);
                c
            }
        };
        command
            .args(args)
            .env_clear()
            .env("PATH", self.bin())
            .env("CARGO", self.cargo())
            .env("LOG", self.log())
            .env("BIN", self.bin())
            .envs(env.iter().copied());
        command.output().unwrap()
    }

    /// What the stand-ins were asked, one line each.
    fn asked(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }
}

#[derive(Clone, Copy)]
enum User {
    Root,
    Nobody,
}

fn write_script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn running_as_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    out.stdout.trim_ascii() == b"0"
}

/// The absolute path of `program` on the test's own PATH.
fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn workspace_root() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .display()
        .to_string()
}

#[test]
fn with_every_package_there_test_runs_the_whole_suite_in_the_workspace() {
    let machine = Machine::new(&[], true, true);
    let out = machine.run(User::Root, &["test"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        machine.asked(),
        [format!(
            "cargo test --workspace --all-targets (in {})",
            workspace_root()
        )],
        "no apt-get, only cargo"
    );
}

#[test]
fn arguments_go_to_cargo_the_demo_after_demo_and_the_tests_instead_of_the_defaults() {
    let machine = Machine::new(&[], true, true);
    let out = machine.run(User::Root, &["demo", "--config", "x.toml"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = machine.run(User::Root, &["test", "--test", "demo"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let root = workspace_root();
    assert_eq!(
        machine.asked(),
        [
            format!("cargo run -- demo --config x.toml (in {root})"),
            format!("cargo test --test demo (in {root})"),
        ]
    );
}

#[test]
fn as_root_it_installs_only_what_the_task_lacks_then_runs_cargo() {
    // The demo needs only cmake: a missing test package is not its business.
    let machine = Machine::new(&["cmake", "redis-server", "python3-venv"], true, true);
    let out = machine.run(User::Root, &["demo"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // stdout is the demo's own: apt-get speaks on stderr.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(
        stderr(&out).contains("Reading package lists..."),
        "{}",
        stderr(&out)
    );
    let out = machine.run(User::Root, &["test"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lock = "-o DPkg::Lock::Timeout=600";
    let quiet = "(DEBIAN_FRONTEND=noninteractive)";
    let root = workspace_root();
    assert_eq!(
        machine.asked(),
        [
            format!("apt-get {lock} update {quiet}"),
            format!("apt-get {lock} install -y --no-install-recommends cmake {quiet}"),
            format!("cargo run -- demo (in {root})"),
            format!("apt-get {lock} update {quiet}"),
            format!(
                "apt-get {lock} install -y --no-install-recommends redis-server python3-venv {quiet}"
            ),
            format!("cargo test --workspace --all-targets (in {root})"),
        ]
    );
}

#[test]
fn a_user_lacking_a_package_is_given_the_command_and_nothing_is_built() {
    let machine = Machine::new(&["cmake"], true, true);
    machine.stand_in("sudo", "echo \"sudo $*\" >> \"$LOG\"");
    let out = machine.run(User::Nobody, &["demo"], &[]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains(
            "\n    sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends cmake'\n"
        ),
        "{text}"
    );
    assert!(text.contains("then `cargo xtask demo` again"), "{text}");
    assert_eq!(
        machine.asked(),
        Vec::<String>::new(),
        "neither apt-get nor cargo ran"
    );
}

#[test]
fn without_apt_get_even_root_is_told_what_to_install_and_nothing_is_built() {
    let machine = Machine::new(&["nghttp2-client"], false, false);
    let out = machine.run(User::Root, &["test"], &[]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.contains("There is no apt-get here"), "{text}");
    assert!(text.contains("(looked for h2load)"), "{text}");
    assert!(
        text.contains(
            "apt-get update && apt-get install -y --no-install-recommends nghttp2-client"
        ),
        "{text}"
    );
    assert_eq!(machine.asked(), Vec::<String>::new(), "cargo did not run");
}

#[test]
fn a_package_still_missing_after_apt_get_stops_before_building() {
    let machine = Machine::new(&["prometheus"], true, false);
    let out = machine.run(User::Root, &["test"], &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("still missing after apt-get install: prometheus"),
        "{}",
        stderr(&out)
    );
    let asked = machine.asked();
    assert_eq!(asked.len(), 2, "update and install, no cargo: {asked:?}");
    assert!(
        asked.iter().all(|line| line.starts_with("apt-get ")),
        "{asked:?}"
    );
}

#[test]
fn packages_assumed_missing_are_installed_though_present() {
    let machine = Machine::new(&[], true, true);
    let assume = [("XTASK_ASSUME_MISSING", "prometheus, chromium")];
    let out = machine.run(User::Root, &["deps"], &assume);
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = machine.asked();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(
        asked[1].contains("install -y --no-install-recommends prometheus chromium "),
        "{asked:?}"
    );
}

#[test]
fn an_unknown_package_assumed_missing_is_refused_before_anything_runs() {
    let machine = Machine::new(&[], true, true);
    let out = machine.run(User::Root, &["test"], &[("XTASK_ASSUME_MISSING", "cmak")]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no package \"cmak\""),
        "{}",
        stderr(&out)
    );
    assert_eq!(machine.asked(), Vec::<String>::new());
}
