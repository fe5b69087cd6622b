//! The container image, for real: built from the repository's `Containerfile` with the engine
//! that answers on this machine (podman or docker), run as a platform would run it (its own
//! non-root user, a read-only root filesystem, no capabilities, the config mounted read-only),
//! then a v1 call through it to a backend on the host, its metrics, and `stop` (SIGTERM): the
//! request in flight finishes, readiness says it is draining, and the gateway exits 0 by
//! itself once drained.
//!
//! No registry is needed: the two bases are made here, once per machine, from Debian's own
//! packages (`debootstrap --variant=minbase bookworm`): a builder (the minbase, a shell to run
//! the builder stage's step) and a runtime made like distroless cc (glibc, libgcc, libstdc++,
//! tzdata and a passwd naming uid 65532, unpacked from the same `.deb`s; no shell). The
//! builder stage takes the gateway this test suite built (`PREBUILT`), so nothing is compiled
//! in the container. A machine where no engine runs containers fails here, naming what to
//! install: `cargo xtask deps test` installs podman.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The bases this test makes, in the engine's image store (kept between runs: made once).
const BUILDER_BASE: &str = "localhost/agent-gateway-test/builder:bookworm";
const RUNTIME_BASE: &str = "localhost/agent-gateway-test/runtime:bookworm";
/// The Debian packages of the runtime base: what distroless cc-debian12 is made of, but for
/// its CA bundle (copied from this machine) and the OpenSSL the gateway does not link.
const RUNTIME_PACKAGES: [&str; 6] = [
    "base-files",
    "gcc-12-base",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "tzdata",
];
/// Where the image reads its config (the Containerfile's `CMD`).
const CONFIG_DIR: &str = "/etc/agent-gateway";
/// The user the image runs as (the Containerfile's `USER`, distroless' `nonroot`).
const NON_ROOT: &str = "65532:65532";

/// A container engine that answers: its program, the global arguments it needs here, and
/// those its `build` takes.
struct Engine {
    program: &'static str,
    global: Vec<&'static str>,
    build: Vec<&'static str>,
}

impl Engine {
    /// The first of podman and docker whose `info` succeeds (a `docker` client with no daemon
    /// does not count); fails the test when neither does.
    fn answering() -> Engine {
        let answers = |program: &str| {
            Command::new(program)
                .arg("info")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if answers("podman") {
            // runc: crun, podman's first choice, cannot run containers on some VMs' cgroups.
            return Engine {
                program: "podman",
                global: vec!["--runtime", "runc"],
                // No image kept of the builder stage (the size of the binary each run).
                build: vec!["--layers=false"],
            };
        }
        if answers("docker") {
            return Engine {
                program: "docker",
                global: vec![],
                build: vec![],
            };
        }
        panic!(
            "no container engine answers here (`podman info` and `docker info` both fail): this \
             test builds and runs the image for real. Install podman and runc (`cargo xtask deps \
             test` does, as root on Debian), or start a Docker daemon."
        )
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.program);
        c.args(&self.global);
        c
    }

