//! Retiring v1 against real processes: signal headers and successor links, policies,
//! per-agent dates, brownouts (ramps and recurring windows), sunset and its rehearsal,
//! `/v1-usage` and the `v1-usage` command, and policy changes on hot reload. The clock is
//! moved through config dates, never by sleeping.

mod common;

use std::time::{Duration, SystemTime};

use agent_gateway::config::file::{AgentFile, BrownoutFile};
use agent_gateway::config::testing::TOKEN;
use agent_gateway::config::{Repeat, V1Policy, Weekday};
use agent_gateway::policy::retirement::bucket;
use common::*;

const DAY: Duration = Duration::from_secs(86_400);
const YEAR: Duration = Duration::from_secs(365 * 86_400);

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Agent `id` (token [`TOKEN`]) with v1 policy `policy`.
fn agent(id: &str, policy: V1Policy) -> AgentFile {
    AgentFile {
        v1_policy: policy,
        ..AgentFile::new(id, TOKEN)
    }
}

/// A brownout from `start` to `end` for every agent that is not exempt.
fn brownout(start: SystemTime, end: SystemTime, percent: Option<u8>) -> BrownoutFile {
    BrownoutFile {
        percent,
        ..BrownoutFile::new(&rfc3339(start), &rfc3339(end))
    }
}

#[test]
fn v1_responses_carry_the_deprecation_signals_and_v2_ones_do_not() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
    cfg.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
    cfg.retirement.link = Some("https://example.org/agent-api/v2".into());
    let gw = Gateway::builder(cfg).start();
    let v1 = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(v1.status, 200);
    assert_eq!(v1.header("deprecation"), Some("@1780272000"));
    assert_eq!(v1.header("sunset"), Some("Tue, 01 Jun 2027 00:00:00 GMT"));
    assert_eq!(
        v1.header("link"),
        Some("<https://example.org/agent-api/v2>; rel=\"deprecation\", <https://example.org/agent-api/v2>; rel=\"sunset\", </api/v2/verify/ORG_DEFAULT/request>; rel=\"successor-version\"")
    );
    // The gateway's own answers to v1 calls carry them too.
    let refused = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &[],
        BODY.as_bytes(),
    );
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("deprecation"), Some("@1780272000"));

    let v2 = post(gw.proxy, "/api/v2/verify/S/request", BODY);
    assert_eq!(v2.status, 200);
    for h in ["deprecation", "sunset", "link"] {
        assert_eq!(v2.header(h), None, "{h} on a v2 response");
    }
}

/// `retirement.link` goes to every v1 client, in `Link`: a user and password in it
/// (`https://user:pw@...`) would be handed to each of them. It is refused by `check-config`,
/// at start and by a reload, which keeps the link in service; no problem shows the password.
#[test]
fn a_link_with_a_user_or_password_is_refused_and_never_sent() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    cfg.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
    cfg.retirement.link = Some("https://example.org/agent-api/v2".into());
    let gw = Gateway::builder(cfg.clone()).start();
    let mut bad = cfg;
    bad.retirement.link = Some("https://docs:link-pw@docs.example/v2".into());

    gw.write_config(&bad);
    let answer = request(gw.admin, "POST", "/-/reload", &[], b"");
    let v1 = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(v1.status, 200);
    let link = v1.header("link").unwrap_or_default();
    assert!(!link.contains("link-pw"), "sent to a v1 client: {link}");
    assert!(
        link.starts_with("<https://example.org/agent-api/v2>; rel=\"deprecation\""),
        "{link}"
    );
    assert_eq!(answer.status, 422, "{}", answer.text());
    let problems = answer.json()["problems"].clone();
    assert_eq!(problems.as_array().map(Vec::len), Some(1), "{problems}");
    assert_eq!(problems[0]["key"], "retirement.link");
    let message = problems[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("https://docs:<redacted>@docs.example/v2: must not carry a user"),
        "{message}"
    );

    let checked = cli(["check-config".as_ref(), gw.config_path.as_os_str()]);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success(), "{stderr}");
    assert!(stderr.contains("retirement.link"), "{stderr}");
    gw.wait_until("the refusal in the log", || {
        gw.log().contains("config reload refused")
    });
    for (what, text) in [("check-config", &*stderr), ("the log", &gw.log())] {
        assert!(!text.contains("link-pw"), "the password in {what}:\n{text}");
    }
    let run = Gateway::builder(bad).process().exit_status();
    assert!(!run.success());
    assert_ne!(run.code(), Some(101), "a panic, not a refusal");
}

