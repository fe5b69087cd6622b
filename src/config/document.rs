//! A config file's text read into a [`FileConfig`], with every problem of its shape at once:
//! each unknown key (with the nearest known one), each value of the wrong type, each duration
//! written twice or unreadable, located by key path, line and column.
//!
//! The text is parsed keeping each key's place ([`toml_edit`]), then walked against the
//! [`Schema`]: unknown keys are reported and taken out, and each duration written as the
//! sibling of a `*_ms` key (`read_timeout = "2s"`) becomes that key (`read_timeout_ms = 2000`),
//! so the file layer only ever sees milliseconds. What is left is deserialized; a value of the
//! wrong type is reported, taken out, and the rest read again, so one mistake does not hide
//! the next. Validation then runs on what could be read, and [`Parsed::merge`] puts its
//! problems with these, in the order of the file. Only a file that is not TOML at all stops at
//! its first mistake: the TOML parser cannot go past it.

use std::collections::HashMap;
use std::ops::Range;

use serde::de::DeserializeOwned;
use toml_edit::{DocumentMut, ImDocument, Item, Table, TableLike, Value};

use super::file::FileConfig;
use super::problems::{ConfigError, Place, Problem};
use super::schema::{join, Schema, MS_SUFFIX};

/// A file as far as it could be read, and what stood in the way: the config
/// ([`FileConfig`]) or the agents file ([`super::file::AgentsFile`]).
pub(super) struct Parsed<T = FileConfig> {
    /// The file without the keys that have a problem.
    pub file: T,
    found: Findings,
}

/// What reading a file found: its problems, and where its keys are.
struct Findings {
    /// The keys the file may have.
    schema: &'static Schema,
    /// Problems of the file's shape, located.
    problems: Vec<Problem>,
    /// Keys taken out because of a problem: validation's problems at or under them are its
    /// consequences, not news.
    dropped: Vec<String>,
    /// `x_ms` keys the file wrote as their sibling `x`: problems are reported under the key
    /// the file has.
    written_as: HashMap<String, String>,
    /// Where each key path starts and ends in the text.
    places: Vec<(String, Range<usize>)>,
    lines: Lines,
}

impl FileConfig {
    /// The file layer of a config's text: its shape checked, none of its values.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let parsed = Parsed::read(text, Schema::file()).map_err(ConfigError::Invalid)?;
        if parsed.is_clean() {
            Ok(parsed.file)
        } else {
            Err(ConfigError::Invalid(parsed.merge(Vec::new())))
        }
    }
}

impl<T: DeserializeOwned> Parsed<T> {
    /// Reads `text`, a file of `schema`; fails only when nothing of it can be read (it is not
    /// TOML).
    pub fn read(text: &str, schema: &'static Schema) -> Result<Parsed<T>, Vec<Problem>> {
        let doc = ImDocument::parse(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            vec![problem_in_text(text, offset..offset, e.message(), |key| {
                schema.names_key(key)
            })]
        })?;
        let lines = Lines::of(text);
        let mut root = doc.into_table();
        let mut found = Findings {
            schema,
            problems: Vec::new(),
            dropped: Vec::new(),
            written_as: HashMap::new(),
            places: Vec::new(),
            lines,
        };
        found.walk(&mut root, "", "");
        loop {
            let e = match toml_edit::de::from_document(DocumentMut::from(root.clone())) {
                Ok(file) => return Ok(Parsed { file, found }),
                Err(e) => e,
            };
            let offset = e.span().map(|s| s.start);
            let message = one_line(e.message());
            let Some((key, offset)) = offset.and_then(|o| found.key_at(o)).zip(offset) else {
                found.problem(String::new(), message, offset);
                return Err(found.problems);
            };
            let whole = whole_key(&key).to_owned();
            found.problem(key.clone(), message, Some(offset));
            if !remove(&mut root, &whole) {
                return Err(found.problems);
            }
            found.dropped.push(whole);
        }
    }

    /// Whether the file's shape had no problem.
    pub fn is_clean(&self) -> bool {
        self.found.problems.is_empty()
    }

    /// Validation's `problems` put with the file's own, each under the key the file wrote and
    /// located, all in the order of the file (problems of keys it does not have come last).
    /// A problem already placed in another file (the agents file's) is kept as it is, after
    /// this file's.
    pub fn merge(self, validation: Vec<Problem>) -> Vec<Problem> {
        let found = self.found;
        let mut all = found.problems.clone();
        for p in validation {
            if p.file.is_some() {
                all.push(p);
                continue;
            }
            if found.dropped.iter().any(|d| is_at_or_under(&p.key, d)) {
                continue;
            }
            let key = found.written_as.get(&p.key).cloned().unwrap_or(p.key);
            let at = found.locate(&key);
            all.push(Problem {
                key,
                message: p.message,
                at,
                file: None,
            });
        }
        all.sort_by_key(|p| {
            let (line, column) = p.at.map_or((usize::MAX, 0), |a| (a.line, a.column));
            (p.file.is_some(), line, column)
        });
        all
    }
}