    /// Runs `args`; their output, or the test fails with it.
    fn run<S: AsRef<std::ffi::OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Output {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.command().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{} {args:?}: {}\n{}{}",
            self.program,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs `args` for what it does, whatever comes of it: removing what may not be there.
    fn try_run(&self, args: &[&str]) {
        let _ = self.command().args(args).output();
    }

    fn has_image(&self, name: &str) -> bool {
        self.command()
            .args(["image", "inspect", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Imports the directory `root` as the image `name` (`tar | <engine> import`).
    fn import(&self, root: &Path, name: &str) {
        let mut tar = Command::new("tar")
            .args(["-C"])
            .arg(root)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let status = self
            .command()
            .args(["import", "-", name])
            .stdin(tar.stdout.take().unwrap())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(
            tar.wait().unwrap().success() && status.success(),
            "import {name}"
        );
    }

    /// What `inspect --format FORMAT` says of `object` (an image or a container).
    fn inspect(&self, object: &str, format: &str) -> String {
        let out = self.run(["inspect", "--format", format, object]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn run_ok(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes the builder and runtime bases from Debian's packages, unless the engine has them.
fn make_bases(engine: &Engine) {
    if engine.has_image(BUILDER_BASE) && engine.has_image(RUNTIME_BASE) {
        return;
    }
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let minbase = scratch.path().join("minbase");
    run_ok(
        Command::new(which("debootstrap"))
            .args(["--variant=minbase", "bookworm"])
            .arg(&minbase),
    );
    engine.import(&minbase, BUILDER_BASE);

    // The runtime: the packages' files, as distroless unpacks them (no maintainer scripts).
    let runtime = scratch.path().join("runtime");
    let debs = minbase.join("var/cache/apt/archives");
    let archives: Vec<PathBuf> = std::fs::read_dir(&debs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for package in RUNTIME_PACKAGES {
        let prefix = format!("{package}_");
        let deb = archives
            .iter()
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .unwrap_or_else(|| panic!("debootstrap left no {package} .deb in {}", debs.display()));
        run_ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&runtime));
    }
    let etc = runtime.join("etc");
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(etc.join("group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
    std::fs::create_dir_all(etc.join("ssl/certs")).unwrap();
    std::fs::copy(
        "/etc/ssl/certs/ca-certificates.crt",
        etc.join("ssl/certs/ca-certificates.crt"),
    )
    .unwrap();
    for dir in ["tmp", "home/nonroot"] {
        std::fs::create_dir_all(runtime.join(dir)).unwrap();
    }
    std::fs::set_permissions(runtime.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    engine.import(&runtime, RUNTIME_BASE);
}

/// A build of the image from the repository's Containerfile; removed when dropped.
struct Image<'e> {
    engine: &'e Engine,
    name: String,
}

impl<'e> Image<'e> {
    /// Builds it on the local bases, its builder stage taking this suite's gateway binary
    /// (its debug info stripped: the debug build's is 200 MB of it).
    fn build(engine: &'e Engine) -> Image<'e> {
        make_bases(engine);
        let context = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        run_ok(
            Command::new("strip")
                .args(["--strip-debug", "-o"])
                .arg(context.path().join("agent-gateway"))
                .arg(BIN),
        );
        let name = format!("localhost/agent-gateway-test:{}", std::process::id());
        let build_args = [
            format!("RUST_IMAGE={BUILDER_BASE}"),
            format!("RUNTIME_IMAGE={RUNTIME_BASE}"),
            "PREBUILT=agent-gateway".to_string(),
            format!("VERSION={}", env!("CARGO_PKG_VERSION")),
            "REVISION=test-revision".to_string(),
            "SOURCE=https://example.org/agent-gateway".to_string(),
        ];
        let mut args: Vec<String> = vec!["build".into()];
        args.extend(engine.build.iter().map(|a| a.to_string()));
        args.extend(["-f".into(), format!("{ROOT}/Containerfile")]);
        for arg in build_args {
            args.extend(["--build-arg".into(), arg]);
        }
        args.extend(["-t".into(), name.clone()]);
        args.push(context.path().display().to_string());
        engine.run(args);
        Image { engine, name }
    }
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        self.engine.try_run(&["rmi", "-f", &self.name]);
    }
}

/// A running container of an image; removed when dropped.
struct Container<'e> {
    engine: &'e Engine,
    name: String,
}

impl<'e> Container<'e> {
    /// Runs `image` as a platform would: its own user, a read-only root filesystem with
    /// `/tmp` a tmpfs (Kubernetes: an emptyDir; not the upgrade socket's), no capabilities, no
    /// privilege escalation, `config_dir` mounted read-only where the image reads its config.
    /// Host networking: the gateway reaches the backend, and the test the gateway, on
    /// loopback.
    fn run(image: &Image<'e>, config_dir: &Path) -> Container<'e> {
        let name = format!("agent-gateway-test-{}", std::process::id());
        let engine = image.engine;
        engine.try_run(&["rm", "-f", &name]);
        let mount = format!("{}:{CONFIG_DIR}:ro", config_dir.display());
        engine.run([
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            // Explicit and modest: podman's defaults can exceed what a machine lets it set
            // (refused on some VMs). Plenty for this test.
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
            "--volume",
            &mount,
            &image.name,
        ]);
        Container { engine, name }
    }

    fn logs(&self) -> String {
        let out = self
            .engine
            .command()
            .args(["logs", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Where the gateway listens, from its `listening` log line.
    fn listening(&self) -> (SocketAddr, SocketAddr) {
        let at = common::process::poll_until(
            "the gateway in the container to listen",
            || listening_line(&self.logs()),
            Option::is_some,
            |_| format!("container log:\n{}", self.logs()),
        )
        .unwrap();
        (
            at.proxy,
            at.admin.expect("the config has an admin listener"),
        )
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        self.engine.try_run(&["rm", "-f", &self.name]);
    }
}

/// The config the container runs: the harness's, on loopback ports it picks, with a grace
/// period long enough for the test's request in flight, in a directory the container's user
/// may read.
fn config_dir(backend: SocketAddr) -> tempfile::TempDir {
    let mut cfg = test_config(&[backend]);
    cfg.server.grace_period_seconds = 30;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(cfg.to_toml().as_bytes())
        .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    dir
}

#[test]
fn the_image_runs_read_only_as_non_root_serves_v1_and_drains_on_stop() {
    let engine = Engine::answering();
    let image = Image::build(&engine);

    // What the image is, as a registry or `docker inspect` shows it.
    let label = |key: &str| {
        engine.inspect(
            &image.name,
            &format!("{{{{index .Config.Labels \"org.opencontainers.image.{key}\"}}}}"),
        )
    };
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(label("revision"), "test-revision");
    assert_eq!(label("source"), "https://example.org/agent-gateway");
    assert_eq!(engine.inspect(&image.name, "{{.Config.User}}"), NON_ROOT);
    assert_eq!(
        engine.inspect(&image.name, "{{json .Config.Entrypoint}}"),
        r#"["/usr/local/bin/agent-gateway"]"#
    );
    assert_eq!(
        engine.inspect(&image.name, "{{json .Config.Cmd}}"),
        format!(r#"["run","--config","{CONFIG_DIR}/gateway.toml"]"#)
    );

    // A backend on the host; the status of transaction `slow` is held until the gate opens.
    let gate = Gate::new();
    let held = gate.clone();
    let backend = Backend::with(move |r| {
        let body = format!(
            r#"{{"status_code":200,"message_code":0,"seen":"{}"}}"#,
            r.target
        );
        if r.target.contains("/slow/") {
            Action::AfterGate(held.clone(), body)
        } else {
            Action::Json(body)
        }
    });
    let config = config_dir(backend.addr);
    let container = Container::run(&image, config.path());
    let (proxy, admin) = container.listening();
    wait_until("/readyz 200", || admin_get(admin, "/readyz").status == 200);

    // A v1 call goes through, rewritten to v2, and is counted.
    let answer = post(proxy, VERIFY_V1, BODY);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(backend.last().target, "/api/v2/verify/ORG_DEFAULT/request");
    // Counted as the request's record is written, which may be just after its answer.
    let series = "agent_gateway_requests_total{api_version=\"v1\",code=\"200\",operation=\"verify_request\"}";
    common::process::poll_until(
        series,
        || admin_get(admin, "/metrics"),
        |metrics| metrics.status == 200 && metric_value(&metrics.text(), series) == Some(1.0),
        |metrics| metrics.text(),
    );

    // A request in flight when the engine stops the container (SIGTERM)...
    let slow = std::thread::spawn(move || get(proxy, "/api/v1/transaction/slow/status"));
    wait_until("the slow request to reach the backend", || {
        backend.count() == 2
    });
    let mut stop = engine
        .command()
        .args(["stop", "--time", "60", &container.name])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // ...stops the listener taking connections; readiness says why, while the request runs.
    wait_until("the proxy listener to close", || {
        TcpStream::connect(proxy).is_err()
    });
    let ready = admin_get(admin, "/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["reason"], "draining");
    assert!(
        stop.try_wait().unwrap().is_none(),
        "stopped before the drain"
    );

    // ...and finishes; then the gateway exits by itself, 0, not killed at the engine's limit.
    gate.open();
    let answer = slow.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(stop.wait().unwrap().success());
    assert_eq!(
        engine.inspect(&container.name, "{{.State.ExitCode}}"),
        "0",
        "{}",
        container.logs()
    );
    let logs = container.logs();
    let drained = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "drained")
        .unwrap_or_else(|| panic!("no `drained` line:\n{logs}"));
    assert_eq!(drained["in_flight"], 0, "{logs}");
}
