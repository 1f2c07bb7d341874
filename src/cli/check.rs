//! `subagents check`: runs the history checker (see [`subagents::check`]) over a range of
//! seeds, shrinks any schedule that breaks a promise to the operations that still break it, and
//! prints its anomalies with the command that replays it.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use subagents::check::{replay_command, run_schedule, shrink, CheckConfig, CheckStore, Shape};

use super::super::Failure;

/// The stores a check runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StoreArg {
    /// In memory.
    Memory,
    /// A sled directory, reopened from disk.
    Sled,
    /// Memory for even seeds, sled for odd ones.
    Both,
}

/// The `check` command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// How many schedules: seeds `--seed`, `--seed + 1`, ...
    #[arg(long, default_value_t = 100)]
    schedules: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operations per schedule.
    #[arg(long, default_value_t = 48)]
    ops: usize,
    /// The store.
    #[arg(long, value_enum, default_value = "both")]
    store: StoreArg,
    /// Leave out store faults, dropped callers and reopens.
    #[arg(long)]
    no_faults: bool,
    /// Spread the runtime's agents over this many threads (1 runs every schedule on one
    /// thread; 2 puts children on a second thread too, and a sled store's writes then go
    /// through its write thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// Run only the operations at these positions of the schedule (a shrunk schedule).
    #[arg(long, value_delimiter = ',')]
    keep: Option<Vec<usize>>,
    /// Report a failing schedule as it is, without shrinking it.
    #[arg(long)]
    no_shrink: bool,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

impl CheckArgs {
    /// The configuration of the schedule `seed` names.
    fn config(&self, seed: u64) -> CheckConfig {
        let store = match self.store {
            StoreArg::Memory => CheckStore::Memory,
            StoreArg::Sled => CheckStore::Sled,
            StoreArg::Both if seed % 2 == 0 => CheckStore::Memory,
            StoreArg::Both => CheckStore::Sled,
        };
        CheckConfig {
            store,
            shape: Shape {
                ops: self.ops,
                faults: !self.no_faults,
                reopen: !self.no_faults,
            },
            workers: usize::from(self.workers),
            ..CheckConfig::default()
        }
    }
}

/// Runs the command, writing its summary to `out`.
pub(crate) async fn run(args: CheckArgs, out: &mut impl Write) -> Result<(), Failure> {
    if args.schedules == 0 || args.ops == 0 {
        return Err(super::model::usage("--schedules and --ops must be at least 1").into());
    }
    let began = Instant::now();
    let bar = ProgressBar::new(args.schedules);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let (mut failed, mut children, mut one_shots, mut accepted) = (Vec::new(), 0, 0, 0);
    let (mut paging, mut paged_out) = (0, 0);
    for seed in args.seed..args.seed.saturating_add(args.schedules) {
        let config = args.config(seed);
        let report = run_schedule(seed, &config, args.keep.as_deref()).await?;
        children += report.children;
        one_shots += report.one_shots;
        accepted += report.accepted;
        paging += usize::from(report.resident_events.is_some());
        paged_out += report.paged_out;
        bar.inc(1);
        if report.anomalies.is_empty() {
            continue;
        }
        bar.set_message(format!("{} failing", failed.len() + 1));
        // Said at once (the summary comes at the end): a long run shows what broke as it goes.
        bar.suspend(|| {
            let _ = writeln!(
                std::io::stderr(),
                "schedule {seed} broke: {}",
                report
                    .anomalies
                    .iter()
                    .map(|anomaly| format!("{}: {}", anomaly.property, anomaly.detail))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        });
        let kept = match (&args.keep, args.no_shrink) {
            (Some(keep), _) => Some(keep.clone()),
            (None, true) => None,
            (None, false) => Some(shrink(seed, &config, 3).await?),
        };
        failed.push((report, replay_command(seed, &config, kept.as_deref())));
    }
    bar.finish_and_clear();
    let elapsed = began.elapsed();
    let anomalies: usize = failed
        .iter()
        .map(|(report, _)| report.anomalies.len())
        .sum();
    if args.json {
        let failures: Vec<_> = failed
            .iter()
            .map(|(report, replay)| json!({"report": report, "replay": replay}))
            .collect();
        writeln!(
            out,
            "{:#}",
            json!({
                "schedules": args.schedules,
                "firstSeed": args.seed,
                "ops": args.ops,
                "faults": !args.no_faults,
                "children": children,
                "oneShotRuns": one_shots,
                "accepted": accepted,
                "pagingSchedules": paging,
                "pagedOutEvents": paged_out,
                "failedSchedules": failed.len(),
                "anomalies": anomalies,
                "elapsedMs": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                "failures": failures,
            })
        )?;
    } else {
        for (report, replay) in &failed {
            match report.resident_events {
                Some(keep) => writeln!(
                    out,
                    "schedule {} ({:?}, the roots paging out beyond {keep} events) broke:",
                    report.seed, report.store
                )?,
                None => writeln!(out, "schedule {} ({:?}) broke:", report.seed, report.store)?,
            }
            for anomaly in &report.anomalies {
                writeln!(out, "  {}: {}", anomaly.property, anomaly.detail)?;
            }
            writeln!(out, "  replay: {replay}")?;
        }
        writeln!(
            out,
            "{} schedules (seeds {}..{}, {} ops each{}, {} with the roots paging out, {} events paged out): {} continuable children, {} one-shot runs, {} messages accepted, {} anomalies in {} schedules, {}",
            args.schedules,
            args.seed,
            args.seed.saturating_add(args.schedules),
            args.ops,
            if args.no_faults { ", no faults" } else { ", with faults" },
            paging,
            paged_out,
            children,
            one_shots,
            accepted,
            anomalies,
            failed.len(),
            seconds(elapsed),
        )?;
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Anomalies)
    }
}

fn seconds(elapsed: Duration) -> String {
    format!("{:.1} s", elapsed.as_secs_f64())
}
