//! The system packages the project needs, in one table, and the pure decision of what to do
//! about the missing ones: nothing, `apt-get install`, or stop and print the command to run.

/// What a package is needed for. The tests build the gateway and run the demo's commands
/// (tests/demo.rs), so they need everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any build of the gateway (`cargo xtask demo`, `cargo run`, `cargo build`).
    Build,
    /// The commands the demo prints to try.
    Demo,
    /// The test suite (`cargo xtask test`).
    Tests,
}

/// A task of the xtask, and so a set of [`Need`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Demo,
    Test,
}

impl Task {
    /// Whether this task needs the packages needed for `need`.
    pub fn needs(self, need: Need) -> bool {
        match self {
            Task::Demo => need != Need::Tests,
            Task::Test => true,
        }
    }

    pub fn parse(name: &str) -> Option<Task> {
        match name {
            "demo" => Some(Task::Demo),
            "test" => Some(Task::Test),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Task::Demo => "demo",
            Task::Test => "test",
        }
    }
}

/// How to tell that a package is there, whatever installed it (Debian, pyenv, by hand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Each of these programs is on `PATH`.
    Programs(&'static [&'static str]),
    /// This command (program and arguments) runs and exits 0.
    Succeeds(&'static [&'static str]),
}

/// One system package of [`PACKAGES`].
#[derive(Debug)]
pub struct SystemPackage {
    /// Debian's name for it: what `apt-get install` gets.
    pub debian: &'static str,
    pub probe: Probe,
    pub need: Need,
    /// Why the project needs it.
    pub why: &'static str,
}

/// Every system package the project needs: a new one is one row. Not here: the C compiler
/// and linker (`cc`), which rustc needs to link the xtask itself.
pub static PACKAGES: &[SystemPackage] = &[
    SystemPackage {
        debian: "make",
        probe: Probe::Programs(&["make"]),
        need: Need::Build,
        why: "cmake's build tool for zlib-ng",
    },
    SystemPackage {
        debian: "cmake",
        probe: Probe::Programs(&["cmake"]),
        need: Need::Build,
        why: "pingora's zlib-ng build",
    },
    SystemPackage {
        debian: "curl",
        probe: Probe::Programs(&["curl"]),
        need: Need::Demo,
        why: "the demo's commands to try (tests/demo.rs runs them)",
    },
    SystemPackage {
        debian: "prometheus",
        probe: Probe::Programs(&["prometheus", "promtool"]),
        need: Need::Tests,
        why: "promtool and Prometheus check the alerts and the dashboard",
    },
    SystemPackage {
        debian: "redis-server",
        probe: Probe::Programs(&["redis-server"]),
        need: Need::Tests,
        why: "tests against a real Redis",
    },
    SystemPackage {
        debian: "dnsmasq-base",
        probe: Probe::Programs(&["dnsmasq"]),
        need: Need::Tests,
        why: "a DNS server whose answers tests change (tests/backend.rs)",
    },
    SystemPackage {
        debian: "nghttp2-client",
        probe: Probe::Programs(&["h2load"]),
        need: Need::Tests,
        why: "h2load, HTTP/2 load in tests",
    },
    SystemPackage {
        debian: "chromium",
        probe: Probe::Programs(&["chromium"]),
        need: Need::Tests,
        why: "browser tests, headless",
    },
    // tests/container.rs builds and runs the image. podman needs no daemon; runc because crun,
    // which podman would otherwise pick, cannot run containers on some VMs' cgroups; the
    // image's bases are made with debootstrap where no registry can be reached.
    SystemPackage {
        debian: "podman",
        probe: Probe::Programs(&["podman"]),
        need: Need::Tests,
        why: "builds and runs the container image (tests/container.rs)",
    },
    SystemPackage {
        debian: "runc",
        probe: Probe::Programs(&["runc"]),
        need: Need::Tests,
        why: "the OCI runtime podman runs the image with",
    },
    SystemPackage {
        debian: "debootstrap",
        probe: Probe::Programs(&["debootstrap"]),
        need: Need::Tests,
        why: "makes the image's base images from Debian's packages, with no registry",
    },
    // The tests build their pinned virtualenv themselves (tests/common/python.rs); what a
    // machine can lack for that is `venv`'s ensurepip, which Debian ships apart from python3.
    SystemPackage {
        debian: "python3-venv",
        probe: Probe::Succeeds(&["python3", "-m", "ensurepip", "--version"]),
        need: Need::Tests,
        why: "the tests' pinned virtualenv (python3 -m venv)",
    },
];