impl Findings {
    /// Where `key`, or the nearest table above it that the file has, starts.
    fn locate(&self, key: &str) -> Option<Place> {
        let mut key = key;
        loop {
            if let Some((_, range)) = self.places.iter().find(|(k, _)| k == key) {
                return Some(self.lines.place(range.start));
            }
            key = parent(key)?;
        }
    }

    /// The innermost key whose text holds `offset`.
    fn key_at(&self, offset: usize) -> Option<String> {
        self.places
            .iter()
            .filter(|(_, r)| r.contains(&offset))
            .min_by_key(|(_, r)| r.len())
            .map(|(k, _)| k.clone())
    }

    fn problem(&mut self, key: String, message: String, at: Option<usize>) {
        let at = at.map(|o| self.lines.place(o));
        self.problems.push(Problem {
            key,
            message,
            at,
            file: None,
        });
    }

    /// Checks the keys of `table` (at `path`, `schema` in the [`Schema`]'s terms) and of the
    /// tables under it, noting where each is; unknown keys are reported and taken out, and
    /// duration siblings become their `_ms` keys.
    fn walk(&mut self, table: &mut dyn TableLike, schema: &str, path: &str) {
        let Some(known) = self.schema.keys(schema) else {
            return;
        };
        let keys: Vec<String> = table.iter().map(|(k, _)| k.to_owned()).collect();
        for key in keys {
            let full = join(path, &key);
            let range = {
                let (k, item) = table.get_key_value(&key).expect("a key of this table");
                span_of(k.span(), item.span())
            };
            let start = range.as_ref().map(|r| r.start);
            if let Some(range) = range {
                self.places.push((full.clone(), range));
            }
            if known.contains(&key.as_str()) {
                let item = table.get_mut(&key).expect("a key of this table");
                self.walk_item(item, &join(schema, &key), &full);
            } else if let Some(ms) = sibling_of(&key, known) {
                self.fold_duration(table, &key, &ms, path, start);
            } else {
                let message = match nearest(&key, known) {
                    Some(near) => format!("unknown key; did you mean {near}?"),
                    None => format!("unknown key; this table takes {}", known.join(", ")),
                };
                self.problem(full.clone(), message, start);
                table.remove(&key);
                self.dropped.push(full);
            }
        }
    }

    /// Walks the tables in `item`, the value of the key at `path`.
    fn walk_item(&mut self, item: &mut Item, schema: &str, path: &str) {
        match item {
            Item::Table(t) => self.walk(t, schema, path),
            Item::Value(Value::InlineTable(t)) => self.walk(t, schema, path),
            Item::ArrayOfTables(tables) => {
                for (i, t) in tables.iter_mut().enumerate() {
                    let element = format!("{path}[{i}]");
                    if let Some(span) = t.span() {
                        self.places.push((element.clone(), span));
                    }
                    self.walk(t, &format!("{schema}[]"), &element);
                }
            }
            Item::Value(Value::Array(values)) => {
                for (i, v) in values.iter_mut().enumerate() {
                    let element = format!("{path}[{i}]");
                    if let Some(span) = v.span() {
                        self.places.push((element.clone(), span));
                    }
                    if let Value::InlineTable(t) = v {
                        self.walk(t, &format!("{schema}[]"), &element);
                    }
                }
            }
            _ => {}
        }
    }

