//! The docs a newcomer reads hold: every relative link in README.md, CHANGELOG.md and docs/
//! reaches a file and, with `#anchor`, a heading of it; every command in a `sh` block is
//! known (an `agent-gateway` command uses only subcommands and flags the binary has, a
//! `cargo xtask` command is one the xtask runs, a script exists), every key of the config
//! file has its row in docs/configuration.md, and the limits the docs quote are the code's.
//! The README's tour is run against the demo in tests/demo.rs.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_gateway::config::schema::{Schema, MS_SUFFIX};
use agent_gateway::proxy::MAX_FAILED_AUTH_ADDRESSES;
use common::cli;
use common::markdown::commands;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md, CHANGELOG.md and every page of docs/, by path from the root, with their text.
fn pages() -> BTreeMap<PathBuf, String> {
    let mut pages = BTreeMap::new();
    for name in ["README.md", "CHANGELOG.md"] {
        pages.insert(name.into(), read(Path::new(name)));
    }
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let rel = path.strip_prefix(ROOT).unwrap().to_path_buf();
            pages.insert(rel.clone(), read(&rel));
        }
    }
    pages
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap()
}

/// The text outside fenced code blocks, line by line.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors of a page's headings, as GitHub makes them.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    prose(text)
        .into_iter()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            let slug: String = h
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            let n = seen.entry(slug.clone()).or_default();
            let anchor = if *n == 0 {
                slug.clone()
            } else {
                format!("{slug}-{n}")
            };
            *n += 1;
            anchor
        })
        .collect()
}