/// Looks a package up by its Debian name.
pub fn by_name(debian: &str) -> Option<&'static SystemPackage> {
    PACKAGES.iter().find(|p| p.debian == debian)
}

/// The packages `task` needs that are missing: those whose probe fails, and those named in
/// `assume_missing` (a test override).
pub fn missing(
    task: Task,
    present: impl Fn(&Probe) -> bool,
    assume_missing: &[&str],
) -> Vec<&'static SystemPackage> {
    PACKAGES
        .iter()
        .filter(|p| task.needs(p.need))
        .filter(|p| assume_missing.contains(&p.debian) || !present(&p.probe))
        .collect()
}

/// What the xtask can do on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// Running as root: apt-get can install.
    pub root: bool,
    /// `apt-get` is on `PATH`: a Debian (or Debian-like) system.
    pub apt: bool,
    /// `sudo` is on `PATH`: the command printed for a non-root user uses it.
    pub sudo: bool,
}

/// What to do before running the task.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is missing.
    Ready,
    /// Run `apt-get update`, then `apt-get install` with these arguments.
    Install(Vec<String>),
    /// The xtask cannot install: print this and stop, before anything is built.
    Stop(String),
}

/// The `apt-get install` arguments for `missing`.
pub fn install_args(missing: &[&SystemPackage]) -> Vec<String> {
    let options = ["install", "-y", "--no-install-recommends"];
    let names = missing.iter().map(|p| p.debian);
    options.into_iter().chain(names).map(String::from).collect()
}

/// The whole command line a root user would run.
fn root_command(missing: &[&SystemPackage]) -> String {
    format!(
        "apt-get update && apt-get {}",
        install_args(missing).join(" ")
    )
}

/// Decides what to do about `missing` on `host` before running `task`.
pub fn plan(task: Task, missing: &[&SystemPackage], host: Host) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    if host.root && host.apt {
        return Plan::Install(install_args(missing));
    }
    let mut text = format!(
        "cargo xtask: `cargo xtask {}` needs system packages this machine lacks:\n",
        task.name()
    );
    for p in missing {
        let looked_for = probe_text(&p.probe);
        text.push_str(&format!(
            "  {:<15} {} (looked for {looked_for})\n",
            p.debian, p.why
        ));
    }
    let command = root_command(missing);
    let run = if !host.apt {
        text.push_str(
            "There is no apt-get here: install what gives those programs with this system's \
             package manager. On Debian, as root:\n",
        );
        command
    } else if host.sudo {
        text.push_str("Installing them needs root. Run:\n");
        format!("sudo sh -c '{command}'")
    } else {
        text.push_str("Installing them needs root. Run:\n");
        format!("su -c '{command}'")
    };
    text.push_str(&format!(
        "\n    {run}\n\nthen `cargo xtask {}` again. Nothing was built.\n",
        task.name()
    ));
    Plan::Stop(text)
}

