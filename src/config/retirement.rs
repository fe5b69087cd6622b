//! `[retirement]`: the v1 deprecation dates (everyone's, and each agent's own), the link and
//! the brownout schedule, validated, with the signal headers of each set of dates rendered
//! once here. The decisions made from them are [`crate::policy::retirement`]'s.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use http::HeaderValue;

use super::auth::{Agent, AgentTable};
use super::file::{AuthFile, BrownoutFile, RetirementFile};
use super::files::Files;
use super::problems::Problems;
use super::selector::SeriesSelector;
use super::types::{parse_time, unix_seconds, Dates, Repeat, Weekday};
use crate::client::redact::redact_url;
use crate::client::{port_is_a_number, ClientOptions};

/// How a brownout window recurs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurrence {
    /// From one window's start to the next one's: a day or a week.
    pub every: Duration,
    /// No window starts at or after this; the ramp reaches `percent_end` here.
    pub until: SystemTime,
    /// Only windows starting on these UTC days; `None` is every day.
    pub days: Option<Vec<Weekday>>,
}

/// A scheduled window, once or recurring, in which a share of v1 calls is refused, to make
/// stragglers notice. The share ramps linearly from `percent` at `start` to `percent_end` at
/// the end of the schedule (`end` once, `until` when recurring).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brownout {
    /// The (first) window's start.
    pub start: SystemTime,
    /// The (first) window's end; a recurring window keeps this length.
    pub end: SystemTime,
    /// Share refused at `start`, 1 to 100.
    pub percent: u8,
    /// Share refused at the end of the schedule, `percent` to 100.
    pub percent_end: u8,
    pub repeat: Option<Recurrence>,
    /// The agents it applies to; `None` means every agent that is not exempt.
    pub agents: Option<Vec<String>>,
}

impl Brownout {
    /// When the ramp reaches `percent_end`: the end of the last window of a one-off, `until`
    /// of a recurring one.
    pub fn ramp_end(&self) -> SystemTime {
        self.repeat.as_ref().map_or(self.end, |r| r.until)
    }
}

/// One set of dates and the signal headers rendered from them.
#[derive(Debug, Clone, Default)]
pub struct Terms {
    pub dates: Dates,
    /// `Deprecation` and `Sunset`, each when its date is set.
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// The `Link` value naming the deprecation (and, with a sunset date, sunset) documents,
    /// when `retirement.link` is set. An answer's successor link is appended to it.
    pub link: Option<String>,
}

impl Terms {
    /// The terms of `dates`, with `link` as the deprecation and sunset documents.
    pub fn new(dates: Dates, link: Option<&str>) -> Terms {
        let mut headers = Vec::new();
        if let Some(t) = dates.deprecated_at {
            // RFC 9745: a structured-field Date, `@` and Unix seconds.
            let v = format!("@{}", unix_seconds(t));
            headers.push((
                "deprecation",
                HeaderValue::from_str(&v).expect("digits are a valid header value"),
            ));
        }
        if let Some(t) = dates.sunset_at {
            // RFC 8594: an HTTP-date (IMF-fixdate).
            let v = httpdate::fmt_http_date(t);
            headers.push((
                "sunset",
                HeaderValue::from_str(&v).expect("an HTTP-date is a valid header value"),
            ));
        }
        let link = link.map(|link| {
            let mut v = format!("<{link}>; rel=\"deprecation\"");
            if dates.sunset_at.is_some() {
                v.push_str(&format!(", <{link}>; rel=\"sunset\""));
            }
            v
        });
        Terms {
            dates,
            headers,
            link,
        }
    }
}

/// The retirement settings of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct RetirementConfig {
    /// `[retirement]`'s dates: those of every agent without dates of its own, and of calls
    /// by no known agent.
    pub terms: Terms,
    /// Agents with a date of their own, by id: their effective dates (their own, the rest
    /// `[retirement]`'s).
    pub agent_terms: HashMap<String, Terms>,
    pub enforce_sunset: bool,
    pub brownouts: Vec<Brownout>,
    pub quiet_days: u32,
    /// Where the retirement board reads the fleet's figures; `None`: this gateway's own.
    pub prometheus_url: Option<String>,
    /// How it is reached: a CA file, a token or basic auth from a file.
    pub prometheus_client: ClientOptions,
    /// This deployment's series in that Prometheus; none: every replica it scrapes.
    pub prometheus_selector: SeriesSelector,
}

