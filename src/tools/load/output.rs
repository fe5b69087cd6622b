//! What the command prints and writes once it has a report (of a run, a saved run or a knee
//! search), and the exit status that says how it went.

use std::path::Path;

use serde::Serialize;

use super::html;
use super::report::{format_knee, format_report, KneeReport, Report};
use super::LoadError;

/// How the command ended, as its exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The run finished and every threshold passed (or a find-max found a rate).
    Passed,
    /// A threshold failed: exit 1, as a CI gate expects.
    ThresholdsFailed,
    /// `--find-max` found no rate that held the SLO: exit 1.
    NoRateHeld,
    /// Ended early by Ctrl-C (thresholds, if any, passed on what was measured): exit 130, the
    /// shell's status for SIGINT.
    Interrupted,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Passed => 0,
            Outcome::ThresholdsFailed | Outcome::NoRateHeld => 1,
            Outcome::Interrupted => 130,
        }
    }
}

/// Prints `report` on stdout, as JSON or as its `text`, and writes its `page` to `html_path`.
fn emit<T: Serialize>(
    report: &T,
    json: bool,
    text: impl FnOnce(&T) -> String,
    html_path: Option<&Path>,
    page: impl FnOnce(&T) -> String,
) -> Result<(), LoadError> {
    if json {
        println!(
            "{}",
            serde_json::to_string(report).expect("a report always serializes")
        );
    } else {
        print!("{}", text(report));
    }
    match html_path {
        Some(path) => std::fs::write(path, page(report)).map_err(|source| LoadError::Report {
            path: path.display().to_string(),
            source,
        }),
        None => Ok(()),
    }
}

/// Prints a run's report (text or JSON), writes its HTML page, names failed thresholds on
/// stderr; `Interrupted` only when `interruption_counts` (a redrawn run exits on its
/// thresholds alone).
pub fn print_run(
    report: &Report,
    json: bool,
    html_path: Option<&Path>,
    interruption_counts: bool,
) -> Result<Outcome, LoadError> {
    emit(report, json, format_report, html_path, html::run_page)?;
    let failed: Vec<String> = report
        .thresholds
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.describe())
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "{} of {} thresholds failed: {}",
            failed.len(),
            report.thresholds.len(),
            failed.join("; ")
        );
        return Ok(Outcome::ThresholdsFailed);
    }
    Ok(if report.interrupted && interruption_counts {
        Outcome::Interrupted
    } else {
        Outcome::Passed
    })
}

pub fn print_knee(
    knee: &KneeReport,
    json: bool,
    html_path: Option<&Path>,
) -> Result<Outcome, LoadError> {
    emit(knee, json, format_knee, html_path, html::knee_page)?;
    Ok(match knee.max_rate_held {
        None => {
            eprintln!("find-max: no rate held the SLO");
            Outcome::NoRateHeld
        }
        Some(_) if knee.interrupted => Outcome::Interrupted,
        Some(_) => Outcome::Passed,
    })
}
