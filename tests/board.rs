//! The retirement board, `GET /` on the admin listener, over the wire: its answer and headers,
//! and the page as headless Chromium draws it (the one script runs under the
//! Content-Security-Policy, and changes none of the content a browser without JavaScript
//! shows; with an admin token, it opens with the token as a password). The fleet's figures from a real
//! Prometheus are `tests/prometheus_e2e.rs`'s.
//!
//! `UPDATE_SCREENSHOTS=1 cargo test --test board` also writes the screenshot the README and
//! docs/observability.md show, `docs/retirement-board.png`.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use agent_gateway::config::file::{AgentFile, BrownoutFile, Digests};
use agent_gateway::config::testing::TOKEN;
use agent_gateway::config::{Repeat, TokenDigest, V1Policy};

use common::*;

const DAY: Duration = Duration::from_secs(86_400);

/// RFC 3339, to the second, `offset` from now (before it when `past`).
fn date(offset: Duration, past: bool) -> String {
    let now = SystemTime::now();
    let t = if past { now - offset } else { now + offset };
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A retirement under way: five agents on every policy, a global deprecation and sunset, an
/// earlier sunset of one agent's own, a daily brownout ramp that starts tomorrow and a strong
/// one-off window for one agent; `billing` has a rate limit it goes over.
fn plan(backend: &Backend) -> Gateway {
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.deprecated_at = Some(date(30 * DAY, true));
    cfg.retirement.sunset_at = Some(date(90 * DAY, false));
    cfg.auth.agents.extend([
        AgentFile {
            sunset_at: Some(date(20 * DAY, false)),
            rate_limit_per_second: Some(0.001),
            burst: Some(1),
            ..AgentFile::new("billing", TOKEN)
        },
        AgentFile {
            v1_policy: V1Policy::Block,
            ..AgentFile::new("legacy-crm", TOKEN)
        },
        AgentFile::new("mobile-app", TOKEN),
        AgentFile {
            v1_policy: V1Policy::Exempt,
            ..AgentFile::new("partner", TOKEN)
        },
    ]);
    cfg.retirement.brownouts = vec![
        BrownoutFile {
            percent: Some(10),
            percent_end: Some(50),
            repeat: Some(Repeat::Daily),
            until: Some(date(60 * DAY, false)),
            ..BrownoutFile::new(
                &date(DAY, false),
                &date(DAY + Duration::from_secs(1800), false),
            )
        },
        BrownoutFile {
            percent: Some(80),
            agents: Some(vec!["billing".into()]),
            ..BrownoutFile::new(
                &date(Duration::from_secs(3 * 3600), false),
                &date(Duration::from_secs(4 * 3600), false),
            )
        },
    ];
    let gw = Gateway::builder(cfg).start();
    // What happened: agent-1 and billing call both versions, mobile-app only v2, legacy-crm is
    // refused, billing is over its limit on its second call.
    let calls = [
        ("agent-1", "POST", "/api/v1/verify/request", 200),
        ("agent-1", "POST", "/api/v1/verify/request", 200),
        ("agent-1", "POST", "/api/v2/connection/S/invitation", 200),
        ("billing", "POST", "/api/v1/verify/request", 200),
        ("billing", "POST", "/api/v1/verify/request", 429),
        ("legacy-crm", "POST", "/api/v1/verify/request", 410),
        ("mobile-app", "GET", "/api/v2/transaction/t-1/status", 200),
        ("partner", "GET", "/api/v1/transaction/t-1/status", 200),
    ];
    for (agent, method, path, want) in calls {
        assert_eq!(
            as_agent(gw.proxy, agent, method, path, &[]).status,
            want,
            "{agent} {path}"
        );
    }
    let counted = "agent_gateway_requests_by_protocol_total{protocol=\"http/1.1\"}";
    gw.wait_for_metric(counted, calls.len() as f64);
    gw.settled_scrape();
    gw
}

#[test]
fn the_board_answers_html_with_a_strict_policy_and_is_an_admin_endpoint() {
    let backend = Backend::start();
    let gw = plan(&backend);
    let resp = admin_get(gw.admin, "/");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(resp.header("cache-control"), Some("no-store"));
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
    let csp = resp.header("content-security-policy").unwrap();
    assert!(
        csp.starts_with("default-src 'none'; script-src 'sha256-"),
        "{csp}"
    );
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("http"),
        "{csp}"
    );
    let html = resp.text();
    assert!(html.contains("Counts from this gateway alone"), "{html}");
    // Only GET; the route is the admin table's, so the admin token guards it.
    assert_eq!(request(gw.admin, "POST", "/", &[], b"").status, 405);
}

