//! `retirement.prometheus_selector` and `v1-usage --prometheus-selector`: PromQL label
//! matchers that pick one deployment's series out of a Prometheus that scrapes several
//! (`job="agent-gateway",namespace="prod"`). A leaf.
//!
//! The text is parsed into a [`SeriesSelector`] and every query renders it back from that
//! value, never from the text: what reaches a query is label matchers and nothing else, each
//! value a string literal it cannot close.

use std::fmt;
use std::str::FromStr;

/// How a matcher compares a label's value: PromQL's four operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Equal,
    NotEqual,
    /// `=~`: the whole value matches a regular expression (Prometheus' RE2 syntax, checked
    /// here with Rust's `regex` syntax, which is RE2's but for `\Q...\E`).
    Matches,
    NotMatches,
}

impl MatchOp {
    pub const fn as_str(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Matches => "=~",
            MatchOp::NotMatches => "!~",
        }
    }
}

/// One label matcher: `namespace="prod"`, `job=~"agent-gateway|gw"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// `[a-zA-Z_][a-zA-Z0-9_]*`, never `__name__`.
    label: String,
    op: MatchOp,
    /// Unescaped; quoted again by [`promql_string`] when rendered.
    value: String,
}

/// Label matchers that every series a query names must match. None (the default) selects
/// every series.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeriesSelector(Vec<Matcher>);

impl SeriesSelector {
    /// Comma-separated matchers, each `label`, an operator (`=`, `!=`, `=~`, `!~`) and a
    /// double-quoted value with PromQL's escapes, with or without the braces around them,
    /// spaces allowed between the parts and a trailing comma as PromQL allows. At least one
    /// matcher; no metric name, and no `__name__`: each query names its own metric.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut c = Cursor { text, at: 0 };
        c.skip_spaces();
        let braced = c.eat('{');
        let mut matchers = Vec::new();
        loop {
            c.skip_spaces();
            if c.peek().is_none() || (braced && c.peek() == Some('}')) {
                break;
            }
            matchers.push(c.matcher()?);
            c.skip_spaces();
            if !c.eat(',') {
                break;
            }
        }
        if braced && !c.eat('}') {
            return Err(c.unexpected("`,` or the closing `}`"));
        }
        c.skip_spaces();
        if c.peek().is_some() {
            return Err(c.unexpected(if braced {
                "nothing after the closing `}`"
            } else {
                "`,` or the end"
            }));
        }
        if matchers.is_empty() {
            return Err(
                "holds no label matcher, such as job=\"agent-gateway\" (leave it out \
                        to select every series)"
                    .into(),
            );
        }
        Ok(SeriesSelector(matchers))
    }

    /// Selects every series.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These matchers and `label="value"`, for a label name written in the code.
    pub fn and_equal(&self, label: &'static str, value: &str) -> SeriesSelector {
        debug_assert!(is_label_name(label) && label != "__name__", "{label}");
        let mut matchers = self.0.clone();
        matchers.push(Matcher {
            label: label.to_owned(),
            op: MatchOp::Equal,
            value: value.to_owned(),
        });
        SeriesSelector(matchers)
    }

    /// The matchers as PromQL, comma-separated, without braces (empty for none): what goes
    /// inside a selector's braces beside other matchers.
    pub fn matchers(&self) -> String {
        let rendered: Vec<String> = self
            .0
            .iter()
            .map(|m| format!("{}{}{}", m.label, m.op.as_str(), promql_string(&m.value)))
            .collect();
        rendered.join(",")
    }

    /// `metric` restricted to these series: `metric{job="agent-gateway"}`, or `metric`
    /// alone when there is no matcher.
    pub fn select(&self, metric: &str) -> String {
        match self.is_empty() {
            true => metric.to_owned(),
            false => format!("{metric}{{{}}}", self.matchers()),
        }
    }
}

/// The matchers in braces, as PromQL writes a selector without a metric; nothing for none.
impl fmt::Display for SeriesSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_empty() {
            true => Ok(()),
            false => write!(f, "{{{}}}", self.matchers()),
        }
    }
}

impl FromStr for SeriesSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SeriesSelector::parse(s)
    }
}

