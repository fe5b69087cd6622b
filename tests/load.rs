//! `agent-gateway load` against a real gateway in front of the mock v2 backend: both models,
//! both API versions, ramps, thresholds and the exit status, Ctrl-C, the knee search, the JSON
//! report, errors counted by status, and the HTML report as headless Chromium draws it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use common::*;

/// A gateway in front of the mock v2 backend, the test agent limited to `limit` (rate per
/// second, burst) when given.
fn gateway_on_the_mock(limit: Option<(f64, u32)>) -> (MockBackend, Gateway) {
    let mock = MockBackend::start();
    let mut cfg = test_config(&[mock.addr]);
    if let Some((rate, burst)) = limit {
        let agent = cfg.agent_mut(AGENT_ID);
        agent.rate_limit_per_second = Some(rate);
        agent.burst = Some(burst);
    }
    (mock, Gateway::builder(cfg).start())
}

/// `agent-gateway load` against the gateway's proxy listener, with the test agent.
fn load_command(gw: &Gateway, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("load")
        .args(["--target", &format!("http://{}", gw.proxy)])
        .args(["--agent-id", AGENT_ID, "--token", TOKEN])
        .args(args);
    cmd
}

/// Runs it to the end.
fn load_output(gw: &Gateway, args: &[&str]) -> Output {
    load_command(gw, args).output().unwrap()
}