#[test]
fn blocked_agents_get_410_naming_the_v2_path_and_nothing_is_forwarded() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(AgentFile {
        default_service: Some("LEGACY".into()),
        ..agent("legacy", V1Policy::Block)
    });
    let gw = Gateway::builder(cfg).start();
    let cases = [
        (
            "POST",
            "/api/v1/verify/request",
            "use POST /api/v2/verify/LEGACY/request instead",
        ),
        (
            "POST",
            "/api/v1/verify/response",
            "use POST /api/v2/verify/response instead",
        ),
        (
            "POST",
            "/api/v1/connection/invitation",
            "use POST /api/v2/connection/LEGACY/invitation instead",
        ),
        (
            "POST",
            "/api/v1/credential/offer",
            "use POST /api/v2/credential/LEGACY/offer instead",
        ),
        (
            "GET",
            "/api/v1/transaction/t/status",
            "use GET /api/v2/transaction/t/status instead",
        ),
    ];
    for (method, path, hint) in cases {
        let resp = as_agent(gw.proxy, "legacy", method, path, &[]);
        assert_eq!(resp.status, 410, "{path}");
        let body = resp.json();
        assert_eq!(body["status_code"], 410);
        assert_eq!(body["message_code"], 41001);
        assert!(body["message"].as_str().unwrap().ends_with(hint), "{body}");
    }
    assert_eq!(backend.count(), 0);
    // v2 is unaffected; other agents too.
    assert_eq!(
        as_agent(gw.proxy, "legacy", "POST", "/api/v2/verify/S/request", &[]).status,
        200
    );
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"legacy\",reason=\"blocked\"}"),
        5.0
    );
}

#[test]
fn a_brownout_window_refuses_with_retry_after_and_spares_exempt_agents() {
    let backend = Backend::start();
    let now = SystemTime::now();
    let end = now + Duration::from_secs(3600);
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("vip", V1Policy::Exempt));
    cfg.auth.agents.push(agent("plain", V1Policy::Allow));
    let started = now - Duration::from_secs(3600);
    cfg.retirement.brownouts.push(brownout(started, end, None));
    let gw = Gateway::builder(cfg).start();
    let resp = as_agent(gw.proxy, "plain", "POST", "/api/v1/verify/request", &[]);
    assert_eq!(resp.status, 410);
    assert_eq!(resp.json()["message_code"], 41002);
    assert_eq!(
        resp.header("retry-after"),
        Some(httpdate::fmt_http_date(end).as_str())
    );
    assert_eq!(
        as_agent(gw.proxy, "vip", "POST", "/api/v1/verify/request", &[]).status,
        200
    );
    assert_eq!(
        as_agent(gw.proxy, "plain", "POST", "/api/v2/verify/S/request", &[]).status,
        200
    );
    assert_eq!(backend.count(), 2);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"plain\",reason=\"brownout\"}"),
        1.0
    );
}

#[test]
fn a_partial_brownout_answers_the_same_request_id_the_same_way() {
    let backend = Backend::start();
    let now = SystemTime::now();
    let mut cfg = test_config(&[backend.addr]);
    let (start, end) = (
        now - Duration::from_secs(60),
        now + Duration::from_secs(3600),
    );
    cfg.retirement
        .brownouts
        .push(brownout(start, end, Some(50)));
    let gw = Gateway::builder(cfg).start();
    let mut refused = 0;
    for i in 0..40 {
        let id = format!("retry-me-{i}");
        let call = || {
            as_agent(
                gw.proxy,
                "agent-1",
                "POST",
                VERIFY_V1,
                &[("X-Request-Id", &id)],
            )
        };
        let first = call().status;
        assert_eq!(first, call().status, "{id} answered differently on retry");
        // The id's bucket decides, so every process refuses the same half.
        let want = if bucket(&id) < 50 { 410 } else { 200 };
        assert_eq!(first, want, "{id} (bucket {})", bucket(&id));
        refused += usize::from(first == 410);
    }
    assert!(
        (8..=32).contains(&refused),
        "about half of 40 ids should be refused, got {refused}"
    );
}

