//! The retirement board as a page (`GET /` on the admin listener): the figures of
//! [`crate::observe::board`] as one self-contained HTML document. Its content is complete
//! without JavaScript; one inline script reloads it every 30 s. Nothing is loaded from
//! anywhere: the Content-Security-Policy allows the inline style and script by their SHA-256
//! and nothing else (no other script, font, image, frame or form target), so a page that
//! tried to load anything would break visibly in the test that draws it in Chromium.

use std::sync::OnceLock;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::http1::escape_html;
use crate::observe::board::{AgentRow, Board, PlanEvent, Source};

const STYLE: &str = include_str!("board.css");
const SCRIPT: &str = include_str!("board.js");

/// The page's Content-Security-Policy: its own style and script, by hash, and nothing else.
pub fn content_security_policy() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let hash = |text: &str| {
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
        };
        format!(
            "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash(SCRIPT),
            hash(STYLE)
        )
    })
}

/// A share (0 to 1) as a percentage.
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p == 0.0 || p >= 10.0 {
        format!("{p:.0} %")
    } else {
        format!("{p:.1} %")
    }
}

/// An RFC 3339 time as a `<time>` element, shown to the minute (`2027-01-15 00:00`; the page
/// says its times are UTC).
fn time(at: &str) -> String {
    let shown = match (at.get(..10), at.get(11..16)) {
        (Some(day), Some(minute)) if at.ends_with('Z') => format!("{day} {minute}"),
        _ => at.to_owned(),
    };
    format!(
        "<time datetime=\"{}\">{}</time>",
        escape_html(at),
        escape_html(&shown)
    )
}

fn agents_list(agents: &[String]) -> String {
    match agents.len() {
        0 => "no configured agent".to_owned(),
        1..=4 => escape_html(&agents.join(", ")),
        n => format!(
            "{} and {} more",
            escape_html(&agents[..3].join(", ")),
            n - 3
        ),
    }
}

fn card(key: &str, value: &str, note: &str) -> String {
    format!(
        "<div class=\"card\"><div class=\"k\">{key}</div><div class=\"v\">{value}</div>\
         <div class=\"n\">{note}</div></div>\n"
    )
}

fn event_card(key: &str, event: Option<&PlanEvent>, what: &str) -> String {
    match event {
        None => card(key, "none", "nothing scheduled"),
        Some(e) => card(
            key,
            &time(&e.at),
            &format!(
                "{} · {what} {}",
                escape_html(&e.in_),
                agents_list(&e.agents)
            ),
        ),
    }
}

/// The figures above the table.
fn cards(b: &Board) -> String {
    let calling = b.agents.iter().filter(|a| a.v1_total() > 0).count();
    let safe = b.agents.iter().filter(|a| a.usage.safe_to_block).count();
    let share_note = match b.next_brownout_share {
        Some(s) => format!("refuses {} of v1 calls of", percent(s)),
        None => String::new(),
    };
    [
        card(
            "v1 share of traffic",
            &b.v1_share.map_or("no traffic".to_owned(), percent),
            &escape_html(&b.v1_share_over),
        ),
        event_card(
            "Next brownout window",
            b.next_brownout.as_ref(),
            &share_note,
        ),
        event_card("Next sunset", b.next_sunset.as_ref(), "v1 ends for"),
        card(
            "Agents still calling v1",
            &format!("{calling} of {}", b.agents.len()),
            "in the counts shown",
        ),
        card(
            "Safe to block",
            &safe.to_string(),
            &format!("no v1 call for {} days", b.quiet_days),
        ),
    ]
    .concat()
}

fn cell_time(at: Option<&str>, none: &str) -> String {
    at.map_or_else(|| escape_html(none), time)
}

fn row(a: &AgentRow) -> String {
    let u = &a.usage;
    let id = escape_html(&u.agent_id);
    let policy = escape_html(&u.v1_policy);
    let next = match &a.next_brownout {
        None => "none".to_owned(),
        Some(w) => format!(
            "{} {}<span class=\"n\">{} · until {}</span>",
            percent(w.share),
            time(&w.start),
            escape_html(&w.opens_in),
            time(&w.end)
        ),
    };
    let (v1, v2) = (a.v1_total(), a.v2_total());
    let safe = if u.safe_to_block {
        "<span class=\"yes\">yes</span>"
    } else {
        "<span class=\"no\">no</span>"
    };
    let calling = if v1 > 0 {
        " class=\"num calling\""
    } else {
        " class=\"num\""
    };
    format!(
        "<tr data-agent=\"{id}\"><td>{id}{unconfigured}</td>\
         <td><span class=\"policy {policy}\">{policy}</span></td>\
         <td>{deprecated}</td><td>{sunset}</td><td class=\"num\">{now}</td><td>{next}</td>\
         <td{calling}>{v1}</td><td class=\"num\">{v2}</td><td>{last}</td><td>{safe}</td>\
         <td class=\"num\">{limited}</td></tr>\n",
        unconfigured = if a.configured {
            ""
        } else {
            "<span class=\"n\">not configured here</span>"
        },
        deprecated = cell_time(u.deprecated_at.as_deref(), "-"),
        sunset = cell_time(u.sunset_at.as_deref(), "-"),
        now = percent(a.brownout_share),
        last = cell_time(u.last_v1_call.as_deref(), "never"),
        limited = a.rate_limited,
    )
}

