//! The command: a run (or a knee search's runs) on a runtime of its own, Ctrl-C to end it
//! early and still report it, `--save`, and what it prints; or `load report`, a saved run's
//! report drawn again.

use std::time::SystemTime;

use tokio::sync::watch;

use super::args::{LoadArgs, LoadCommand};
use super::exec::execute;
use super::judge::judge_all;
use super::knee::KneeSearch;
use super::output::{print_knee, print_run, Outcome};
use super::plan::{Load, Mode, Plan};
use super::replay::report_saved;
use super::report::{FailedStep, KneeReport, KneeStep};
use super::save::Saver;
use super::schedule::Schedule;
use super::threshold::Threshold;
use super::LoadError;

/// Runs a load test (or a knee search), prints its report and says how it ended.
pub fn run(args: LoadArgs) -> Result<Outcome, LoadError> {
    if let Some(LoadCommand::Report(saved)) = &args.command {
        return report_saved(saved);
    }
    let plan = Plan::from_args(&args)?;
    let mode = Mode::from_args(&args)?;
    let threads = args
        .threads
        .unwrap_or_else(crate::config::cpus_available)
        .max(1);
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .map_err(LoadError::Runtime)?;
    runtime.block_on(async {
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(interrupt_on_ctrl_c(stop_tx));
        match mode {
            Mode::Run { thresholds } => {
                let saver = args
                    .save
                    .as_deref()
                    .map(|path| {
                        Saver::create(path, thresholds.iter().map(|t| t.text.clone()).collect())
                    })
                    .transpose()?;
                let mut report = execute(plan, stop, saver.as_ref()).await?;
                report.thresholds = judge_all(&thresholds, &report);
                let outcome = print_run(&report, args.json, args.report.as_deref(), true)?;
                // Every line on disk before the exit status says the run is done.
                saver.map(Saver::finish).transpose()?;
                Ok(outcome)
            }
            Mode::FindMax {
                slo,
                start,
                max_steps,
            } => {
                let knee = find_max(plan, &slo, start, max_steps, stop).await?;
                print_knee(&knee, args.json, args.report.as_deref())
            }
        }
    })
}

/// The first Ctrl-C stops the run, which then reports what it measured; a second one quits
/// at once.
async fn interrupt_on_ctrl_c(stop: watch::Sender<bool>) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    eprintln!("interrupted: stopping and reporting what was measured (Ctrl-C again quits now)");
    let _ = stop.send(true);
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(i32::from(Outcome::Interrupted.exit_code()));
    }
}

/// `--find-max`: runs flat steps of `plan`'s duration as [`KneeSearch`] directs, each judged
/// against `slo`, until the search is done or the run is interrupted. A step after the first
/// that cannot connect broke (the target fell over, or stopped taking connections) and ends
/// the search: the steps before it are still the answer.
pub async fn find_max(
    plan: Plan,
    slo: &[Threshold],
    start: f64,
    max_steps: usize,
    stop: watch::Receiver<bool>,
) -> Result<KneeReport, LoadError> {
    let step_duration = plan.setup.load.duration();
    let started_at = SystemTime::now();
    let mut search = KneeSearch::new(start, max_steps);
    let mut steps = Vec::new();
    let mut interrupted = false;
    let mut failed_step = None;
    while let Some(rate) = search.next_rate() {
        if *stop.borrow() {
            interrupted = true;
            break;
        }
        let mut step = plan.clone();
        step.setup.load = Load::Open(Schedule::flat(rate, step_duration));
        if plan.progress {
            eprintln!("find-max step {}: {rate} req/s", steps.len() + 1);
        }
        let mut report = match execute(step, stop.clone(), None).await {
            Ok(report) => report,
            Err(e @ LoadError::Connect(..)) if !steps.is_empty() => {
                search.record(rate, false);
                failed_step = Some(FailedStep {
                    rate,
                    error: e.to_string(),
                });
                break;
            }
            Err(e) => return Err(e),
        };
        report.thresholds = judge_all(slo, &report);
        let held = (!report.interrupted).then(|| report.thresholds_passed());
        if let Some(held) = held {
            search.record(rate, held);
        }
        interrupted = report.interrupted;
        steps.push(KneeStep { rate, held, report });
        if interrupted {
            break;
        }
    }
    Ok(KneeReport {
        mode: "find_max",
        target: plan.setup.target.clone(),
        api: plan.setup.api.version().as_str(),
        connections: plan.setup.connections,
        mix: plan.setup.mix.clone(),
        slo: slo.iter().map(|t| t.text.clone()).collect(),
        step_duration_s: step_duration.as_secs_f64(),
        started_at: humantime::format_rfc3339_seconds(started_at).to_string(),
        steps,
        max_rate_held: search.best(),
        lowest_rate_broken: search.lowest_broken(),
        failed_step,
        interrupted,
    })
}