#[test]
fn sunset_is_enforced_only_when_configured() {
    let backend = Backend::start();
    let past = rfc3339(SystemTime::now() - Duration::from_secs(86_400));
    let mut lenient = test_config(&[backend.addr]);
    lenient.retirement.sunset_at = Some(past.clone());
    let gw = Gateway::builder(lenient).start();
    assert_eq!(
        post(gw.proxy, "/api/v1/verify/request", BODY).status,
        200,
        "no cut-off by a clock alone"
    );
    drop(gw);
    let mut strict = test_config(&[backend.addr]);
    strict.retirement.sunset_at = Some(past);
    strict.auth.agents.push(agent("vip", V1Policy::Exempt));
    strict.retirement.enforce_sunset = true;
    let gw = Gateway::builder(strict).start();
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(
        (resp.status, resp.json()["message_code"].as_i64()),
        (410, Some(41003))
    );
    assert_eq!(
        as_agent(gw.proxy, "vip", "POST", "/api/v1/verify/request", &[]).status,
        200
    );
    assert_eq!(post(gw.proxy, "/api/v2/verify/S/request", BODY).status, 200);
}

#[test]
fn a_policy_change_applies_on_hot_reload() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("moving", V1Policy::Allow));
    let gw = Gateway::builder(cfg).start();
    let with_policy = |policy| {
        let mut cfg = gw.config.clone();
        cfg.agent_mut("moving").v1_policy = policy;
        cfg
    };
    let v1_status = || as_agent(gw.proxy, "moving", "POST", VERIFY_V1, &[]).status;
    assert_eq!(v1_status(), 200);
    gw.write_config(&with_policy(V1Policy::Block));
    gw.wait_until("the block to apply", || v1_status() == 410);
    gw.write_config(&with_policy(V1Policy::Exempt));
    gw.wait_until("the exemption to apply", || v1_status() == 200);
}

#[test]
fn v1_usage_reports_a_known_mix() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("old", V1Policy::Allow));
    cfg.auth.agents.push(AgentFile {
        sunset_at: Some("2026-01-01T00:00:00Z".into()),
        ..agent("new", V1Policy::Block)
    });
    cfg.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
    cfg.retirement.quiet_days = 0;
    let gw = Gateway::builder(cfg).start();
    for _ in 0..3 {
        as_agent(gw.proxy, "old", "POST", "/api/v1/verify/request", &[]);
    }
    as_agent(gw.proxy, "old", "GET", "/api/v1/transaction/t/status", &[]);
    as_agent(gw.proxy, "old", "POST", "/api/v2/credential/S/offer", &[]);
    as_agent(gw.proxy, "new", "POST", "/api/v2/verify/S/request", &[]);
    as_agent(gw.proxy, "new", "POST", "/api/v1/verify/response", &[]); // refused, still a v1 call

    let report = gw.v1_usage();
    let agents = report["agents"].as_array().unwrap();
    let find = |id: &str| agents.iter().find(|a| a["agent_id"] == id).unwrap().clone();
    let old = find("old");
    assert_eq!(old["v1_requests"]["verify_request"], 3);
    assert_eq!(old["v1_requests"]["transaction_status"], 1);
    assert_eq!(old["v2_requests"]["credential_offer"], 1);
    assert_eq!(old["v1_policy"], "allow");
    assert!(old["first_v1_call"].is_string() && old["last_v1_call"].is_string());
    assert_eq!(old["sunset_at"], "2027-06-01T00:00:00Z");
    let new = find("new");
    assert_eq!(new["v1_policy"], "block");
    assert_eq!(new["sunset_at"], "2026-01-01T00:00:00Z", "its own date");
    assert_eq!(new["deprecated_at"], serde_json::Value::Null);
    assert_eq!(new["v1_requests"]["verify_response"], 1);
    assert_eq!(new["v2_requests"]["verify_request"], 1);
    // agent-1 made no call at all: with quiet_days = 0 it is safe to block.
    assert_eq!(find("agent-1")["safe_to_block"], true);
    assert_eq!(find("agent-1")["last_v1_call"], serde_json::Value::Null);
    assert!(gw.metric("agent_gateway_v1_last_seen_timestamp_seconds{agent_id=\"old\"}") > 1.7e9);

    let out = cli(["v1-usage", "--admin", &format!("http://{}", gw.admin)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("AGENT"), "{table}");
    let old_row = table
        .lines()
        .find(|l| l.starts_with("old "))
        .expect("a row for old");
    let cells: Vec<&str> = old_row.split_whitespace().collect();
    assert_eq!(&cells[..4], &["old", "allow", "4", "1"]);
    assert_eq!(cells.last(), Some(&"2027-06-01T00:00:00Z"), "{table}");
}