/// The board as a page.
pub fn page(b: &Board) -> String {
    let warning = match &b.source {
        Source::GatewayInstead { prometheus, error } => format!(
            "<p class=\"warn\" id=\"source-warning\">retirement.prometheus_url is set, but \
             {} could not be read ({}): these are this gateway's own counts, not the fleet's.</p>\n",
            escape_html(prometheus),
            escape_html(error)
        ),
        Source::Gateway | Source::Fleet { .. } => String::new(),
    };
    let caveat = b.coverage_note.as_ref().map_or(String::new(), |note| {
        format!(
            "<p class=\"caveat\" id=\"coverage-note\">Safe to block: {}</p>\n",
            escape_html(note)
        )
    });
    let rows: String = b.agents.iter().map(row).collect();
    let source = match b.source {
        Source::Fleet { .. } => "fleet",
        Source::Gateway | Source::GatewayInstead { .. } => "gateway",
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>v1 retirement · agent-gateway</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <main data-source=\"{source}\">\n<h1>v1 retirement</h1>\n\
         <p class=\"sub\" id=\"shown\">Counts from {shown}. As of {generated} UTC; \
         reloads every 30 s with JavaScript on.</p>\n{warning}\
         <section class=\"cards\">\n{cards}</section>\n{caveat}\
         <table id=\"agents\">\n<thead><tr><th>Agent</th><th>Policy</th><th>Deprecated</th>\
         <th>Sunset</th><th>Brownout now</th><th>Next brownout window</th><th>v1 calls</th>\
         <th>v2 calls</th><th>Last v1 call</th><th>Safe to block</th>\
         <th>429s (rate limit)</th></tr></thead>\n<tbody>\n{rows}</tbody>\n</table>\n\
         <p class=\"foot\">The same figures as <code>GET /v1-usage</code> \
         (<code>agent-gateway v1-usage</code>): safe to block = no v1 call for quiet_days \
         ({quiet} days), in data that covers that long. Dates are UTC; the brownout share and \
         dates are this gateway's config.</p>\n</main>\n<script>{SCRIPT}</script>\n\
         </body>\n</html>\n",
        shown = escape_html(&b.shown),
        generated = time(&b.generated_at),
        cards = cards(b),
        quiet = b.quiet_days,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::board::WindowRow;
    use crate::observe::usage::AgentReport;

    fn board(source: Source) -> Board {
        Board {
            generated_at: "2026-12-01T10:10:00Z".into(),
            source,
            shown: "this gateway alone".into(),
            v1_share: Some(0.123),
            v1_share_over: "since this gateway started".into(),
            next_brownout: Some(PlanEvent {
                at: "2026-12-01T14:00:00Z".into(),
                in_: "in 3 h 50 min".into(),
                agents: vec!["<early>".into()],
            }),
            next_brownout_share: Some(0.8),
            next_sunset: None,
            quiet_days: 14,
            coverage_note: Some("covers 1.0 days".into()),
            agents: vec![AgentRow {
                usage: AgentReport {
                    agent_id: "<early>".into(),
                    v1_policy: "allow".into(),
                    deprecated_at: None,
                    sunset_at: Some("2027-01-15T00:00:00Z".into()),
                    v1_requests: [("verify_request".to_owned(), 5)].into(),
                    v2_requests: [("verify_request".to_owned(), 1)].into(),
                    first_v1_call: None,
                    last_v1_call: Some("2026-12-01T10:09:00Z".into()),
                    safe_to_block: false,
                },
                configured: true,
                brownout_share: 0.1,
                next_brownout: Some(WindowRow {
                    start: "2026-12-01T14:00:00Z".into(),
                    end: "2026-12-01T15:00:00Z".into(),
                    share: 0.8,
                    opens_in: "in 3 h 50 min".into(),
                }),
                rate_limited: 4,
            }],
        }
    }

    #[test]
    fn the_page_says_everything_in_its_html_and_escapes_what_it_shows() {
        let html = page(&board(Source::Gateway));
        assert!(html.contains("<tr data-agent=\"&lt;early&gt;\"><td>&lt;early&gt;</td>"));
        assert!(!html.contains("<early>"));
        for want in [
            "12 %",
            "<time datetime=\"2027-01-15T00:00:00Z\">2027-01-15 00:00</time>",
            "80 % <time datetime=\"2026-12-01T14:00:00Z\">",
            "<td class=\"num calling\">5</td>",
            "<td class=\"num\">4</td></tr>",
            "Safe to block: covers 1.0 days",
            "refuses 80 % of v1 calls of &lt;early&gt;",
        ] {
            assert!(html.contains(want), "{want:?} not in\n{html}");
        }
        assert!(!html.contains("source-warning"));
        let html = page(&board(Source::GatewayInstead {
            prometheus: "http://prom:9090".into(),
            error: "connection refused".into(),
        }));
        assert!(html.contains("http://prom:9090 could not be read (connection refused)"));
    }

    #[test]
    fn the_policy_allows_the_inline_style_and_script_by_hash_and_nothing_else() {
        let csp = content_security_policy();
        assert!(
            csp.starts_with("default-src 'none'; script-src 'sha256-"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        let html = page(&board(Source::Gateway));
        // The hashed text is exactly the elements' content.
        assert!(html.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(html.contains(&format!("<style>{STYLE}</style>")));
        assert!(
            !html.contains(" style=\""),
            "inline style attributes are refused"
        );
        for external in ["src=", "href=", "url(", "@import"] {
            assert!(!html.contains(external), "{external} in the page");
        }
    }
}