/// Runs it with `--json`, expecting success, and returns the report.
fn load(gw: &Gateway, args: &[&str]) -> serde_json::Value {
    let out = load_output(gw, &[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every answer a 200: status reads only ask for transaction ids the backend issued.
fn assert_all_ok(r: &serde_json::Value) {
    assert_eq!(r["statuses"]["200"], r["responses"], "{r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");
}

#[test]
fn an_open_model_run_sends_on_schedule_and_reports_percentiles() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let r = load(
        &gw,
        &["--rate", "200", "--duration", "1s", "--connections", "4"],
    );
    assert_eq!(r["model"], "open");
    assert_eq!(r["latency_from"], "intended start");
    assert_eq!(r["responses"], 200, "{r}");
    // Status reads ask only for transactions this run created, so all is 200.
    assert_all_ok(&r);
    let ms = &r["latency_ms"];
    for (lo, hi) in [
        ("p50", "p90"),
        ("p90", "p99"),
        ("p99", "p99_9"),
        ("p99_9", "max"),
    ] {
        assert!(ms[lo].as_f64().unwrap() <= ms[hi].as_f64().unwrap(), "{ms}");
    }
    // Every operation of the default mix was exercised, and the gateway saw each request.
    let ops = r["operations"].as_object().unwrap();
    assert_eq!(ops.len(), 5, "{ops:?}");
    for op in ["verify_request", "transaction_status"] {
        gw.wait_for_metric(
            &format!(
                "agent_gateway_requests_total{{api_version=\"v1\",code=\"200\",operation=\"{op}\"}}"
            ),
            ops[op].as_f64().unwrap(),
        );
    }
}

#[test]
fn a_closed_model_run_on_v2_counts_refusals_by_status() {
    let (_mock, gw) = gateway_on_the_mock(Some((50.0, 5)));
    let r = load(
        &gw,
        &[
            "--rate",
            "max",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--api",
            "v2",
            "--service",
            "SVC",
        ],
    );
    assert_eq!(r["model"], "closed");
    let ok = r["statuses"]["200"].as_u64().unwrap_or(0);
    let limited = r["statuses"]["429"].as_u64().unwrap_or(0);
    assert!(ok > 0 && limited > 0, "{r}");
    assert_eq!(r["errors"]["by_status"]["429"].as_u64(), Some(limited));
    assert_eq!(r["responses"].as_u64(), Some(ok + limited));
}

#[test]
fn a_ramp_sends_what_its_stages_call_for_and_shows_them_in_progress() {
    let (_mock, gw) = gateway_on_the_mock(None);
    // 0 -> 200 req/s over 1 s (100 requests), 200 held for 1 s (200), 200 -> 0 over 2 s (200).
    let out = load_output(
        &gw,
        &[
            "--stages",
            "1s:200,1s:200,2s:0",
            "--connections",
            "4",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["model"], "open");
    assert_eq!(r["rate"], serde_json::Value::Null);
    assert_eq!(r["duration_s"], 4.0);
    assert_eq!(r["stages"][1]["target_rps"], 200.0);
    assert_eq!(r["responses"], 500, "{r}");
    assert_all_ok(&r);
    // The timeline: every answer in some second, the schedule's target and stage beside it.
    let timeline = r["timeline"].as_array().unwrap();
    let answered: u64 = timeline
        .iter()
        .map(|s| s["responses"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 500);
    let targets: Vec<f64> = timeline[..4]
        .iter()
        .map(|s| s["target_rps"].as_f64().unwrap())
        .collect();
    assert_eq!(targets, [100.0, 200.0, 150.0, 50.0]);
    let stages: Vec<u64> = timeline[..4]
        .iter()
        .map(|s| s["stage"].as_u64().unwrap())
        .collect();
    assert_eq!(stages, [1, 2, 3, 3]);
    // The progress line of each second says the stage and what it called for.
    let progress = stderr(&out);
    for want in [
        "stage 1/3 target      100 req/s",
        "stage 2/3 target      200 req/s",
    ] {
        assert!(progress.contains(want), "{want:?} not in\n{progress}");
    }
}

#[test]
fn thresholds_gate_the_exit_status_and_each_verdict_is_in_the_json() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let base = ["--rate", "100", "--duration", "1s", "--connections", "2"];
    // All pass: exit 0.
    let out = load_output(
        &gw,
        &[
            &base[..],
            &["--threshold", "p99<60s", "--threshold", "errors<=100%"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pass  p99<60s (p99 "), "{text}");
    // One fails: exit 1, the failed one named on stderr, every verdict in the JSON.
    let out = load_output(
        &gw,
        &[
            &base[..],
            &[
                "--threshold",
                "p99<60s",
                "--threshold",
                "errors<=100%",
                "--threshold",
                "rps>1000000",
                "--json",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 of 3 thresholds failed: rps>1000000 (rps "),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts = r["thresholds"].as_array().unwrap();
    let passed: Vec<(&str, bool)> = verdicts
        .iter()
        .map(|v| {
            (
                v["threshold"].as_str().unwrap(),
                v["passed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        passed,
        [
            ("p99<60s", true),
            ("errors<=100%", true),
            ("rps>1000000", false)
        ]
    );
    assert_eq!(verdicts[0]["limit"], 60_000.0);
    assert_eq!(verdicts[0]["unit"], "ms");
    assert_eq!(verdicts[2]["actual"], r["throughput_rps"]);
}

#[test]
fn an_error_threshold_fails_when_the_gateway_refuses_over_the_agents_rate() {
    let (_mock, gw) = gateway_on_the_mock(Some((50.0, 5)));
    let out = load_output(
        &gw,
        &[
            "--rate",
            "max",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--mix",
            "verify_request=1",
            "--threshold",
            "errors<0.1%",
            "--threshold",
            "p99<60s",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 of 2 thresholds failed: errors<0.1% (errors "),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = &r["thresholds"][0];
    assert_eq!(errors["passed"], false);
    let refused = r["statuses"]["429"].as_u64().unwrap();
    let ratio = refused as f64 / r["responses"].as_f64().unwrap();
    assert!(
        (errors["actual"].as_f64().unwrap() - ratio).abs() < 1e-9,
        "{r}"
    );
    assert_eq!(r["thresholds"][1]["passed"], true);
}

/// Waits until a progress line reports answers, then returns the lines read so far; the rest
/// of stderr is drained by a thread into the returned handle.
fn wait_for_answers(
    child: &mut std::process::Child,
) -> (Vec<String>, std::thread::JoinHandle<Vec<String>>) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .expect("stderr ended before a progress line")
            .unwrap();
        let answered = line.starts_with('[')
            && line
                .split("total")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .is_some_and(|n| n != "0");
        seen.push(line);
        if answered {
            break;
        }
    }
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    (seen, rest)
}

#[test]
fn ctrl_c_ends_the_run_early_and_still_prints_and_writes_the_report() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("interrupted.html");
    for json in [true, false] {
        let mut cmd = load_command(
            &gw,
            &[
                "--rate",
                "100",
                "--duration",
                "60s",
                "--connections",
                "2",
                "--threshold",
                "p99<60s",
                "--report",
                html.to_str().unwrap(),
            ],
        );
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (_, rest) = wait_for_answers(&mut child);
        signal(child.id(), "INT");
        let out = child.wait_with_output().unwrap();
        let err = rest.join().unwrap().join("\n");
        // Interrupted, thresholds passed on what was measured: 130, as for SIGINT.
        assert_eq!(out.status.code(), Some(130), "{err}");
        assert!(err.contains("interrupted: stopping"), "{err}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if json {
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["interrupted"], true);
            let responses = r["responses"].as_u64().unwrap();
            // Some answers, far fewer than the 6000 planned.
            assert!(responses > 0 && responses < 6000, "{r}");
            assert_all_ok(&r);
            assert_eq!(r["thresholds"][0]["passed"], true);
            let answered: u64 = r["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["responses"].as_u64().unwrap())
                .sum();
            assert_eq!(answered, responses);
        } else {
            assert!(stdout.contains("interrupted by Ctrl-C after"), "{stdout}");
            assert!(stdout.contains("throughput"), "{stdout}");
        }
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("\"interrupted\":true"));
        std::fs::remove_file(&html).unwrap();
    }
}

#[test]
fn find_max_reports_the_highest_rate_that_held_the_slo() {
    // The knee: above 150 req/s (and a burst of 120) the gateway answers 429. A 1 s step at
    // r req/s from a full bucket has about r - 270 refused, so `errors<5%` holds up to about
    // 284 req/s: 50, 100 and 200 hold, 400 breaks. The burst is wide enough that 100 holds
    // even if the generator, stalled on a busy machine, sends a whole second's requests at
    // once, and 400 breaks unless it sends them over more than 1.7 s.
    let (_mock, gw) = gateway_on_the_mock(Some((150.0, 120)));
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "errors<5%",
            "--slo",
            "p99<30s",
            "--rate",
            "50",
            "--duration",
            "1s",
            "--max-steps",
            "6",
            "--connections",
            "8",
            "--mix",
            "verify_request=1",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let k: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(k["mode"], "find_max");
    assert_eq!(k["slo"], serde_json::json!(["errors<5%", "p99<30s"]));
    let steps = k["steps"].as_array().unwrap();
    let rate = |s: &serde_json::Value| s["rate"].as_f64().unwrap();
    // Doubling from 50 while the SLO holds; 400 cannot (about 37% refused).
    assert_eq!(rate(&steps[0]), 50.0);
    assert_eq!(rate(&steps[1]), 100.0);
    assert!(steps.len() <= 6);
    for s in steps {
        // Each step is a whole run at its rate, judged on its own verdicts.
        let r = &s["report"];
        assert_eq!(r["rate"].as_f64(), Some(rate(s)));
        let all_passed = r["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["passed"] == true);
        assert_eq!(s["held"].as_bool(), Some(all_passed), "{s}");
        if rate(s) >= 400.0 {
            assert_eq!(s["held"], false, "{s}");
        }
    }
    let held_max = steps
        .iter()
        .filter(|s| s["held"] == true)
        .map(rate)
        .fold(0.0, f64::max);
    let best = k["max_rate_held"].as_f64().unwrap();
    assert_eq!(best, held_max);
    assert!((100.0..300.0).contains(&best), "{k}");
    let broken = k["lowest_rate_broken"].as_f64().unwrap();
    assert!(broken > best);
    // The text says the same.
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "errors<5%",
            "--rate",
            "50",
            "--duration",
            "1s",
            "--max-steps",
            "2",
            "--mix",
            "verify_request=1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("highest rate that held the SLO: 100 req/s (no step broke it"),
        "{text}"
    );
}

#[test]
fn find_max_exits_1_when_no_rate_holds_the_slo() {
    let (_mock, gw) = gateway_on_the_mock(None);
    // Nothing answers within a microsecond.
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "p50<1us",
            "--rate",
            "4",
            "--duration",
            "1s",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no rate held the SLO"));
    let k: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(k["max_rate_held"], serde_json::Value::Null);
    // 4, 2, 1 req/s, then it gives up.
    let rates: Vec<f64> = k["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates, [4.0, 2.0, 1.0]);
}

/// The value of attribute `name` in the start tag `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// A chart as the browser left it: its plot area in page pixels and its drawn series
/// (name, points, colour).
#[derive(Debug)]
struct DrawnChart {
    plot_box: [u32; 4],
    series: Vec<(String, u64, [u8; 3])>,
}

fn drawn_chart(dom: &str, id: &str) -> DrawnChart {
    let open = dom
        .match_indices("<svg")
        .map(|(i, _)| &dom[i..])
        .find(|s| attr(&s[..s.find('>').unwrap()], "id") == Some(id))
        .unwrap_or_else(|| panic!("no chart {id} in the page"));
    let tag = &open[..open.find('>').unwrap()];
    let plot_box: Vec<u32> = attr(tag, "data-plot-box")
        .unwrap_or_else(|| panic!("chart {id} has no plot box: the script did not finish"))
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let body = &open[..open.find("</svg>").unwrap()];
    let series = body
        .match_indices('<')
        .map(|(i, _)| &body[i..i + body[i..].find('>').unwrap()])
        .filter(|t| attr(t, "class").is_some_and(|c| c.starts_with("series")))
        .map(|t| {
            let colour = attr(t, "stroke").or_else(|| attr(t, "fill")).unwrap();
            let hex = colour.strip_prefix('#').expect("hex colours");
            let c = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
            (
                attr(t, "data-series").unwrap().to_owned(),
                attr(t, "data-points").unwrap().parse().unwrap(),
                [c(0), c(2), c(4)],
            )
        })
        .collect();
    DrawnChart {
        plot_box: plot_box.try_into().unwrap(),
        series,
    }
}

/// An RGB screenshot.
struct Screenshot {
    width: u32,
    height: u32,
    rgb: Vec<[u8; 3]>,
}

fn read_png(path: &Path) -> Screenshot {
    let decoder = png::Decoder::new(BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    Screenshot {
        width: info.width,
        height: info.height,
        rgb: buf[..info.buffer_size()]
            .chunks(step)
            .map(|p| [p[0], p[1], p[2]])
            .collect(),
    }
}

impl Screenshot {
    /// Pixels inside `b` (x, y, width, height) within 40 of `colour` on every channel.
    fn count_near(&self, b: [u32; 4], colour: [u8; 3]) -> usize {
        let [x0, y0, w, h] = b;
        assert!(
            x0 + w <= self.width && y0 + h <= self.height,
            "{b:?} off the screenshot"
        );
        (y0..y0 + h)
            .flat_map(|y| (x0..x0 + w).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let p = self.rgb[(y * self.width + x) as usize];
                p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 40)
            })
            .count()
    }
}

#[test]
fn the_html_report_draws_its_charts_in_a_headless_browser() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let dir = tempfile::tempdir().unwrap();
    let html: PathBuf = dir.path().join("report.html");
    let r = load(
        &gw,
        &[
            "--stages",
            "1s:150,1s:150,1s:0",
            "--connections",
            "4",
            "--threshold",
            "p99<60s",
            "--report",
            html.to_str().unwrap(),
        ],
    );
    let seconds = r["timeline"].as_array().unwrap().len() as u64;
    let url = format!("file://{}", html.display());

    // The page after its script ran: every chart drawn, with a point per second. Both runs
    // lay the page out in the same window, so the plot areas found here are where the
    // screenshot has them.
    let window = "--window-size=1280,4000";
    let out = chromium(
        &dir.path().join("profile-dom"),
        &[window, "--dump-dom", &url],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let dom = String::from_utf8(out.stdout).unwrap();
    assert!(dom.contains("data-drawn=\"4\""), "{dom}");
    assert!(dom.contains("Load test of http://"), "{dom}");
    for want in ["p99&lt;60s", ">pass<", "stage 2", "1s:150,1s:150,1s:0"] {
        assert!(dom.contains(want), "{want:?} not in the page");
    }
    let charts: Vec<(&str, DrawnChart)> = ["throughput", "latency", "statuses", "distribution"]
        .into_iter()
        .map(|id| (id, drawn_chart(&dom, id)))
        .collect();
    let names = |c: &DrawnChart| c.series.iter().map(|s| s.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&charts[0].1),
        ["target (the schedule)", "responses per second"]
    );
    assert_eq!(names(&charts[1].1), ["p50", "p90", "p99", "p99.9", "max"]);
    assert!(names(&charts[2].1).contains(&"HTTP 200".to_string()));
    for (id, chart) in &charts[..2] {
        for (name, points, _) in &chart.series {
            // The target stops with the schedule; answers may straggle into one more second.
            assert!(
                *points + 1 >= seconds && *points <= seconds,
                "{id} {name}: {points} points for {seconds} seconds"
            );
        }
    }
    let distribution = &charts[3].1.series[0];
    assert_eq!(
        distribution.1,
        r["latency_distribution"].as_array().unwrap().len() as u64
    );

    // And what a person sees: each series' colour painted inside its chart's plot area.
    let png = dir.path().join("report.png");
    let out = chromium(
        &dir.path().join("profile-shot"),
        &[window, &format!("--screenshot={}", png.display()), &url],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shot = read_png(&png);
    for (id, chart) in &charts {
        for (name, _, colour) in &chart.series {
            let n = shot.count_near(chart.plot_box, *colour);
            assert!(
                n >= 15,
                "{id} {name}: {n} pixels of {colour:?} in {:?}",
                chart.plot_box
            );
        }
    }
}