#[test]
fn an_agents_own_dates_cut_it_off_from_its_own_sunset_and_no_one_else() {
    let backend = Backend::start();
    let now = SystemTime::now();
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.deprecated_at = Some("2026-01-01T00:00:00Z".into());
    cfg.retirement.sunset_at = Some(rfc3339(now + YEAR));
    cfg.retirement.enforce_sunset = true;
    let own_sunset = now - DAY;
    cfg.auth.agents.push(AgentFile {
        deprecated_at: Some(rfc3339(now - 30 * DAY)),
        sunset_at: Some(rfc3339(own_sunset)),
        ..agent("early", V1Policy::Allow)
    });
    let later = now + 2 * YEAR;
    cfg.auth.agents.push(AgentFile {
        sunset_at: Some(rfc3339(later)),
        ..agent("late", V1Policy::Allow)
    });
    let gw = Gateway::builder(cfg).start();

    let early = as_agent(gw.proxy, "early", "POST", "/api/v1/verify/request", &[]);
    assert_eq!(early.status, 410);
    assert_eq!(early.json()["message_code"], 41003);
    let day_granular = |t: SystemTime| httpdate::fmt_http_date(t);
    assert_eq!(
        early.header("sunset"),
        Some(day_granular(own_sunset).as_str())
    );
    let own_deprecation = (now - 30 * DAY)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        early.header("deprecation"),
        Some(format!("@{own_deprecation}").as_str())
    );
    // Its v2 calls pass; the other agents keep the global dates, or their own later one.
    let v2 = as_agent(gw.proxy, "early", "POST", "/api/v2/verify/S/request", &[]);
    assert_eq!(v2.status, 200);
    let plain = as_agent(gw.proxy, "agent-1", "POST", "/api/v1/verify/request", &[]);
    assert_eq!(plain.status, 200);
    assert_eq!(
        plain.header("sunset"),
        Some(day_granular(now + YEAR).as_str())
    );
    assert_eq!(plain.header("deprecation"), Some("@1767225600"));
    let late = as_agent(gw.proxy, "late", "POST", "/api/v1/verify/request", &[]);
    assert_eq!(late.status, 200);
    assert_eq!(late.header("sunset"), Some(day_granular(later).as_str()));
    assert_eq!(backend.count(), 3);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"early\",reason=\"sunset\"}"),
        1.0
    );

    // /v1-usage shows each agent's effective dates.
    let report = gw.v1_usage();
    let dates = |id: &str| {
        let a = report["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent_id"] == id)
            .unwrap()
            .clone();
        (a["deprecated_at"].clone(), a["sunset_at"].clone())
    };
    assert_eq!(
        dates("early"),
        (rfc3339(now - 30 * DAY).into(), rfc3339(own_sunset).into())
    );
    assert_eq!(
        dates("agent-1"),
        ("2026-01-01T00:00:00Z".into(), rfc3339(now + YEAR).into())
    );
    assert_eq!(
        dates("late"),
        ("2026-01-01T00:00:00Z".into(), rfc3339(later).into())
    );
}

/// A brownout of every agent's v1 calls whose ramp, from `from` % to `to` %, is
/// `elapsed` of the way from its start to its end now.
fn ramp_at(from: u8, to: u8, elapsed: f64) -> BrownoutFile {
    let now = SystemTime::now();
    let span = 10 * YEAR;
    let start = now - span.mul_f64(elapsed);
    BrownoutFile {
        percent: Some(from),
        percent_end: Some(to),
        ..BrownoutFile::new(&rfc3339(start), &rfc3339(start + span))
    }
}

