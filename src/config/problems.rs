//! What validation reports: each [`Problem`] under its key path (`auth.agents[2].id`), all of a
//! file's at once in a [`ConfigError`]. Every section's validator pushes into one [`Problems`]
//! and goes on, so an operator sees every mistake in one run rather than one per run.

use std::fmt;
use std::time::Duration;

/// One thing wrong with a config file, located by its key path (`auth.agents[2].id`) and,
/// when it comes from a file's text, by line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
    /// Where in the text the key (or, for a value of the wrong type, the value) is; `None` for
    /// a key the file does not have, or a config that is no text.
    pub at: Option<Place>,
    /// The file the key is in when it is not the config itself (the agents file).
    pub file: Option<String>,
}

/// A place in a file's text, both counted from 1 (the column in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Place {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}: ")?;
        }
        f.write_str(&self.key)?;
        if let Some(Place { line, column }) = self.at {
            let space = if self.key.is_empty() { "" } else { " " };
            write!(f, "{space}(line {line}, column {column})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// Every problem: of the file's shape (not TOML, an unknown key, a value of the wrong
    /// type) and of its values, in the order of the file.
    #[error("{} problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// Every problem, each with its key path; a file that cannot be read is one problem at
    /// the root.
    pub fn problems(&self) -> Vec<Problem> {
        match self {
            ConfigError::Invalid(p) => p.clone(),
            other => vec![Problem {
                key: String::new(),
                message: other.to_string(),
                at: None,
                file: None,
            }],
        }
    }
}

/// Collects problems while a file is validated, each under its key path.
#[derive(Default)]
pub(super) struct Problems(Vec<Problem>);

impl Problems {
    pub(super) fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
            at: None,
            file: None,
        });
    }

    /// Problems already placed (in another file), kept as they are.
    pub(super) fn extend(&mut self, placed: impl IntoIterator<Item = Problem>) {
        self.0.extend(placed);
    }

    /// Takes out the problems whose key `to_other` maps to a key of another file, which it
    /// returns in their order; the rest stay.
    pub(super) fn split_off(&mut self, to_other: impl Fn(&str) -> Option<String>) -> Vec<Problem> {
        let mut other = Vec::new();
        self.0.retain(|p| match to_other(&p.key) {
            Some(key) => {
                other.push(Problem { key, ..p.clone() });
                false
            }
            None => true,
        });
        other
    }

    /// The parsed value, or `None` with the error recorded under `key`.
    pub(super) fn check<T>(&mut self, key: impl Into<String>, r: Result<T, String>) -> Option<T> {
        r.map_err(|e| self.push(key, e)).ok()
    }

    /// Records a problem under `key` when `value` is 0: no count, size or time in the file
    /// means anything at 0.
    pub(super) fn positive(&mut self, key: &str, value: u64) {
        if value == 0 {
            self.push(key, "must be greater than 0");
        }
    }

    /// A positive number of milliseconds, as a duration.
    pub(super) fn millis(&mut self, key: &str, ms: u64) -> Duration {
        self.positive(key, ms);
        Duration::from_millis(ms)
    }

    /// `value` when nothing was recorded, else every problem.
    pub(super) fn finish<T>(self, value: Option<T>) -> Result<T, Vec<Problem>> {
        match value {
            Some(value) if self.0.is_empty() => Ok(value),
            _ => Err(self.0),
        }
    }
}