    /// `key` (in `table`, at `path`) is the duration sibling of `ms`: it becomes `ms`, in
    /// milliseconds, unless `ms` is set too or it is not a duration.
    fn fold_duration(
        &mut self,
        table: &mut dyn TableLike,
        key: &str,
        ms: &str,
        path: &str,
        start: Option<usize>,
    ) {
        let (full, full_ms) = (join(path, key), join(path, ms));
        let written = table.remove(key).expect("a key of this table");
        if table.contains_key(ms) {
            let message = format!("set either {full_ms} or {full}, not both");
            self.problem(full.clone(), message, start);
            self.dropped.push(full);
            self.dropped.push(full_ms);
            return;
        }
        match written.as_str().map(millis) {
            Some(Ok(n)) => {
                table.insert(ms, toml_edit::value(n));
                if let Some(start) = start {
                    self.places
                        .push((full_ms.clone(), start..start + key.len()));
                }
                self.written_as.insert(full_ms, full);
            }
            Some(Err(e)) => {
                self.problem(full.clone(), e, start);
                self.dropped.push(full);
            }
            None => {
                let message = format!(
                    "must be a duration string such as \"2s\" or \"1m 30s\" \
                     (or {ms} = a number of milliseconds)"
                );
                self.problem(full.clone(), message, start);
                self.dropped.push(full);
            }
        }
    }
}

/// A duration string (`"2s"`, `"1m 30s"`, `"250ms"`) in whole milliseconds.
fn millis(s: &str) -> Result<i64, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as \"2s\" or \"1m 30s\" ({e})"))?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{s:?} is finer than a millisecond"));
    }
    i64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too long"))
}

/// The `_ms` key `key` is the sibling of, when `known` has it.
fn sibling_of(key: &str, known: &[&str]) -> Option<String> {
    let ms = format!("{key}{MS_SUFFIX}");
    known.contains(&ms.as_str()).then_some(ms)
}

/// The known key nearest to an unknown one (at most a third of its letters off).
fn nearest(key: &str, known: &[&str]) -> Option<String> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= (key.len() / 3).max(1))
        .min()
        .map(|(_, k)| k.to_owned())
}

/// Levenshtein distance, by bytes (keys are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// From the key to the end of its value.
fn span_of(key: Option<Range<usize>>, item: Option<Range<usize>>) -> Option<Range<usize>> {
    match (key, item) {
        (Some(k), Some(v)) => Some(k.start..v.end.max(k.end)),
        (k, v) => k.or(v),
    }
}

/// The key that holds `path`: an element of an array (`services[1]`) is held by the array.
fn whole_key(path: &str) -> &str {
    match path.strip_suffix(']') {
        Some(rest) if !path.ends_with(".]") => {
            let open = rest.rfind('[').unwrap_or(rest.len());
            whole_key(&path[..open])
        }
        _ => path,
    }
}

/// The key path one step up: `a.b[2]` → `a.b`, `a.b` → `a`, `a` → none.
fn parent(path: &str) -> Option<&str> {
    if let Some(rest) = path.strip_suffix(']') {
        return rest.rfind('[').map(|i| &path[..i]);
    }
    path.rfind('.').map(|i| &path[..i])
}