impl RetirementConfig {
    /// The dates and signals that apply to a call by `agent` (None: no known agent).
    pub fn terms_for(&self, agent: Option<&Agent>) -> &Terms {
        match agent {
            Some(a) if !self.agent_terms.is_empty() => self.agent_terms.get(&a.id),
            _ => None,
        }
        .unwrap_or(&self.terms)
    }
}

/// Validates `[retirement]`; brownout agents must be configured agents. `auth` locates each
/// agent's problems by key path.
pub(super) fn retirement(
    f: &RetirementFile,
    auth: &AuthFile,
    agents: &AgentTable,
    files: &mut Files,
    p: &mut Problems,
) -> RetirementConfig {
    let date = |key: &str, value: &Option<String>, p: &mut Problems| {
        p.check(key.to_owned(), parse_time(value.as_deref()?))
    };
    let dates = Dates {
        deprecated_at: date("retirement.deprecated_at", &f.deprecated_at, p),
        sunset_at: date("retirement.sunset_at", &f.sunset_at, p),
    };
    if let Some(link) = &f.link {
        if let Err(problem) = check_link(link) {
            p.push("retirement.link", problem);
        }
    }
    check_order(dates, "retirement.sunset_at", p);

    let mut agent_terms = HashMap::new();
    for (i, a) in auth.agents.iter().enumerate() {
        let Some(agent) = agents.get(&a.id) else {
            continue;
        };
        if agent.dates != Dates::default() {
            let effective = agent.dates.or(dates);
            check_order(effective, &format!("auth.agents[{i}].sunset_at"), p);
            agent_terms.insert(a.id.clone(), Terms::new(effective, f.link.as_deref()));
        }
    }
    let any_sunset =
        dates.sunset_at.is_some() || agents.values().any(|a| a.dates.sunset_at.is_some());
    if f.enforce_sunset && !any_sunset {
        p.push(
            "retirement.enforce_sunset",
            "needs retirement.sunset_at or an agent's sunset_at",
        );
    }
    if let Some(url) = &f.prometheus_url {
        if let Err(e) = crate::client::check_url_without_credentials(url) {
            p.push("retirement.prometheus_url", e.to_string());
        }
    }
    let prometheus_selector = match &f.prometheus_selector {
        Some(text) => p
            .check(
                "retirement.prometheus_selector",
                SeriesSelector::parse(text),
            )
            .unwrap_or_default(),
        None => SeriesSelector::default(),
    };
    let of_the_url = [
        ("prometheus_ca_file", &f.prometheus_ca_file),
        ("prometheus_token_file", &f.prometheus_token_file),
        ("prometheus_basic_auth_file", &f.prometheus_basic_auth_file),
        ("prometheus_selector", &f.prometheus_selector),
    ];
    for (key, value) in of_the_url {
        if value.is_some() && f.prometheus_url.is_none() {
            p.push(
                format!("retirement.{key}"),
                "needs retirement.prometheus_url",
            );
        }
    }
    if f.prometheus_ca_file.is_some()
        && f.prometheus_url
            .as_deref()
            .is_some_and(|u| !crate::client::ca_file_applies(u))
    {
        p.push(
            "retirement.prometheus_ca_file",
            "is for an https:// prometheus_url only",
        );
    }
    if f.prometheus_token_file.is_some() && f.prometheus_basic_auth_file.is_some() {
        p.push(
            "retirement.prometheus_basic_auth_file",
            "a bearer token and basic auth: give one of the two",
        );
    }
    let brownouts = f
        .brownouts
        .iter()
        .enumerate()
        .filter_map(|(i, b)| brownout(b, &format!("retirement.brownouts[{i}]"), agents, p))
        .collect();
    // Read at each use (a rotated token needs no reload), so only located here: relative to
    // the config's directory like every file it names. One that cannot be read is warned of
    // (`check-config`, `run`), never a problem: the board is no reason to refuse a config.
    let prometheus_client = ClientOptions {
        ca_file: f.prometheus_ca_file.as_deref().map(|n| files.locate(n)),
        token_file: f.prometheus_token_file.as_deref().map(|n| files.locate(n)),
        basic_auth_file: f
            .prometheus_basic_auth_file
            .as_deref()
            .map(|n| files.locate(n)),
    };
    RetirementConfig {
        terms: Terms::new(dates, f.link.as_deref()),
        agent_terms,
        enforce_sunset: f.enforce_sunset,
        brownouts,
        quiet_days: f.quiet_days,
        prometheus_url: f.prometheus_url.clone(),
        prometheus_client,
        prometheus_selector,
    }
}