#[test]
fn a_brownout_ramp_refuses_the_share_it_has_reached_and_a_rising_share_only_adds_refusals() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    // Halfway along a ten-year ramp from 10 % to 91 %: 50.5 %, so ids in buckets 0-49 are
    // refused (the ramp moves 0.000003 % during the test).
    cfg.retirement.brownouts.push(ramp_at(10, 91, 0.5));
    let gw = Gateway::builder(cfg.clone()).start();
    let ids: Vec<String> = (0..60).map(|i| format!("ramp-{i}")).collect();
    let call = |id: &str| {
        as_agent(
            gw.proxy,
            "agent-1",
            "POST",
            "/api/v1/verify/request",
            &[("X-Request-Id", id)],
        )
    };
    let mut refused_at_half = Vec::new();
    for id in &ids {
        let resp = call(id);
        let want = if bucket(id) < 50 { 410 } else { 200 };
        assert_eq!(resp.status, want, "{id} (bucket {})", bucket(id));
        if want == 410 {
            assert_eq!(resp.json()["message_code"], 41002);
            refused_at_half.push(id.clone());
        }
        // A retry with the same id gets the same answer.
        assert_eq!(call(id).status, want, "{id} on retry");
    }
    assert!(
        (15..=45).contains(&refused_at_half.len()),
        "{} of 60",
        refused_at_half.len()
    );

    // Three quarters along (70.75 %): every id refused before still is, and more are.
    cfg.retirement.brownouts = vec![ramp_at(10, 91, 0.75)];
    gw.reload(&cfg);
    let mut refused_later = Vec::new();
    for id in &ids {
        let want = if bucket(id) < 70 { 410 } else { 200 };
        assert_eq!(call(id).status, want, "{id} (bucket {})", bucket(id));
        if want == 410 {
            refused_later.push(id.clone());
        }
    }
    assert!(refused_at_half.iter().all(|id| refused_later.contains(id)));
    assert!(refused_later.len() > refused_at_half.len());
}

#[test]
fn a_recurring_brownout_opens_each_day_on_its_days_until_its_end_date() {
    let backend = Backend::start();
    let now = SystemTime::now();
    // A daily ten-minute window that first opened three days ago and today opened a
    // minute ago.
    let today = now - Duration::from_secs(60);
    let first = today - 3 * DAY;
    let daily = |days: Option<Vec<Weekday>>, until: SystemTime| BrownoutFile {
        repeat: Some(Repeat::Daily),
        until: Some(rfc3339(until)),
        days,
        ..BrownoutFile::new(&rfc3339(first), &rfc3339(first + Duration::from_secs(600)))
    };
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    cfg.retirement.brownouts = vec![daily(None, now + 30 * DAY)];
    let gw = Gateway::builder(cfg.clone()).start();
    let call = || as_agent(gw.proxy, "agent-1", "POST", "/api/v1/verify/request", &[]);
    let resp = call();
    assert_eq!(resp.status, 410, "{}", resp.text());
    assert_eq!(resp.json()["message_code"], 41002);
    // Retry-After is today's window's end, not the first one's.
    let today_end = today + Duration::from_secs(600);
    assert_eq!(
        resp.header("retry-after"),
        Some(httpdate::fmt_http_date(today_end).as_str())
    );

    // On every day but today's: nothing today.
    let others: Vec<Weekday> = [
        Weekday::Mon,
        Weekday::Tue,
        Weekday::Wed,
        Weekday::Thu,
        Weekday::Fri,
        Weekday::Sat,
        Weekday::Sun,
    ]
    .into_iter()
    .filter(|d| *d != Weekday::of(today))
    .collect();
    cfg.retirement.brownouts = vec![daily(Some(others), now + 30 * DAY)];
    gw.reload(&cfg);
    assert_eq!(call().status, 200);
    // On today's day only: refused again.
    cfg.retirement.brownouts = vec![daily(Some(vec![Weekday::of(today)]), now + 30 * DAY)];
    gw.reload(&cfg);
    assert_eq!(call().status, 410);
    // Ended before today's window opened: nothing.
    cfg.retirement.brownouts = vec![daily(None, today - Duration::from_secs(1))];
    gw.reload(&cfg);
    assert_eq!(call().status, 200);
}

