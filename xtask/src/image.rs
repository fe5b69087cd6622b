//! `cargo xtask image`: the container image from the top-level `Containerfile`, built with
//! the engine that answers here (podman or docker), tagged `agent-gateway:<crate version>`
//! and labelled with that version, the git commit and the repository. The decisions (which
//! engine, what to run) are plain functions; `main.rs` runs them.

/// The engines tried, in this order. A `docker` client with no daemon does not answer.
pub const ENGINES: [&str; 2] = ["podman", "docker"];

/// The environment variable that names the engine to use, when both answer or to be sure.
pub const ENGINE_VARIABLE: &str = "CONTAINER_ENGINE";

/// The engine to build with: the one `CONTAINER_ENGINE` names, else the first of [`ENGINES`]
/// whose `info` succeeds (`answers`).
pub fn choose_engine(
    named: Option<&str>,
    answers: impl Fn(&str) -> bool,
) -> Result<String, String> {
    if let Some(engine) = named.filter(|e| !e.is_empty()) {
        return if answers(engine) {
            Ok(engine.to_string())
        } else {
            Err(format!(
                "{ENGINE_VARIABLE}={engine}, but `{engine} info` fails: is it installed, and \
                 its daemon (if it has one) running?"
            ))
        };
    }
    ENGINES
        .iter()
        .find(|e| answers(e))
        .map(|e| e.to_string())
        .ok_or_else(|| {
            "no container engine answers: `podman info` and `docker info` both fail (a docker \
             client without its daemon does not count). Install podman (`apt-get install \
             podman`) or start Docker, then run `cargo xtask image` again."
                .to_string()
        })
}

/// The `version` of the `[package]` of a `Cargo.toml`'s text.
pub fn package_version(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        let Some(value) = line.strip_prefix("version") else {
            continue;
        };
        if in_package {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_string());
        }
    }
    None
}

/// A repository URL fit for a public label: any user name or password taken out.
pub fn public_url(remote: &str) -> String {
    match remote.split_once("://") {
        Some((scheme, rest)) => {
            let host_and_path = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
            format!("{scheme}://{host_and_path}")
        }
        None => remote.to_string(),
    }
}

/// What the image is built from and labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    pub version: String,
    pub revision: String,
    pub source: String,
}

impl Build {
    /// The image's reference: `agent-gateway:<crate version>`.
    pub fn reference(&self) -> String {
        format!("agent-gateway:{}", self.version)
    }

    /// The arguments of `<engine> build`, from the workspace root `root`: the labels' build
    /// arguments, then `extra` (the user's: `--build-arg RUST_IMAGE=...`, `--platform`, ...).
    pub fn arguments(&self, root: &str, extra: &[String]) -> Vec<String> {
        let mut args = vec![
            "build".to_string(),
            "--file".to_string(),
            format!("{root}/Containerfile"),
            "--tag".to_string(),
            self.reference(),
        ];
        for (name, value) in [
            ("VERSION", &self.version),
            ("REVISION", &self.revision),
            ("SOURCE", &self.source),
        ] {
            args.push("--build-arg".to_string());
            args.push(format!("{name}={value}"));
        }
        args.extend(extra.iter().cloned());
        args.push(root.to_string());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_is_the_first_that_answers_or_the_one_named() {
        let only_docker = |e: &str| e == "docker";
        assert_eq!(choose_engine(None, |_| true).unwrap(), "podman");
        assert_eq!(choose_engine(None, only_docker).unwrap(), "docker");
        assert_eq!(choose_engine(Some(""), only_docker).unwrap(), "docker");
        assert_eq!(choose_engine(Some("docker"), |_| true).unwrap(), "docker");
        let named_silent = choose_engine(Some("podman"), only_docker).unwrap_err();
        assert!(
            named_silent.contains("CONTAINER_ENGINE=podman"),
            "{named_silent}"
        );
        let none = choose_engine(None, |_| false).unwrap_err();
        assert!(none.contains("no container engine answers"), "{none}");
    }

    #[test]
    fn the_version_is_the_packages_not_a_dependencys() {
        let manifest = "[package]\nname = \"agent-gateway\"\nversion = \"0.3.1\"\n\n\
                        [dependencies]\nversion_check = \"1\"\n";
        assert_eq!(package_version(manifest).as_deref(), Some("0.3.1"));
        let after = "[workspace]\nmembers = []\n[dependencies.x]\nversion = \"9\"\n\
                     [package]\nversion = \"1.2.3\"\n";
        assert_eq!(package_version(after).as_deref(), Some("1.2.3"));
        assert_eq!(package_version("[dependencies]\nversion = \"1\"\n"), None);
        let workspace = include_str!("../../Cargo.toml");
        assert!(package_version(workspace).is_some_and(|v| !v.is_empty()));
    }

    #[test]
    fn a_remotes_credentials_stay_out_of_the_label() {
        assert_eq!(
            public_url("https://user:secret@git.example/team/agent-gateway.git"),
            "https://git.example/team/agent-gateway.git"
        );
        assert_eq!(
            public_url("https://git.example/agent-gateway"),
            "https://git.example/agent-gateway"
        );
        assert_eq!(
            public_url("git@git.example:team/agent-gateway.git"),
            "git@git.example:team/agent-gateway.git"
        );
    }

    #[test]
    fn the_build_tags_the_version_labels_it_and_passes_the_users_arguments_last() {
        let build = Build {
            version: "0.1.0".into(),
            revision: "abc123".into(),
            source: "https://git.example/agent-gateway".into(),
        };
        assert_eq!(build.reference(), "agent-gateway:0.1.0");
        let extra = [
            "--build-arg".to_string(),
            "RUST_IMAGE=mirror/rust:1".to_string(),
        ];
        assert_eq!(
            build.arguments("/src", &extra),
            [
                "build",
                "--file",
                "/src/Containerfile",
                "--tag",
                "agent-gateway:0.1.0",
                "--build-arg",
                "VERSION=0.1.0",
                "--build-arg",
                "REVISION=abc123",
                "--build-arg",
                "SOURCE=https://git.example/agent-gateway",
                "--build-arg",
                "RUST_IMAGE=mirror/rust:1",
                "/src"
            ]
        );
    }
}