/// Whether `link` can go into every v1 answer's `Link` header as it is: an http(s) URL with
/// nothing that would end its `<...>` early, no user information (each v1 client would get
/// it) and a port of digits. A URL whose password holds an unencoded `/` (`user:pw/x@host`)
/// reads as host `user` and port `pw`: refused for its port. The problem shows the URL with
/// its password redacted.
fn check_link(link: &str) -> Result<(), String> {
    let in_brackets = link
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>' && b != b'"');
    let rest = link
        .strip_prefix("https://")
        .or_else(|| link.strip_prefix("http://"))
        .filter(|_| in_brackets)
        .ok_or("must be an http(s) URL without spaces, quotes or angle brackets")?;
    // The authority ends at the first `/`, `?` or `#` (RFC 3986 §3.2), as a client reads it.
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let shown = redact_url(link);
    if authority.contains('@') {
        return Err(format!(
            "{shown}: must not carry a user or password (it is sent to every v1 client, in Link)"
        ));
    }
    let parsed: http::uri::Authority = authority
        .parse()
        .map_err(|e| format!("{shown}: its host is not valid ({e})"))?;
    if !port_is_a_number(&parsed) {
        return Err(format!("{shown}: its port is not a number from 0 to 65535"));
    }
    Ok(())
}

/// A sunset before the deprecation it ends is a typo (RFC 9745 §3: deprecation announces the
/// sunset); reported under `key`.
fn check_order(dates: Dates, key: &str, p: &mut Problems) {
    if let (Some(deprecated), Some(sunset)) = (dates.deprecated_at, dates.sunset_at) {
        if sunset < deprecated {
            p.push(key, "must not be before the deprecation date that applies");
        }
    }
}