/// What a probe looks for, as the message names it.
fn probe_text(probe: &Probe) -> String {
    match probe {
        Probe::Programs(programs) => programs.join(" and "),
        Probe::Succeeds(command) => format!("`{}`", command.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_DEBIAN: Host = Host {
        root: true,
        apt: true,
        sudo: false,
    };

    fn names(packages: &[&SystemPackage]) -> Vec<&'static str> {
        packages.iter().map(|p| p.debian).collect()
    }

    #[test]
    fn the_demo_needs_a_build_and_curl_and_the_tests_need_everything() {
        let demo = missing(Task::Demo, |_| false, &[]);
        assert_eq!(names(&demo), ["make", "cmake", "curl"]);
        let test = missing(Task::Test, |_| false, &[]);
        assert_eq!(test.len(), PACKAGES.len());
    }

    #[test]
    fn present_packages_are_not_missing_unless_assumed_missing() {
        assert!(missing(Task::Test, |_| true, &[]).is_empty());
        let assumed = missing(Task::Test, |_| true, &["prometheus", "cmake"]);
        assert_eq!(names(&assumed), ["cmake", "prometheus"], "table order");
        // A test package assumed missing does not concern the demo.
        assert!(missing(Task::Demo, |_| true, &["prometheus"]).is_empty());
    }

    #[test]
    fn a_package_is_missing_when_its_own_probe_fails() {
        let no_promtool = |probe: &Probe| *probe != by_name("prometheus").unwrap().probe;
        assert_eq!(
            names(&missing(Task::Test, no_promtool, &[])),
            ["prometheus"]
        );
    }

    #[test]
    fn nothing_missing_is_ready_wherever_it_runs() {
        for (root, apt, sudo) in [(true, true, true), (false, false, false)] {
            assert_eq!(plan(Task::Test, &[], Host { root, apt, sudo }), Plan::Ready);
        }
    }

    #[test]
    fn root_on_debian_installs_exactly_the_missing_packages() {
        let missing = [by_name("cmake").unwrap(), by_name("redis-server").unwrap()];
        assert_eq!(
            plan(Task::Test, &missing, ROOT_DEBIAN),
            Plan::Install(
                [
                    "install",
                    "-y",
                    "--no-install-recommends",
                    "cmake",
                    "redis-server"
                ]
                .map(String::from)
                .to_vec()
            )
        );
    }

    #[test]
    fn a_user_on_debian_is_given_the_exact_command_with_sudo_or_su() {
        let missing = [by_name("cmake").unwrap()];
        let with_sudo = Host {
            root: false,
            apt: true,
            sudo: true,
        };
        let Plan::Stop(text) = plan(Task::Demo, &missing, with_sudo) else {
            panic!("a user cannot install");
        };
        assert!(text.contains("`cargo xtask demo`"), "{text}");
        assert!(
            text.contains("  cmake           pingora's zlib-ng build (looked for cmake)\n"),
            "{text}"
        );
        assert!(text.contains("Nothing was built"), "{text}");
        assert!(
            text.contains(
                "sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends cmake'"
            ),
            "{text}"
        );
        let Plan::Stop(text) = plan(
            Task::Demo,
            &missing,
            Host {
                sudo: false,
                ..with_sudo
            },
        ) else {
            panic!("a user cannot install");
        };
        assert!(
            text.contains(
                "su -c 'apt-get update && apt-get install -y --no-install-recommends cmake'"
            ),
            "{text}"
        );
    }

    #[test]
    fn without_apt_get_even_root_is_told_what_to_install() {
        let missing = [
            by_name("nghttp2-client").unwrap(),
            by_name("python3-venv").unwrap(),
        ];
        let Plan::Stop(text) = plan(
            Task::Test,
            &missing,
            Host {
                apt: false,
                ..ROOT_DEBIAN
            },
        ) else {
            panic!("no apt-get: nothing to install with");
        };
        assert!(text.contains("There is no apt-get here"), "{text}");
        assert!(text.contains("h2load"), "names the program: {text}");
        assert!(text.contains("`python3 -m ensurepip --version`"), "{text}");
        assert!(
            text.contains(
                "apt-get update && apt-get install -y --no-install-recommends nghttp2-client python3-venv"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_table_names_each_package_once_and_every_probe_looks_for_something() {
        for (i, p) in PACKAGES.iter().enumerate() {
            assert_eq!(
                by_name(p.debian).map(|q| q as *const _),
                Some(&PACKAGES[i] as *const _)
            );
            match p.probe {
                Probe::Programs(programs) => assert!(!programs.is_empty(), "{}", p.debian),
                Probe::Succeeds(command) => assert!(!command.is_empty(), "{}", p.debian),
            }
            assert!(!p.why.is_empty(), "{}", p.debian);
        }
    }
}
