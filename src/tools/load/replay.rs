//! `agent-gateway load report FILE.jsonl`: the report of a run saved with `--save`, drawn
//! again from its lines without the target: the same text, JSON and HTML page, its
//! thresholds (or others) judged again.

use super::args::ReportArgs;
use super::judge::judge_all;
use super::output::{print_run, Outcome};
use super::report::make_report;
use super::save::read_saved;
use super::threshold::Threshold;
use super::LoadError;

/// Reads the saved run, prints its report and says how its thresholds went.
pub fn report_saved(args: &ReportArgs) -> Result<Outcome, LoadError> {
    let saved = read_saved(&args.file)?;
    let thresholds = if args.threshold.is_empty() {
        saved
            .header
            .thresholds
            .iter()
            .map(|t| t.parse::<Threshold>())
            .collect::<Result<Vec<_>, _>>()?
    } else {
        args.threshold.clone()
    };
    let mut report = make_report(&saved.header.setup, &saved.measured);
    report.thresholds = judge_all(&thresholds, &report);
    print_run(&report, args.json, args.report.as_deref(), false)
}