fn is_at_or_under(key: &str, above: &str) -> bool {
    key.strip_prefix(above)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// Takes the key at `path` (`auth.agents[1].burst`, no index at its end) out of `root`.
fn remove(root: &mut Table, path: &str) -> bool {
    let mut segments: Vec<&str> = path.split('.').collect();
    let Some(last) = segments.pop() else {
        return false;
    };
    let mut table: Option<&mut dyn TableLike> = Some(root);
    for segment in segments {
        let (name, index) = match segment.split_once('[') {
            Some((name, i)) => (name, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some(item) = table.and_then(|t| t.get_mut(name)) else {
            return false;
        };
        table = match (item, index) {
            (Item::ArrayOfTables(tables), Some(i)) => tables.get_mut(i).map(|t| t as _),
            (Item::Value(Value::Array(values)), Some(i)) => values
                .get_mut(i)
                .and_then(Value::as_inline_table_mut)
                .map(|t| t as _),
            (item, None) => item.as_table_like_mut(),
            _ => None,
        };
    }
    table.and_then(|t| t.remove(last)).is_some()
}

/// The problem a TOML parser's error at `span` of `text` is: under the key it is about
/// ([`key_of`]), located, its message on one line. It quotes none of the text, as the
/// error's own `Display` does: a value there may be a secret (the load generator's tokens).
/// `is_key` says which names the file's keys have: the text before a line's `=` is named only
/// when it is one, since that line may be inside a value left open (an unclosed string or
/// array), such as a token ending in `=`.
pub(crate) fn problem_in_text(
    text: &str,
    span: Range<usize>,
    message: &str,
    is_key: impl Fn(&str) -> bool,
) -> Problem {
    Problem {
        key: key_of(text, span.clone(), is_key),
        message: one_line(message),
        at: Some(Lines::of(text).place(span.start)),
        file: None,
    }
}

/// The key an error at `span` is about, as far as the text says: the last table header up to
/// its line, and the key of its line when `span` is that key (unknown, written twice) or on
/// or past its value (of the wrong type, a syntax error in or after it). A span that starts
/// at a key and runs past it is its table's (a key missing from the table).
fn key_of(text: &str, span: Range<usize>, is_key: impl Fn(&str) -> bool) -> String {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let mut table = String::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in text[..line_end].lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.split_once("]]")) {
            let name = name.0.trim().to_owned();
            let n = seen.entry(name.clone()).or_default();
            table = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.split_once(']')) {
            table = name.0.trim().to_owned();
        }
    }
    let line = &text[line_start..line_end];
    let Some(equals) = line.find('=') else {
        return table;
    };
    let key = line[..equals].trim();
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    let equals = line_start + equals;
    if bare && is_key(key) && (start > equals || span.end <= equals) {
        join(&table, key)
    } else {
        table
    }
}

/// A parser's message on one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where each line of a text starts, to turn byte offsets into lines and columns.
struct Lines {
    starts: Vec<usize>,
    text: String,
}

impl Lines {
    fn of(text: &str) -> Lines {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Lines {
            starts,
            text: text.to_owned(),
        }
    }

    /// The line and column (both from 1, the column in characters) of `offset`.
    fn place(&self, offset: usize) -> Place {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&s| s <= offset);
        let start = self.starts[line - 1];
        let column = self.text[start..offset].chars().count() + 1;
        Place { line, column }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match FileConfig::parse(text) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn every_unknown_key_and_bad_value_is_reported_with_its_place() {
        let text = "[listen]\nproxy = \"127.0.0.1:8080\"\nproxi = 1\n\n[upstream]\n\
                    addresses = [\"127.0.0.1:9000\"]\nread_timeout_ms = \"slow\"\n\
                    [retirement]\nquiet_dayz = 3\n[[auth.agents]]\nid = \"a\"\n\
                    token_sha256 = \"x\"\nburst = -1\n";
        assert_eq!(
            problems(text),
            [
                "listen.proxi (line 3, column 1): unknown key; did you mean proxy?",
                "upstream.read_timeout_ms (line 7, column 19): invalid type: string \"slow\", expected u64",
                "retirement.quiet_dayz (line 9, column 1): unknown key; did you mean quiet_days?",
                "auth.agents[0].burst (line 13, column 9): invalid value: integer `-1`, expected u32",
            ]
        );
    }

    /// A token pasted where its digest goes (unquoted digits read as an integer) stays out
    /// of the report, in either digest key.
    #[test]
    fn a_digest_of_another_type_is_refused_without_its_value() {
        let text = "[listen]\nproxy = \"127.0.0.1:8080\"\n[upstream]\naddresses = []\n\
                    [[auth.agents]]\nid = \"a\"\ntoken_sha256 = 48151623429\n\
                    [[auth.agents]]\nid = \"b\"\n[[auth.agents.tokens]]\nsha256 = 48151623429\n";
        let found = problems(text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("auth.agents[0].token_sha256 "),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("auth.agents[1].tokens[0].sha256 "),
            "{found:?}"
        );
        assert!(
            found[1].ends_with("must be a hex SHA-256 digest"),
            "{found:?}"
        );
        assert!(!found.concat().contains("48151623429"), "{found:?}");
    }

    #[test]
    fn a_duration_sibling_becomes_its_ms_key() {
        let text = "[listen]\nproxy = \"127.0.0.1:8080\"\n[upstream]\naddresses = []\n\
                    read_timeout = \"2s\"\nconnect_timeout = \"1m 30s\"\n\
                    [tracing]\nscheduled_delay = \"250ms\"\n";
        let f = FileConfig::parse(text).unwrap();
        assert_eq!(f.upstream.read_timeout_ms, 2000);
        assert_eq!(f.upstream.connect_timeout_ms, 90_000);
        assert_eq!(f.tracing.scheduled_delay_ms, 250);
    }

    #[test]
    fn a_duration_written_twice_or_unreadable_is_refused_by_name() {
        let text = "[listen]\nproxy = \"127.0.0.1:8080\"\n[upstream]\naddresses = []\n\
                    read_timeout = \"2s\"\nread_timeout_ms = 2000\nidle_timeout = 60\n\
                    connect_timeout = \"soon\"\nhealth_check_interval = \"1500us\"\n";
        let found = problems(text);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found[0].starts_with(
            "upstream.read_timeout (line 5, column 1): set either upstream.read_timeout_ms \
             or upstream.read_timeout, not both"
        ));
        assert!(found[1]
            .starts_with("upstream.idle_timeout (line 7, column 1): must be a duration string"));
        assert!(found[2].starts_with(
            "upstream.connect_timeout (line 8, column 1): \"soon\" is not a duration"
        ));
        assert!(found[3].contains("finer than a millisecond"), "{found:?}");
    }

    #[test]
    fn a_file_that_is_not_toml_names_the_key_and_place_of_its_first_mistake() {
        let text = "[listen]\nproxy = \"127.0.0.1:8080\"\n[retirement]\nquiet_days = \n";
        let found = problems(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("retirement.quiet_days (line 4, column 14): "),
            "{found:?}"
        );
        assert_eq!(
            key_of(
                "[[auth.agents]]\nid = 1\n[[auth.agents]]\nid = ",
                55..55,
                |k| k == "id"
            ),
            "auth.agents[1].id"
        );
    }

    /// A serde error's span is its key's, its value's, or its table's (a key missing).
    #[test]
    fn an_error_is_under_the_key_or_the_table_its_span_is() {
        let known = |k: &str| ["id", "token", "weight", "agent_id"].contains(&k);
        let text = "[[agents]]\nid = \"a\"\ntoken = \"x\"\n[[agents]]\nweight = -1\n";
        let at = |part: &str| {
            let start = text.find(part).unwrap();
            key_of(text, start..start + part.len(), known)
        };
        assert_eq!(at("token"), "agents[0].token");
        assert_eq!(at("-1"), "agents[1].weight");
        assert_eq!(at("[[agents]]\nweight = -1"), "agents[1]");
        assert_eq!(key_of("agent_id = \"a\"\n", 0..14, known), "");
    }

    /// A line inside a value left open (a string, an array) is no key, however it reads: a
    /// token ending in `=` there would be named as one.
    #[test]
    fn a_line_inside_an_open_value_is_not_named_as_a_key() {
        let known = |k: &str| ["id", "token"].contains(&k);
        for text in [
            "[[agents]]\nid = \"a\"\ntoken = \"\"\"\nsk_live_SECRET==",
            "[[agents]]\nid = \"a\"\ntoken = [\n\"x\",\nsk_live_SECRET==\n]",
            "[[agents]]\nid = \"a\"\nsk_live_SECRET==\n",
        ] {
            let end = text.len();
            let key = key_of(text, end..end, known);
            assert_eq!(key, "agents[0]", "{text:?}");
            let problem = problem_in_text(text, end..end, "invalid string", known).to_string();
            assert!(!problem.contains("SECRET"), "{problem}");
        }
    }

    #[test]
    fn key_paths_step_up_and_hold_their_elements() {
        assert_eq!(
            whole_key("auth.agents[1].services[2]"),
            "auth.agents[1].services"
        );
        assert_eq!(whole_key("auth.agents[1]"), "auth.agents");
        assert_eq!(parent("auth.agents[1].id"), Some("auth.agents[1]"));
        assert_eq!(parent("auth.agents[1]"), Some("auth.agents"));
        assert_eq!(parent("auth"), None);
        assert!(is_at_or_under("auth.agents[1].id", "auth.agents"));
        assert!(!is_at_or_under("auth.agents_x", "auth.agents"));
        assert_eq!(edit_distance("quiet_dayz", "quiet_days"), 1);
        assert_eq!(millis("1m 30s"), Ok(90_000));
    }
}