/// `value` as a PromQL double-quoted string: `\` and `"` escaped, and every character
/// PromQL's lexer would refuse or misread written as an escape (a line break, control
/// characters, U+FFFD, which it takes for an encoding error).
pub fn promql_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || c == char::REPLACEMENT_CHARACTER => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn is_label_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What is wrong with a regular expression, in one line: the parser's own message draws the
/// pattern over several lines, which a config problem's line cannot hold.
fn regex_problem(e: &regex_syntax::Error) -> String {
    match e {
        regex_syntax::Error::Parse(e) => e.kind().to_string(),
        regex_syntax::Error::Translate(e) => e.kind().to_string(),
        e => e.to_string(),
    }
}

/// A parse in progress: the text and the byte offset reached.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.peek() == Some(c);
        if found {
            self.at += c.len_utf8();
        }
        found
    }

    fn eat_str(&mut self, s: &str) -> bool {
        let found = self.text[self.at..].starts_with(s);
        if found {
            self.at += s.len();
        }
        found
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.next();
        }
    }

    /// The position of byte `at` for a message: its character, counted from 1.
    fn place(&self, at: usize) -> String {
        format!("at character {}", self.text[..at].chars().count() + 1)
    }

    /// "expected `what`, found" what is here.
    fn unexpected(&self, what: &str) -> String {
        let found = match self.peek() {
            Some(c) => format!("`{c}`"),
            None => "the end".into(),
        };
        format!("expected {what}, found {found} ({})", self.place(self.at))
    }

    fn matcher(&mut self) -> Result<Matcher, String> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.next();
        }
        let label = &self.text[start..self.at];
        if !is_label_name(label) {
            self.at = start;
            return Err(self.unexpected("a label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
        }
        if label == "__name__" {
            return Err(format!(
                "__name__ is the metric's name, which each query gives ({})",
                self.place(start)
            ));
        }
        self.skip_spaces();
        if self.peek() == Some('{') {
            return Err(format!(
                "names a metric ({label}): give only label matchers, such as \
                 job=\"agent-gateway\""
            ));
        }
        let op = if self.eat_str("=~") {
            MatchOp::Matches
        } else if self.eat_str("!~") {
            MatchOp::NotMatches
        } else if self.eat_str("!=") {
            MatchOp::NotEqual
        } else if self.eat('=') {
            MatchOp::Equal
        } else {
            return Err(self.unexpected(&format!("=, !=, =~ or !~ after {label}")));
        };
        let label = label.to_owned();
        self.skip_spaces();
        let value_at = self.at;
        let value = self.string(&label)?;
        if matches!(op, MatchOp::Matches | MatchOp::NotMatches) {
            if let Err(e) = regex_syntax::Parser::new().parse(&value) {
                return Err(format!(
                    "the value of {label} is not a regular expression ({}): {}",
                    self.place(value_at),
                    regex_problem(&e)
                ));
            }
        }
        Ok(Matcher { label, op, value })
    }

    /// A double-quoted string with PromQL's escapes (Go's, as its lexer takes them), unescaped.
    fn string(&mut self, label: &str) -> Result<String, String> {
        if !self.eat('"') {
            return Err(self.unexpected(&format!(
                "the value of {label} as a double-quoted string (\"...\")"
            )));
        }
        let mut bytes = Vec::new();
        let unclosed = || format!("the value of {label} has no closing `\"`");
        loop {
            let at = self.at;
            match self.next() {
                None => return Err(unclosed()),
                Some('"') => break,
                Some('\n') => {
                    return Err(format!(
                        "a line break in the value of {label} ({}): write \\n",
                        self.place(at)
                    ))
                }
                Some('\\') if self.peek().is_none() => return Err(unclosed()),
                Some('\\') => self
                    .escape(&mut bytes)
                    .map_err(|e| format!("{e} in the value of {label} ({})", self.place(at)))?,
                Some(c) => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        String::from_utf8(bytes)
            .map_err(|_| format!("the escapes in the value of {label} do not make UTF-8 text"))
    }

    /// The escape after a `\`, appended to `bytes`: `\a \b \f \n \r \t \v \\ \"`, a byte as
    /// three octal digits or `\x` and two hex digits, a character as `\u` and four or `\U`
    /// and eight.
    fn escape(&mut self, bytes: &mut Vec<u8>) -> Result<(), String> {
        let simple = |c| {
            Some(match c {
                'a' => 0x07,
                'b' => 0x08,
                'f' => 0x0c,
                'n' => b'\n',
                'r' => b'\r',
                't' => b'\t',
                'v' => 0x0b,
                '\\' => b'\\',
                '"' => b'"',
                _ => return None,
            })
        };
        let c = self.next().expect("a character after the backslash");
        if let Some(b) = simple(c) {
            bytes.push(b);
            return Ok(());
        }
        let (digits, radix, kind) = match c {
            '0'..='7' => (2, 8, "three octal digits"),
            'x' => (2, 16, "\\x and two hex digits"),
            'u' => (4, 16, "\\u and four hex digits"),
            'U' => (8, 16, "\\U and eight hex digits"),
            other => return Err(format!("an unknown escape \\{other}")),
        };
        let mut n = match c {
            '0'..='7' => c.to_digit(8).expect("an octal digit"),
            _ => 0,
        };
        for _ in 0..digits {
            let d = self.peek().and_then(|d| d.to_digit(radix));
            let d = d.ok_or_else(|| format!("an escape that is not {kind}"))?;
            self.next();
            n = n * radix + d;
        }
        match c {
            'u' | 'U' => {
                let ch = char::from_u32(n)
                    .ok_or_else(|| format!("an escape of no Unicode character ({n:#x})"))?;
                bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
            }
            _ => {
                bytes.push(u8::try_from(n).map_err(|_| format!("an octal escape over 255 ({n})"))?)
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<String, String> {
        SeriesSelector::parse(s).map(|sel| sel.matchers())
    }

    #[test]
    fn matchers_are_rendered_back_from_their_parts() {
        assert_eq!(
            parse(r#"job="agent-gateway",namespace="prod""#).unwrap(),
            r#"job="agent-gateway",namespace="prod""#
        );
        // Braces, spaces and a trailing comma, as PromQL takes them; every operator.
        assert_eq!(
            parse(r#" { job = "gw" , namespace!="staging", pod=~"gw-.+" ,instance!~"x|y", } "#)
                .unwrap(),
            r#"job="gw",namespace!="staging",pod=~"gw-.+",instance!~"x|y""#
        );
        assert_eq!(parse(r#"_a1="""#).unwrap(), r#"_a1="""#);
    }

    #[test]
    fn values_take_promqls_escapes_and_are_quoted_again() {
        let value = |s: &str| SeriesSelector::parse(s).unwrap().0[0].value.clone();
        assert_eq!(value(r#"a="q\"b\\s""#), "q\"b\\s");
        assert_eq!(value(r#"a="\a\b\f\n\r\t\v""#), "\x07\x08\x0c\n\r\t\x0b");
        assert_eq!(
            value(r#"a="\101\x42\u00e9\U0001F600""#),
            "AB\u{e9}\u{1F600}"
        );
        // Bytes that make UTF-8 together, as Go unquotes them.
        assert_eq!(value(r#"a="\xc3\xa9""#), "\u{e9}");
        assert_eq!(
            parse(r#"a="q\"b\\s\n\x01é""#).unwrap(),
            r#"a="q\"b\\s\n\u0001é""#
        );
        assert_eq!(promql_string("\u{fffd}\t\r"), r#""\ufffd\t\r""#);
        assert_eq!(promql_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn nothing_but_matchers_is_accepted() {
        let refused = |s: &str| parse(s).unwrap_err();
        for empty in ["", "  ", "{}", " { } "] {
            assert!(refused(empty).contains("label matcher"), "{empty:?}");
        }
        assert_eq!(
            refused(r#"up{job="gw"}"#),
            "names a metric (up): give only label matchers, such as job=\"agent-gateway\""
        );
        assert_eq!(
            refused(r#"__name__="up""#),
            "__name__ is the metric's name, which each query gives (at character 1)"
        );
        assert_eq!(
            refused("namespace=prod"),
            "expected the value of namespace as a double-quoted string (\"...\"), found `p` \
             (at character 11)"
        );
        assert_eq!(
            refused("namespace='prod'"),
            "expected the value of namespace as a double-quoted string (\"...\"), found `'` \
             (at character 11)"
        );
        assert_eq!(
            refused(r#"job=="gw""#),
            "expected the value of job as a double-quoted string (\"...\"), found `=` \
             (at character 5)"
        );
        assert_eq!(
            refused(r#"job<"gw""#),
            "expected =, !=, =~ or !~ after job, found `<` (at character 4)"
        );
        assert_eq!(
            refused(r#"1job="gw""#),
            "expected a label name ([a-zA-Z_][a-zA-Z0-9_]*), found `1` (at character 1)"
        );
        assert_eq!(
            refused(r#"job.name="gw""#),
            "expected =, !=, =~ or !~ after job, found `.` (at character 4)"
        );
        // A regular expression Prometheus would refuse at the first query, refused here.
        assert_eq!(
            refused(r#"job="gw",pod=~"gw-(""#),
            "the value of pod is not a regular expression (at character 15): unclosed group"
        );
        assert_eq!(
            refused(r#"pod!~"*x""#),
            "the value of pod is not a regular expression (at character 6): repetition \
             operator missing expression"
        );
        // Only a regular expression's value is one: `(` is a plain value after `=`.
        assert!(parse(r#"pod="gw-(""#).is_ok());
        assert!(parse(r#"pod=~"gw-.+|[a-z]{2,}\\d""#).is_ok());
        // What would be PromQL outside the matchers.
        assert_eq!(
            refused(r#"job="gw"} or vector(1)"#),
            "expected `,` or the end, found `}` (at character 9)"
        );
        assert_eq!(
            refused(r#"{job="gw"} or up"#),
            "expected nothing after the closing `}`, found `o` (at character 12)"
        );
        assert_eq!(
            refused(r#"{job="gw" namespace="x"}"#),
            "expected `,` or the closing `}`, found `n` (at character 11)"
        );
        assert_eq!(
            refused(r#"job="gw"" or up{a="b"#),
            "expected `,` or the end, found `\"` (at character 9)"
        );
        assert_eq!(
            refused(r#"job="gw"#),
            "the value of job has no closing `\"`"
        );
        assert_eq!(
            refused(r#"{job="gw""#),
            "expected `,` or the closing `}`, found the end (at character 10)"
        );
    }

    #[test]
    fn a_bad_escape_is_refused_where_it_is() {
        let refused = |s: &str| parse(s).unwrap_err();
        assert_eq!(
            refused(r#"a="x\qy""#),
            "an unknown escape \\q in the value of a (at character 5)"
        );
        assert_eq!(
            refused(r#"a="\'""#),
            "an unknown escape \\' in the value of a (at character 4)"
        );
        assert_eq!(
            refused(r#"a="\x4""#),
            "an escape that is not \\x and two hex digits in the value of a (at character 4)"
        );
        assert_eq!(
            refused(r#"a="\400""#),
            "an octal escape over 255 (256) in the value of a (at character 4)"
        );
        assert_eq!(
            refused(r#"a="\ud800""#),
            "an escape of no Unicode character (0xd800) in the value of a (at character 4)"
        );
        assert_eq!(
            refused(r#"a="\xff""#),
            "the escapes in the value of a do not make UTF-8 text"
        );
        assert_eq!(
            refused("a=\"x\ny\""),
            "a line break in the value of a (at character 5): write \\n"
        );
        assert_eq!(refused(r#"a="\"#), "the value of a has no closing `\"`");
    }

    #[test]
    fn a_selector_restricts_a_metric_or_leaves_it_alone() {
        let sel = SeriesSelector::parse(r#"{namespace="prod"}"#).unwrap();
        assert_eq!(sel.select("up"), r#"up{namespace="prod"}"#);
        assert_eq!(sel.to_string(), r#"{namespace="prod"}"#);
        assert_eq!(
            sel.and_equal("instance", "a\"b").select("up"),
            r#"up{namespace="prod",instance="a\"b"}"#
        );
        let all = SeriesSelector::default();
        assert!(all.is_empty());
        assert_eq!(all.select("up"), "up");
        assert_eq!(all.matchers(), "");
        assert_eq!(all.to_string(), "");
        assert_eq!(all.and_equal("job", "gw").select("up"), r#"up{job="gw"}"#);
        assert_eq!(
            "a=\"b\"".parse::<SeriesSelector>().unwrap().matchers(),
            "a=\"b\""
        );
    }
}
