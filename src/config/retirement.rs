//! `[retirement]`: the v1 deprecation dates, link and brownout windows, validated, with the
//! signal headers every v1 answer carries rendered once here. The decisions made from them
//! are [`crate::policy::retirement`]'s.

use std::collections::HashMap;
use std::time::SystemTime;

use http::HeaderValue;

use super::auth::Agent;
use super::file::RetirementFile;
use super::types::unix_seconds;
use super::{parse_time, Problems};

/// A scheduled window in which a share of v1 calls is refused, to make stragglers notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brownout {
    pub start: SystemTime,
    pub end: SystemTime,
    /// Share of matching requests refused, 1 to 100.
    pub percent: u8,
    /// The agents it applies to; `None` means every agent that is not exempt.
    pub agents: Option<Vec<String>>,
}

/// The retirement settings of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct Retirement {
    pub deprecated_at: Option<SystemTime>,
    pub sunset_at: Option<SystemTime>,
    pub link: Option<String>,
    pub enforce_sunset: bool,
    pub brownouts: Vec<Brownout>,
    pub quiet_days: u32,
    /// The headers every v1 response carries, rendered once.
    pub headers: Vec<(&'static str, HeaderValue)>,
}

impl Retirement {
    /// Renders the signal headers; call after the dates and link are set.
    pub fn render_headers(&mut self) {
        let mut headers = Vec::new();
        if let Some(t) = self.deprecated_at {
            // RFC 9745: a structured-field Date, `@` and Unix seconds.
            let v = format!("@{}", unix_seconds(t));
            headers.push((
                "deprecation",
                HeaderValue::from_str(&v).expect("digits are a valid header value"),
            ));
        }
        if let Some(t) = self.sunset_at {
            // RFC 8594: an HTTP-date (IMF-fixdate).
            let v = httpdate::fmt_http_date(t);
            headers.push((
                "sunset",
                HeaderValue::from_str(&v).expect("an HTTP-date is a valid header value"),
            ));
        }
        if let Some(link) = &self.link {
            let mut v = format!("<{link}>; rel=\"deprecation\"");
            if self.sunset_at.is_some() {
                v.push_str(&format!(", <{link}>; rel=\"sunset\""));
            }
            if let Ok(v) = HeaderValue::from_str(&v) {
                headers.push(("link", v));
            }
        }
        self.headers = headers;
    }
}

/// Validates `[retirement]`; brownout agents must be configured agents.
pub(super) fn retirement(
    f: &RetirementFile,
    agents: &HashMap<String, Agent>,
    p: &mut Problems,
) -> Retirement {
    let mut r = Retirement {
        deprecated_at: f
            .deprecated_at
            .as_deref()
            .and_then(|s| p.check("retirement.deprecated_at", parse_time(s))),
        sunset_at: f
            .sunset_at
            .as_deref()
            .and_then(|s| p.check("retirement.sunset_at", parse_time(s))),
        link: f.link.clone(),
        enforce_sunset: f.enforce_sunset,
        brownouts: Vec::new(),
        quiet_days: f.quiet_days,
        headers: Vec::new(),
    };
    if let Some(link) = &f.link {
        let ok = (link.starts_with("https://") || link.starts_with("http://"))
            && link
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>' && b != b'"');
        if !ok {
            p.push(
                "retirement.link",
                "must be an http(s) URL without spaces, quotes or angle brackets",
            );
        }
    }
    if f.enforce_sunset && f.sunset_at.is_none() {
        p.push("retirement.enforce_sunset", "needs retirement.sunset_at");
    }
    for (i, b) in f.brownouts.iter().enumerate() {
        let key = format!("retirement.brownouts[{i}]");
        let start = p.check(format!("{key}.start"), parse_time(&b.start));
        let end = p.check(format!("{key}.end"), parse_time(&b.end));
        let percent = b.percent.unwrap_or(100);
        if !(1..=100).contains(&percent) {
            p.push(format!("{key}.percent"), "must be 1 to 100");
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
        match (start, end) {
            (Some(start), Some(end)) if start < end => r.brownouts.push(Brownout {
                start,
                end,
                percent,
                agents: b.agents.clone(),
            }),
            (Some(_), Some(_)) => p.push(format!("{key}.end"), "must be after start"),
            _ => {}
        }
    }
    r.render_headers();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn headers_follow_the_rfcs() {
        let mut r = Retirement {
            deprecated_at: Some(at("2026-06-01T00:00:00Z")),
            sunset_at: Some(at("2027-06-01T00:00:00Z")),
            link: Some("https://example.org/agent-api/v2".into()),
            ..Default::default()
        };
        r.render_headers();
        let get = |n: &str| {
            r.headers
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        assert_eq!(get("deprecation").unwrap(), "@1780272000");
        assert_eq!(get("sunset").unwrap(), "Tue, 01 Jun 2027 00:00:00 GMT");
        assert_eq!(
            get("link").unwrap(),
            "<https://example.org/agent-api/v2>; rel=\"deprecation\", <https://example.org/agent-api/v2>; rel=\"sunset\""
        );
    }

    #[test]
    fn nothing_configured_means_no_headers() {
        let mut r = Retirement::default();
        r.render_headers();
        assert!(r.headers.is_empty());
    }
}