/// The targets of a page's markdown links (`[text](target)`), outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_link_reaches_a_file_and_every_anchor_a_heading() {
    let pages = pages();
    let mut broken = Vec::new();
    for (page, text) in &pages {
        for link in links(text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                normalize(&page.parent().unwrap().join(file))
            };
            if !Path::new(ROOT).join(&target).exists() {
                broken.push(format!(
                    "{}: {link}: no file {}",
                    page.display(),
                    target.display()
                ));
                continue;
            }
            if !anchor.is_empty() {
                let text = pages.get(&target).cloned().unwrap_or_else(|| read(&target));
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {link}: no heading #{anchor}", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The subcommands and long flags `agent-gateway <path> --help` lists.
fn help_of(path: &[&str]) -> String {
    let out = cli(path.iter().copied().chain(["--help"]));
    assert!(out.status.success(), "agent-gateway {path:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// What is wrong with an `agent-gateway` command line (`words` after the program), if anything.
fn check_agent_gateway(words: &[&str]) -> Option<String> {
    let mut path: Vec<&str> = Vec::new();
    let mut help = help_of(&path);
    let mut a_value_is_next = false;
    for word in words {
        if std::mem::take(&mut a_value_is_next) {
            continue;
        }
        if let Some(flag) = word.strip_prefix("--") {
            let (flag, value) = match flag.split_once('=') {
                Some((flag, _)) => (flag, true),
                None => (flag, false),
            };
            if !help.contains(&format!("--{flag} ")) && !help.contains(&format!("--{flag}\n")) {
                return Some(format!("no --{flag} in `agent-gateway {}`", path.join(" ")));
            }
            a_value_is_next = !value && takes_value(&help, &format!("--{flag}"));
        } else if word.starts_with('-') {
            a_value_is_next = takes_value(&help, word);
        } else if help.contains("\nCommands:") {
            let listed = help
                .lines()
                .any(|l| l.split_whitespace().next() == Some(*word));
            if !listed {
                return Some(format!(
                    "no command {word} in `agent-gateway {}`",
                    path.join(" ")
                ));
            }
            path.push(word);
            help = help_of(&path);
        }
    }
    None
}

/// Whether `option` (`--flag` or `-f`) takes a value in `help`: its line names one
/// (`-H, --header <NAME: VALUE>`), so the next word is that value, not a command.
fn takes_value(help: &str, option: &str) -> bool {
    help.lines().any(|line| {
        let spec = line.trim_start().split("  ").next().unwrap_or("");
        spec.contains('<') && spec.split([',', ' ']).any(|part| part == option)
    })
}

/// Splits a command line into words as `sh` would, for the quoting the docs use.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    for c in command.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ' ') => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            (_, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[test]
fn every_command_in_the_docs_is_one_that_exists() {
    let xtask = read(Path::new("xtask/src/main.rs"));
    let mut wrong = Vec::new();
    for (page, text) in pages() {
        for command in commands(&text) {
            // Each command of a pipeline or an `&&` list on its own.
            for part in command.split(" | ").flat_map(|c| c.split(" && ")) {
                let words = words(part);
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                let problem = match words.as_slice() {
                    ["agent-gateway" | "target/release/agent-gateway", rest @ ..]
                    | ["cargo", "run", "--", rest @ ..] => check_agent_gateway(rest),
                    ["printf", ..] | ["grep", ..] | ["curl", ..] | ["openssl", "rand", ..] => None,
                    ["cargo", "xtask", task, ..] => (!xtask.contains(&format!("\"{task}\"")))
                        .then(|| format!("no xtask {task}")),
                    ["cargo", "build" | "test" | "bench" | "fuzz", ..]
                    | ["cargo", "+nightly", "fuzz", ..] => None,
                    ["bash", script, ..] => (!Path::new(ROOT).join(script).exists())
                        .then(|| format!("no script {script}")),
                    ["kubectl", "apply", "-k", dir] => (!Path::new(ROOT).join(dir).is_dir())
                        .then(|| format!("no kustomization {dir}")),
                    // The image's own commands: tests/container.rs builds and runs it.
                    ["podman" | "docker", "build" | "tag" | "push" | "run", ..] => None,
                    ["kustomize", "edit", "set", "image", _] => None,
                    ["mkdir" | "cd" | "sed", ..] => None,
                    // A copy out of the repository (written from a directory beside its root).
                    ["cp", from, _] => {
                        let from = from.trim_start_matches("../").trim_end_matches("/*");
                        (!Path::new(ROOT).join(from).exists()).then(|| format!("no {from} to copy"))
                    }
                    _ => Some("a command this test does not know: teach it".to_owned()),
                };
                if let Some(problem) = problem {
                    wrong.push(format!("{}: `{part}`: {problem}", page.display()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checker_of_commands_can_fail() {
    assert!(check_agent_gateway(&["check-config", "--config", "f"]).is_none());
    assert!(check_agent_gateway(&["config", "dump", "--json"]).is_none());
    assert!(check_agent_gateway(&["check-config", "--no-such-flag"]).is_some());
    assert!(check_agent_gateway(&["no-such-command"]).is_some());
    let text = "```sh\n$ agent-gateway a \\\n  --b  # c\nOUT\n```\n```sh\nx 'y z'\n```\n";
    assert_eq!(commands(text), ["agent-gateway a --b", "x 'y z'"]);
    assert_eq!(words("x 'y z' \"w\""), ["x", "y z", "w"]);
}

#[test]
fn every_config_key_has_its_row_in_configuration_md() {
    let doc = read(Path::new("docs/configuration.md"));
    let missing: Vec<String> = Schema::file()
        .every_key()
        .into_iter()
        .filter(|k| {
            // A row names the key in backticks, alone or beside its pair (`a` / `b`).
            let last = k.rsplit(['.', ']']).next().unwrap();
            let table = &k[..k.len() - last.len()];
            !doc.contains(&format!("`{k}`"))
                && !doc.contains(&format!("`{table}{last}`"))
                && !doc.contains(&format!("/ `{last}`"))
        })
        .collect();
    assert!(missing.is_empty(), "keys without a row: {missing:?}");
    assert!(
        doc.contains(&format!("`{MS_SUFFIX}`")),
        "the duration siblings of the {MS_SUFFIX} keys are explained"
    );
}

/// The number of client addresses the failed-auth throttle keeps, as the pages that quote
/// it write it (`100,000`).
#[test]
fn the_docs_quote_the_throttles_table_size_as_the_code_has_it() {
    let digits = MAX_FAILED_AUTH_ADDRESSES.to_string();
    let mut grouped = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(d);
    }
    for page in ["docs/configuration.md", "docs/runbooks.md"] {
        assert!(
            read(Path::new(page)).contains(&grouped),
            "{page} should say the throttle keeps {grouped} addresses"
        );
    }
}

#[test]
fn every_alert_links_its_runbook_section_and_every_section_is_an_alert_s() {
    let rules: serde_json::Value =
        serde_norway::from_str(&read(Path::new("config/prometheus/alerts.yml"))).unwrap();
    let runbooks = read(Path::new("docs/runbooks.md"));
    let anchors = anchors(&runbooks);
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            let url = rule["annotations"]["runbook_url"].as_str();
            let want = format!("docs/runbooks.md#{}", name.to_lowercase());
            assert_eq!(url, Some(want.as_str()), "{name}'s runbook_url");
            assert!(
                anchors.contains(&name.to_lowercase()),
                "no section for {name}"
            );
            alerts.push(name.to_owned());
        }
    }
    // Each alert's section, as `## Name`, says the same four things in order.
    let sections: Vec<&str> = runbooks.split("\n## ").skip(1).collect();
    let titles: Vec<&str> = sections.iter().map(|s| s.lines().next().unwrap()).collect();
    assert_eq!(
        titles, alerts,
        "one section per alert, in the order of alerts.yml"
    );
    for section in sections {
        let parts: Vec<Option<usize>> = ["**Means**", "**Confirm**", "**Do**", "**Escalate**"]
            .iter()
            .map(|p| section.find(p))
            .collect();
        assert!(
            parts.iter().all(Option::is_some) && parts.is_sorted(),
            "{}: Means, Confirm, Do, Escalate",
            section.lines().next().unwrap()
        );
    }
}