#[test]
fn every_v1_answer_names_its_exact_v2_successor_and_v2_answers_none() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.v2.base_path = "/public/v2".into();
    cfg.auth.agents.push(AgentFile {
        default_service: Some("AGENTCODE".into()),
        ..agent("coded", V1Policy::Allow)
    });
    let gw = Gateway::builder(cfg).start();
    let successor = |path: &str| format!("<{path}>; rel=\"successor-version\"");
    let cases = [
        (
            "POST",
            "/api/v1/verify/request",
            "/public/v2/verify/AGENTCODE/request",
        ),
        (
            "POST",
            "/api/v1/verify/response",
            "/public/v2/verify/response",
        ),
        (
            "POST",
            "/api/v1/connection/invitation",
            "/public/v2/connection/AGENTCODE/invitation",
        ),
        (
            "POST",
            "/api/v1/credential/offer",
            "/public/v2/credential/AGENTCODE/offer",
        ),
        (
            "GET",
            "/api/v1/transaction/tx-42/status",
            "/public/v2/transaction/tx-42/status",
        ),
    ];
    for (method, path, v2) in cases {
        let resp = as_agent(gw.proxy, "coded", method, path, &[]);
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(resp.header("link"), Some(successor(v2).as_str()), "{path}");
    }
    // The backend got the upstream path, not the public one.
    assert!(backend
        .all()
        .iter()
        .all(|r| r.target.starts_with("/api/v2/")));
    // The gateway's own answers to v1 calls name it too.
    let not_json = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &agent_headers("coded")[..2],
        b"{}",
    );
    assert_eq!(not_json.status, 415);
    assert_eq!(
        not_json.header("link"),
        Some(successor("/public/v2/verify/AGENTCODE/request").as_str())
    );
    // A caller that did not authenticate is not told an agent's service code.
    let stranger = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &[("X-Service-Agent-Id", "coded"), ("X-Auth-Token", "wrong")],
        b"{}",
    );
    assert_eq!((stranger.status, stranger.header("link")), (401, None));
    // v2 answers carry none.
    let v2 = as_agent(
        gw.proxy,
        "coded",
        "POST",
        "/public/v2/verify/X/request",
        &[],
    );
    assert_eq!((v2.status, v2.header("link")), (200, None));
}

#[test]
fn a_sunset_rehearsal_gets_the_post_sunset_410_now_and_reaches_no_backend() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("vip", V1Policy::Exempt));
    let gw = Gateway::builder(cfg).start();
    let rehearse = |id: &str, method: &str, path: &str, value: &str| {
        as_agent(gw.proxy, id, method, path, &[("X-Sunset-Rehearsal", value)])
    };
    let resp = rehearse("agent-1", "POST", "/api/v1/credential/offer", "1");
    assert_eq!(resp.status, 410);
    let body = resp.json();
    assert_eq!(body["message_code"], 41004);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .ends_with("use POST /api/v2/credential/ORG_DEFAULT/offer instead"),
        "{body}"
    );
    assert_eq!(
        resp.header("link"),
        Some("</api/v2/credential/ORG_DEFAULT/offer>; rel=\"successor-version\"")
    );
    let status = rehearse("vip", "GET", "/api/v1/transaction/t-1/status", "1");
    assert_eq!(status.status, 410, "exempt agents may rehearse too");
    assert_eq!(backend.count(), 0, "a rehearsal is never forwarded");
    // v2 ignores the header; so does v1 for any value but 1.
    assert_eq!(
        rehearse("agent-1", "POST", "/api/v2/verify/S/request", "1").status,
        200
    );
    assert_eq!(
        rehearse("agent-1", "POST", "/api/v1/verify/request", "0").status,
        200
    );
    assert_eq!(backend.count(), 2);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"agent-1\",reason=\"rehearsal\"}"),
        1.0
    );
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"vip\",reason=\"rehearsal\"}"),
        1.0
    );
}