/// Validates one brownout, every problem under `key`.
fn brownout(
    b: &BrownoutFile,
    key: &str,
    agents: &AgentTable,
    p: &mut Problems,
) -> Option<Brownout> {
    let start = p.check(format!("{key}.start"), parse_time(&b.start));
    let end = p.check(format!("{key}.end"), parse_time(&b.end));
    let percent = b.percent.unwrap_or(100);
    if !(1..=100).contains(&percent) {
        p.push(format!("{key}.percent"), "must be 1 to 100");
    }
    let percent_end = b.percent_end.unwrap_or(percent);
    if !(percent..=100).contains(&percent_end) {
        p.push(
            format!("{key}.percent_end"),
            "must be percent to 100: a ramp only rises, so a refused request id stays refused",
        );
    }
    if let Some(list) = &b.agents {
        for (j, id) in list.iter().enumerate() {
            if !agents.contains_key(id) {
                p.push(
                    format!("{key}.agents[{j}]"),
                    format!("{id:?} is not a configured agent"),
                );
            }
        }
    }
    let until = match &b.until {
        Some(u) => p.check(format!("{key}.until"), parse_time(u)),
        None => None,
    };
    if b.until.is_some() != b.repeat.is_some() {
        p.push(format!("{key}.until"), "until and repeat go together");
    }
    if b.days.is_some() && b.repeat != Some(Repeat::Daily) {
        p.push(format!("{key}.days"), "needs repeat = \"daily\"");
    }
    if b.days.as_ref().is_some_and(Vec::is_empty) {
        p.push(format!("{key}.days"), "must name at least one day");
    }
    let (start, end) = (start?, end?);
    if start >= end {
        p.push(format!("{key}.end"), "must be after start");
        return None;
    }
    let repeat = match (b.repeat, until) {
        (Some(repeat), Some(until)) => {
            let every = repeat.period();
            if end.duration_since(start).unwrap_or_default() >= every {
                p.push(
                    format!("{key}.end"),
                    "a recurring window must be shorter than its period (a day or a week)",
                );
            }
            if until <= start {
                p.push(format!("{key}.until"), "must be after start");
            }
            Some(Recurrence {
                every,
                until,
                days: b.days.clone(),
            })
        }
        _ => None,
    };
    Some(Brownout {
        start,
        end,
        percent,
        percent_end,
        repeat,
        agents: b.agents.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::{AgentFile, BrownoutFile};
    use crate::config::testing::{self, AGENT_ID, TOKEN};
    use crate::config::Snapshot;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn header(terms: &Terms, name: &str) -> Option<String> {
        terms
            .headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_str().unwrap().to_string())
    }

    #[test]
    fn headers_follow_the_rfcs() {
        let dates = Dates {
            deprecated_at: Some(at("2026-06-01T00:00:00Z")),
            sunset_at: Some(at("2027-06-01T00:00:00Z")),
        };
        let terms = Terms::new(dates, Some("https://example.org/agent-api/v2"));
        assert_eq!(header(&terms, "deprecation").unwrap(), "@1780272000");
        assert_eq!(
            header(&terms, "sunset").unwrap(),
            "Tue, 01 Jun 2027 00:00:00 GMT"
        );
        assert_eq!(
            terms.link.unwrap(),
            "<https://example.org/agent-api/v2>; rel=\"deprecation\", <https://example.org/agent-api/v2>; rel=\"sunset\""
        );
    }

    #[test]
    fn nothing_configured_means_no_headers() {
        let terms = Terms::new(Dates::default(), None);
        assert!(terms.headers.is_empty() && terms.link.is_none());
    }

    #[test]
    fn an_agents_own_dates_override_the_global_ones_for_it_alone() {
        let mut f = testing::config();
        f.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
        f.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
        f.auth.agents.push(AgentFile {
            sunset_at: Some("2026-09-01T00:00:00Z".into()),
            ..AgentFile::new("early", TOKEN)
        });
        let s = f.snapshot();
        let r = &s.retirement;
        let early = r.terms_for(Some(&s.auth.agents["early"]));
        assert_eq!(early.dates.sunset_at, Some(at("2026-09-01T00:00:00Z")));
        assert_eq!(early.dates.deprecated_at, Some(at("2026-06-01T00:00:00Z")));
        assert_eq!(
            header(early, "sunset").unwrap(),
            "Tue, 01 Sep 2026 00:00:00 GMT"
        );
        let other = r.terms_for(Some(&s.auth.agents[AGENT_ID]));
        assert_eq!(other.dates.sunset_at, Some(at("2027-06-01T00:00:00Z")));
        assert_eq!(r.terms_for(None).dates, other.dates);
    }

    #[test]
    fn date_problems_are_reported_by_key() {
        let mut f = testing::config();
        f.retirement.deprecated_at = Some("2027-01-01T00:00:00Z".into());
        f.agent_mut(AGENT_ID).sunset_at = Some("2026-12-01T00:00:00Z".into());
        assert_eq!(f.refused_keys(), ["auth.agents[0].sunset_at"]);
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).deprecated_at = Some("tomorrow".into());
        assert_eq!(f.refused_keys(), ["auth.agents[0].deprecated_at"]);
        let mut f = testing::config();
        f.retirement.enforce_sunset = true;
        assert_eq!(f.refused_keys(), ["retirement.enforce_sunset"]);
        // An agent's own sunset is enough to enforce.
        let mut f = testing::config();
        f.retirement.enforce_sunset = true;
        f.agent_mut(AGENT_ID).sunset_at = Some("2026-12-01T00:00:00Z".into());
        assert!(Snapshot::from_file(f).is_ok());
    }

    #[test]
    fn the_link_is_an_http_url_without_a_user_or_password() {
        for good in [
            "https://example.org/agent-api/v2",
            "http://docs.example:8080/v2?from=v1#migrating",
            "https://[2001:db8::1]:8443/v2",
            "https://docs.example?page=v2",
            // An `@` past the authority is the path's: no user.
            "https://medium.example/@platform-team/v2",
        ] {
            assert_eq!(check_link(good), Ok(()), "{good}");
        }
        for bad in [
            "docs.example/v2",
            "ftp://docs.example/v2",
            "https://docs.example/v 2",
            "https://docs.example/<v2>",
        ] {
            assert_eq!(
                check_link(bad).unwrap_err(),
                "must be an http(s) URL without spaces, quotes or angle brackets",
                "{bad}"
            );
        }
        for (bad, problem) in [
            (
                "https://docs:link-pw@docs.example/v2",
                "https://docs:<redacted>@docs.example/v2: must not carry a user or password",
            ),
            (
                "https://docs@docs.example/v2",
                "https://docs@docs.example/v2: must not carry a user or password",
            ),
            (
                "http://docs:link-pw@docs.example?x=1",
                "http://docs:<redacted>@docs.example?x=1: must not carry a user or password",
            ),
            // Unencoded, the password's `/` ends the authority: host `docs`, port `link`.
            (
                "https://docs:link/pw@docs.example/v2",
                "https://docs:<redacted>@docs.example/v2: its port is not a number",
            ),
            (
                "https://[2001:db8::1]:8443x/v2",
                "https://[2001:db8::1]:8443x/v2: its port is not a number",
            ),
            // Digits, but no port (`http` takes them all the same): the one check of every URL.
            (
                "https://docs.example:99999/v2",
                "https://docs.example:99999/v2: its port is not a number from 0 to 65535",
            ),
            (
                "https://docs.example:/v2",
                "https://docs.example:/v2: its port is not a number",
            ),
        ] {
            let refused = check_link(bad).unwrap_err();
            assert!(refused.starts_with(problem), "{bad}: {refused}");
        }
        let mut f = testing::config();
        f.retirement.link = Some("https://docs:link-pw@docs.example/v2".into());
        assert_eq!(f.refused_keys(), ["retirement.link"]);
    }

    #[test]
    fn the_prometheus_url_is_a_url_without_credentials() {
        let with = |url: &str| {
            let mut f = testing::config();
            f.retirement.prometheus_url = Some(url.into());
            f
        };
        let s = with("https://prometheus.example:9090/prom").snapshot();
        assert_eq!(
            s.retirement.prometheus_url.as_deref(),
            Some("https://prometheus.example:9090/prom")
        );
        let with = |url: &str| with(url).refused_keys();
        assert_eq!(with("prometheus:9090"), ["retirement.prometheus_url"]);
        assert_eq!(
            with("http://ops:secret@prometheus:9090"),
            ["retirement.prometheus_url"]
        );
        // Credentials come from files, one kind at a time, and only with a URL.
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            Some(path.display().to_string())
        };
        let (token, pair) = (file("token", "t0ken\n"), file("pair", "ops:pw"));
        let mut f = testing::config();
        f.retirement.prometheus_token_file = token.clone();
        assert_eq!(f.refused_keys(), ["retirement.prometheus_token_file"]);
        let mut f = testing::config();
        f.retirement.prometheus_url = Some("https://prometheus:9090".into());
        f.retirement.prometheus_token_file = token.clone();
        f.retirement.prometheus_basic_auth_file = pair;
        assert_eq!(f.refused_keys(), ["retirement.prometheus_basic_auth_file"]);
        // A CA file is for TLS.
        let mut f = testing::config();
        f.retirement.prometheus_url = Some("http://prometheus:9090".into());
        f.retirement.prometheus_ca_file = Some("ca.pem".into());
        assert_eq!(f.clone().refused_keys(), ["retirement.prometheus_ca_file"]);
        f.retirement.prometheus_url = Some("https://prometheus:9090".into());
        f.snapshot();
        // Each file is located beside the config and read at each use: one that is missing
        // is no problem of the config (check-config and run warn of it).
        let mut f = testing::config();
        f.retirement.prometheus_url = Some("https://prometheus:9090".into());
        f.retirement.prometheus_token_file = token;
        let s = f.clone().snapshot();
        assert_eq!(
            s.retirement.prometheus_client.token_file,
            Some(dir.path().join("token"))
        );
        f.retirement.prometheus_token_file = Some(dir.path().join("nothing").display().to_string());
        assert!(Snapshot::from_file(f).is_ok());
    }

    #[test]
    fn the_prometheus_selector_is_label_matchers_for_a_prometheus_url() {
        let with = |selector: &str| {
            let mut f = testing::config();
            f.retirement.prometheus_url = Some("http://prometheus:9090".into());
            f.retirement.prometheus_selector = Some(selector.into());
            f
        };
        let s = with(r#"{ job = "agent-gateway", namespace="prod" }"#).snapshot();
        assert_eq!(
            s.retirement.prometheus_selector.matchers(),
            r#"job="agent-gateway",namespace="prod""#
        );
        assert!(testing::config()
            .snapshot()
            .retirement
            .prometheus_selector
            .is_empty());
        let problems = |f: crate::config::FileConfig| -> Vec<String> {
            let e = Snapshot::from_file(f).unwrap_err();
            e.problems().iter().map(ToString::to_string).collect()
        };
        assert_eq!(
            problems(with(r#"namespace="prod"} or vector(1)"#)),
            ["retirement.prometheus_selector: expected `,` or the end, found `}` (at character 17)"]
        );
        assert_eq!(
            with(r#"up{job="gw"}"#).refused_keys(),
            ["retirement.prometheus_selector"]
        );
        // Like the other prometheus_* keys, it needs the URL.
        let mut f = testing::config();
        f.retirement.prometheus_selector = Some(r#"namespace="prod""#.into());
        assert_eq!(
            problems(f),
            ["retirement.prometheus_selector: needs retirement.prometheus_url"]
        );
    }

    #[test]
    fn a_recurring_ramp_is_one_block() {
        let mut f = testing::config();
        f.retirement.brownouts.push(BrownoutFile {
            percent: Some(10),
            percent_end: Some(50),
            repeat: Some(Repeat::Daily),
            until: Some("2027-03-01T00:00:00Z".into()),
            days: Some(vec![
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri,
            ]),
            ..BrownoutFile::new("2026-12-01T10:00:00Z", "2026-12-01T10:30:00Z")
        });
        let s = f.snapshot();
        let b = &s.retirement.brownouts[0];
        assert_eq!((b.percent, b.percent_end), (10, 50));
        let r = b.repeat.as_ref().unwrap();
        assert_eq!(r.every, Duration::from_secs(86_400));
        assert_eq!(b.ramp_end(), at("2027-03-01T00:00:00Z"));
        assert_eq!(r.days.as_ref().unwrap().len(), 5);
    }

    #[test]
    fn brownout_problems_are_reported_by_key() {
        let with = |edit: fn(&mut BrownoutFile)| {
            let mut f = testing::config();
            let mut b = BrownoutFile::new("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z");
            edit(&mut b);
            f.retirement.brownouts.push(b);
            f.refused_keys()
        };
        assert_eq!(
            with(|b| b.end = "2026-12-01T09:00:00Z".into()),
            ["retirement.brownouts[0].end"]
        );
        assert_eq!(
            with(|b| {
                b.percent = Some(50);
                b.percent_end = Some(40);
            }),
            ["retirement.brownouts[0].percent_end"]
        );
        assert_eq!(
            with(|b| b.repeat = Some(Repeat::Weekly)),
            ["retirement.brownouts[0].until"]
        );
        assert_eq!(
            with(|b| b.until = Some("2027-01-01T00:00:00Z".into())),
            ["retirement.brownouts[0].until"]
        );
        assert_eq!(
            with(|b| {
                b.repeat = Some(Repeat::Weekly);
                b.until = Some("2027-01-01T00:00:00Z".into());
                b.days = Some(vec![Weekday::Mon]);
            }),
            ["retirement.brownouts[0].days"]
        );
        assert_eq!(
            with(|b| {
                b.repeat = Some(Repeat::Daily);
                b.until = Some("2027-01-01T00:00:00Z".into());
                b.end = "2026-12-02T10:00:00Z".into();
            }),
            ["retirement.brownouts[0].end"]
        );
        assert_eq!(
            with(|b| {
                b.repeat = Some(Repeat::Daily);
                b.until = Some("2026-11-01T00:00:00Z".into());
            }),
            ["retirement.brownouts[0].until"]
        );
        assert_eq!(
            with(|b| b.agents = Some(vec!["nobody".into()])),
            ["retirement.brownouts[0].agents[0]"]
        );
    }
}
