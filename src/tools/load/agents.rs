//! The agents a run sends as: one, from `--agent-id`/`--token` or `--credentials`, or several
//! from an `--agents` file, each with its weight (its share of the requests) and its own
//! service code for v2 paths. A deployment limits each agent's rate, so a test of the
//! deployment rather than of one agent's limit spreads its requests over several.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::client::redact::REDACTED;
use crate::config::{problem_in_text, BusinessCode};

use super::LoadError;

/// One agent a run sends as, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// Sent as X-Service-Agent-Id.
    pub id: String,
    /// Sent as X-Auth-Token.
    pub token: Token,
    /// The business code of its v2 paths, instead of `--service`.
    pub service: Option<String>,
    /// Its share of the requests, relative to the others'.
    pub weight: u32,
}

/// `--agents FILE` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsFile {
    agents: Vec<AgentEntry>,
}

impl AgentsFile {
    /// The names its keys have (its own and [`AgentEntry`]'s): an error names no other.
    const KEYS: &'static [&'static str] =
        &["agents", "id", "token", "token_file", "service", "weight"];
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentEntry {
    id: String,
    token: Option<Token>,
    /// A file holding the token (a trailing newline is not part of it); relative paths are
    /// from the agents file's directory.
    token_file: Option<PathBuf>,
    service: Option<String>,
    /// Default 1.
    weight: Option<u32>,
}

/// An agent's token, as the command line or a file gives it: its `Debug` print is
/// [`REDACTED`], so that no print of the arguments, an agent or the plan shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

/// A value of another type (a token written unquoted) is refused without the value, which
/// serde's own message repeats (`invalid type: integer 48151623429, ...`); any other error
/// (the token missing) is the deserializer's.
impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Other(serde::de::IgnoredAny),
        }
        match Written::deserialize(d)? {
            Written::Text(token) => Ok(Token(token)),
            Written::Other(_) => Err(serde::de::Error::custom("a token must be a string")),
        }
    }
}

impl Token {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for Token {
    fn from(token: String) -> Token {
        Token(token)
    }
}

impl From<&str> for Token {
    fn from(token: &str) -> Token {
        Token(token.to_owned())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// The single agent of `--agent-id`/`--token` or `--credentials`.
pub fn single(id: String, token: Token) -> Result<Vec<Agent>, LoadError> {
    if !header_safe(&id) || !header_safe(token.as_str()) {
        return Err(LoadError::Invalid(
            "agent id and token must not be empty or hold control characters",
        ));
    }
    Ok(vec![Agent {
        id,
        token,
        service: None,
        weight: 1,
    }])
}

/// Reads and checks an `--agents` file.
pub fn read_agents(path: &Path) -> Result<Vec<Agent>, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::AgentsRead {
        path: path.display().to_string(),
        source,
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse_agents(&text, &path.display().to_string(), |file| {
        std::fs::read_to_string(dir.join(file))
    })
}

/// Parses an `--agents` file's text (shown as `path` in errors); `read` reads a token file.
pub fn parse_agents(
    text: &str,
    path: &str,
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<Vec<Agent>, LoadError> {
    let bad = |message: String| LoadError::AgentsFormat {
        path: path.to_owned(),
        message,
    };
    let file: AgentsFile =
        toml::from_str(text).map_err(|e| bad(toml_mistake(text, &e, AgentsFile::KEYS)))?;
    if file.agents.is_empty() {
        return Err(bad("no [[agents]]".into()));
    }
    let mut seen = HashSet::new();
    let mut agents = Vec::with_capacity(file.agents.len());
    for (k, entry) in file.agents.into_iter().enumerate() {
        let at = |message: String| bad(format!("agents[{k}]: {message}"));
        if !header_safe(&entry.id) {
            return Err(at("id must not be empty or hold control characters".into()));
        }
        if !seen.insert(entry.id.clone()) {
            return Err(at(format!("id {:?} given twice", entry.id)));
        }
        let token = match (entry.token, entry.token_file) {
            (Some(token), None) => token,
            (None, Some(file)) => read(&file)
                .map_err(|e| at(format!("cannot read token_file {}: {e}", file.display())))?
                .trim_end_matches(['\r', '\n'])
                .into(),
            _ => return Err(at("give one of token and token_file".into())),
        };
        if !header_safe(token.as_str()) {
            return Err(at(
                "the token must not be empty or hold control characters".into()
            ));
        }
        let service = entry
            .service
            .map(|code| BusinessCode::parse(&code).map(|c| c.as_str().to_owned()))
            .transpose()
            .map_err(|e| at(format!("service: {e}")))?;
        agents.push(Agent {
            id: entry.id,
            token,
            service,
            weight: entry.weight.unwrap_or(1),
        });
    }
    if agents.iter().all(|a| a.weight == 0) {
        return Err(bad("every weight is zero".into()));
    }
    Ok(agents)
}

/// What is wrong with a TOML file of tokens (`--agents`, `--credentials`), on one line: the
/// key, line and column of its mistake and the parser's message, never the line itself, which
/// the error's own `Display` quotes and may be a `token = ...`.
pub(super) fn toml_mistake(text: &str, e: &toml::de::Error, keys: &[&str]) -> String {
    match e.span() {
        Some(span) => problem_in_text(text, span, e.message(), |k| keys.contains(&k)).to_string(),
        None => e.message().replace('\n', "; "),
    }
}

/// An id or token goes in a header as it is: not empty, no control character.
fn header_safe(v: &str) -> bool {
    !v.is_empty() && !v.bytes().any(|b| b.is_ascii_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`AgentsFile::KEYS`] are the names serde knows for the file and its entries: the list
    /// an error may name a key from stays the structs' fields.
    #[test]
    fn the_agents_files_key_names_are_its_fields() {
        let expected = |text: &str| -> Vec<String> {
            let e = toml::from_str::<AgentsFile>(text).unwrap_err();
            let (_, names) = e
                .message()
                .split_once("expected")
                .expect("serde lists them");
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let mut fields = expected("x = 1\n");
        fields.extend(expected("[[agents]]\nid = \"a\"\nx = 1\n"));
        fields.sort();
        let mut keys = AgentsFile::KEYS.to_vec();
        keys.sort();
        assert_eq!(fields, keys);
    }
}