#[test]
fn chromium_shows_every_agent_its_dates_and_figures_and_the_script_adds_no_content() {
    let backend = Backend::start();
    let gw = plan(&backend);
    let url = format!("http://{}/", gw.admin);
    let dir = tempfile::tempdir().unwrap();
    let window = "--window-size=1400,720";

    // JavaScript on: the script ran (the policy let it), and nothing was refused.
    let on = chromium(&dir.path().join("on"), &[window, "--dump-dom", &url]);
    assert!(
        on.status.success(),
        "{}",
        String::from_utf8_lossy(&on.stderr)
    );
    let dom = String::from_utf8(on.stdout).unwrap();
    assert!(
        dom.contains("data-refresh-seconds=\"30\""),
        "the script did not run:\n{dom}"
    );
    let stderr = String::from_utf8_lossy(&on.stderr);
    assert!(!stderr.contains("Content Security Policy"), "{stderr}");

    // JavaScript off, a browser shows the document as served (headless Chromium cannot dump
    // or draw a page with scripts off: its own tooling runs as page script). The script adds
    // nothing to it: every row after it ran is the row as served.
    let served = admin_get(gw.admin, "/").text();
    assert!(!served.contains("data-refresh-seconds=\"30\""));

    let report = admin_get(gw.admin, "/v1-usage").json();
    for agent in report["agents"].as_array().unwrap() {
        let id = agent["agent_id"].as_str().unwrap();
        assert_eq!(board_row(&dom, id), board_row(&served, id));
    }
    for dom in [&dom, &served] {
        // Every configured agent, with the dates /v1-usage gives it.
        for agent in report["agents"].as_array().unwrap() {
            let id = agent["agent_id"].as_str().unwrap();
            let tr = board_row(dom, id);
            for key in ["deprecated_at", "sunset_at"] {
                let at = agent[key].as_str().unwrap();
                assert!(
                    tr.contains(&format!("<time datetime=\"{at}\">")),
                    "{id} {key}: {tr}"
                );
            }
            assert!(tr.contains(agent["v1_policy"].as_str().unwrap()), "{tr}");
        }
        // The figures: calls by version, the 429, the refusal counted as a v1 call.
        assert!(board_row(dom, "agent-1")
            .contains("<td class=\"num calling\">2</td><td class=\"num\">1</td>"));
        assert!(
            board_row(dom, "billing").contains("<td class=\"num\">1</td></tr>"),
            "{}",
            board_row(dom, "billing")
        );
        assert!(board_row(dom, "legacy-crm").contains("<td class=\"num calling\">1</td>"));
        assert!(board_row(dom, "mobile-app").contains("never"));
        // billing's own window in three hours is the plan's next brownout; its own sunset the
        // next sunset; the daily ramp is the others' next window.
        assert!(
            board_row(dom, "billing").contains("80 % <time"),
            "{}",
            board_row(dom, "billing")
        );
        assert!(
            board_row(dom, "mobile-app").contains("10 % <time"),
            "{}",
            board_row(dom, "mobile-app")
        );
        assert!(
            board_row(dom, "partner").contains("<td>none</td>"),
            "exempt: no brownout"
        );
        assert!(dom.contains("refuses 80 % of v1 calls of billing"), "{dom}");
        assert!(dom.contains("v1 ends for billing"), "{dom}");
        // v1 share of the calls: 6 v1 (the 410 and the 429 included) of 8.
        assert!(dom.contains("<div class=\"v\">75 %</div>"), "{dom}");
        // The caveat of /v1-usage: a gateway that just started calls nobody safe to block.
        assert!(dom.contains("Safe to block: this gateway"), "{dom}");
    }

    // What a person sees: the page painted, its table among it.
    let png = dir.path().join("board.png");
    let shot = chromium(
        &dir.path().join("shot"),
        &[window, &format!("--screenshot={}", png.display()), &url],
    );
    assert!(shot.status.success());
    let bytes = std::fs::read(&png).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1400, 720));
    // The policy badges' colours are painted: the stylesheet applied.
    let step = if info.color_type == png::ColorType::Rgba {
        4
    } else {
        3
    };
    let blue = buf[..info.buffer_size()]
        .chunks(step)
        .filter(|p| {
            p[0].abs_diff(0x1f) < 30 && p[1].abs_diff(0x6f) < 30 && p[2].abs_diff(0xeb) < 30
        })
        .count();
    assert!(blue > 100, "{blue} pixels of the allow badge's blue");
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/retirement-board.png");
        std::fs::write(docs, bytes).unwrap();
    }
}

#[test]
fn a_prometheus_that_does_not_answer_leaves_the_gateway_s_own_counts_and_says_why() {
    let backend = Backend::start();
    let closed = ClosedPort::new();
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.prometheus_url = Some(format!("http://{}", closed.addr));
    let gw = Gateway::builder(cfg).start();
    let html = admin_get(gw.admin, "/").text();
    assert!(html.contains("<main data-source=\"gateway\">"), "{html}");
    assert!(
        html.contains(&format!(
            "retirement.prometheus_url is set, but http://{} could not be read (",
            closed.addr
        )),
        "{html}"
    );
    assert!(html.contains("Counts from this gateway alone"), "{html}");
}

#[test]
fn with_an_admin_token_chromium_opens_the_board_with_the_token_as_its_password() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.admin.token_sha256 = Digests(vec![TokenDigest::of(b"board-token").to_hex()]);
    let gw = Gateway::builder(cfg).start();
    let dir = tempfile::tempdir().unwrap();
    let dom = |name: &str, url: &str| {
        let out = chromium(&dir.path().join(name), &["--dump-dom", url]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let board_shown = |dom: &str| dom.contains("Counts from this gateway alone");
    // Without credentials, no board: the answer's Basic challenge makes a person's browser ask
    // for them (a headless one has no one to ask, and shows an empty page).
    let refused = dom("none", &format!("http://{}/", gw.admin));
    assert!(!board_shown(&refused), "{refused}");
    // With them, any user name and the token as the password: the board, every agent on it.
    let board = dom(
        "token",
        &format!("http://on-call:board-token@{}/", gw.admin),
    );
    assert!(board_shown(&board), "{board}");
    assert!(board_row(&board, "agent-1").contains("agent-1"), "{board}");
    // The wrong token, or the token as the user name: no board either (a headless browser shows
    // the same empty page as with none; tests/edge.rs holds the answers to 401).
    for (name, credentials) in [("wrong", "on-call:nope"), ("as-user", "board-token:")] {
        let refused = dom(name, &format!("http://{credentials}@{}/", gw.admin));
        assert!(!board_shown(&refused), "{refused}");
    }
}
