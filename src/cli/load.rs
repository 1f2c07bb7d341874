//! `subagents load`: runs a load scenario with live progress, prints its report (or JSON), and
//! fails when the run does not verify.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use subagents::load::{rss_bytes, Latency, LoadCounters, LoadFlush, LoadStore, Scenario};
use subagents::{ErrorCode, SubagentError};

use super::super::Failure;

/// The `load` command's arguments; each flag overrides the scenario file's field.
#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// A scenario file (TOML or JSON) with any of the fields below, in snake_case or
    /// kebab-case (`in_flight` or `in-flight`); `latency` is `5`, `"2..10"` or
    /// `{kind = "uniform", min = 2, max = 10}`. Flags override it.
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
    /// Root agents [default: 4].
    #[arg(long, allow_negative_numbers = true)]
    roots: Option<u64>,
    /// Children per parent [default: 250].
    #[arg(long, allow_negative_numbers = true)]
    children: Option<u64>,
    /// Delegation levels below each root (continuable children delegate from their turn)
    /// [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    depth: Option<u64>,
    /// The share of one-shot children started through `fork` [default: 0.25].
    #[arg(long, allow_negative_numbers = true)]
    fork_share: Option<f64>,
    /// The share of each root's children that are continuable [default: 0.5].
    #[arg(long, allow_negative_numbers = true)]
    continuable_share: Option<f64>,
    /// Follow-ups per continuable child (each cold-resumes it) [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    followups: Option<u64>,
    /// The share of each root's continuable children that report to it from their first turn
    /// [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    report_share: Option<f64>,
    /// The share of continuable children interrupted after their last follow-up
    /// [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    interrupt_share: Option<f64>,
    /// The share of continuable children with a one-turn budget [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    budget_share: Option<f64>,
    /// Simulated model latency in milliseconds: `5` (fixed) or `2..10` (uniform) [default: 0].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(Latency))]
    latency: Option<Latency>,
    /// Where sessions are persisted: a sled directory (as every command's `--store` reads one),
    /// `sled` (in `--store-dir`; `./sled` names a directory of that name), `memory` (nothing
    /// kept: a throwaway run), or a PostgreSQL connection string (`postgres://…`)
    /// [default: .subagents, where `subagents tree` finds the run's forest].
    #[arg(long, value_name = "sled|memory|DIR|postgres://…", value_parser = parse_store)]
    store: Option<StoreArg>,
    /// Cluster nodes on the PostgreSQL store: the roots' children are placed round-robin on
    /// them, and follow-ups chase them across nodes [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    nodes: Option<u64>,
    /// The sled directory, as `--store DIR` [default: .subagents].
    #[arg(long, value_name = "DIR")]
    store_dir: Option<PathBuf>,
    /// The sled store's page cache in MiB: sled's own default (1 GiB) grows a large run's
    /// memory without making it faster [default: 256].
    #[arg(long, value_name = "MIB", allow_negative_numbers = true)]
    store_cache_mib: Option<u64>,
    /// When the root agents flush (children follow their own rules: one-shot children add no
    /// checkpoint, every continuable epoch ends with a flush) [default: on-request].
    #[arg(long, value_enum)]
    flush: Option<LoadFlush>,
    /// The roots page out their settled events beyond this many, once the store has them (0:
    /// each root keeps its whole log in memory) [default: 4096].
    #[arg(long, value_name = "EVENTS")]
    resident_events: Option<u32>,
    /// Threads agents run on, the harness's own among them, at most 256 [default: one per
    /// core].
    #[arg(long, allow_negative_numbers = true)]
    workers: Option<usize>,
    /// The most root children in flight at once [default: 10000].
    #[arg(long, allow_negative_numbers = true)]
    in_flight: Option<u64>,
    /// The seed of every choice and drawn latency [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also print the floors measured in the same process (an actor's round trip, a sled
    /// append) the one-shot latency is compared with; the JSON always has them.
    #[arg(long)]
    verbose: bool,
    /// Also draw the run's timeline into this file, SVG or PNG by its extension: children in
    /// flight, epochs settled and follow-ups accepted per second, and the resident set over
    /// time, the listing and the drain after the growth shaded.
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    plot: Option<PathBuf>,
}

/// What `--store` names: a kind of store, with the database's URL or the sled directory.
#[derive(Debug, Clone)]
enum StoreArg {
    Kind(LoadStore),
    Postgres(String),
    SledAt(PathBuf),
}

/// `sled`, `memory`, a PostgreSQL connection string, or a sled directory (the same reading of
/// a location as every other command's `--store`).
fn parse_store(text: &str) -> Result<StoreArg, String> {
    match text {
        "sled" => Ok(StoreArg::Kind(LoadStore::Sled)),
        _ => Ok(match text.parse::<super::store::StoreLocation>()? {
            super::store::StoreLocation::Memory => StoreArg::Kind(LoadStore::Memory),
            super::store::StoreLocation::Postgres(url) => StoreArg::Postgres(url),
            super::store::StoreLocation::Sled(dir) => StoreArg::SledAt(dir),
        }),
    }
}

impl LoadArgs {
    /// The scenario: the file's (or the defaults), with every given flag applied.
    fn scenario(&self) -> Result<Scenario, SubagentError> {
        let mut scenario = match &self.scenario {
            Some(path) => Scenario::from_file(path)?,
            None => Scenario::default(),
        };
        macro_rules! apply {
            ($($field:ident),*) => {$(
                if let Some(value) = self.$field.clone() {
                    scenario.$field = value;
                }
            )*};
        }
        apply!(
            roots,
            children,
            depth,
            fork_share,
            continuable_share,
            followups,
            report_share,
            interrupt_share,
            budget_share,
            latency,
            flush,
            resident_events,
            workers,
            in_flight,
            nodes,
            seed
        );
        match &self.store {
            Some(StoreArg::Kind(store)) => scenario.store = *store,
            Some(StoreArg::Postgres(url)) => {
                scenario.store = LoadStore::Postgres;
                scenario.store_url = Some(url.clone());
            }
            Some(StoreArg::SledAt(dir)) => {
                scenario.store = LoadStore::Sled;
                scenario.store_dir = Some(dir.clone());
            }
            None => {}
        }
        if self.store_dir.is_some() {
            scenario.store_dir.clone_from(&self.store_dir);
        }
        if self.store_cache_mib.is_some() {
            scenario.store_cache_mib = self.store_cache_mib;
        }
        // The command's store is every command's default (the library's scenario keeps a
        // temporary directory): `subagents tree` then shows the run's forest.
        if scenario.store == LoadStore::Sled && scenario.store_dir.is_none() {
            scenario.store_dir = Some(PathBuf::from(super::store::DEFAULT_STORE));
        }
        scenario.validate()?;
        Ok(scenario)
    }
}

/// Shows the counters on stderr while the run lasts (hidden when stdout is not a terminal): a
/// bar of the children created out of the scenario's total, and a line with the follow-ups
/// and the epochs running (an epoch is one run of a child, from its start or a follow-up's
/// cold resume to its settling; the window bounds only the roots' own children, so their
/// grandchildren and follow-ups may run beyond it).
fn progress(counters: &Arc<LoadCounters>, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if !std::io::stdout().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} children\n  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let watched = Arc::clone(counters);
    let ticker = bar.clone();
    actix::spawn(async move {
        while !ticker.is_finished() {
            ticker.set_position(watched.created.load(Ordering::Relaxed));
            ticker.set_message(format!(
                "{} follow-ups accepted, {} epochs running, {} settled, RSS {} MiB",
                watched.followups.load(Ordering::Relaxed),
                watched.in_flight(),
                watched.settled.load(Ordering::Relaxed),
                rss_bytes() >> 20
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    bar
}

/// Refuses a `--plot` target before the run: it must be an `.svg` or `.png` file this process
/// can write. Whether the check created the file (so a run that ends without a plot removes
/// it).
fn check_plot(path: &std::path::Path) -> Result<bool, SubagentError> {
    let refused = |why: String| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("--plot {}: {why}", path.display()),
        )
    };
    super::plot::PlotFormat::of(path).map_err(refused)?;
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(|_| !existed)
        .map_err(|error| refused(format!("cannot be written: {error}")))
}

/// Runs the command, writing the report to `out`.
pub(crate) async fn run(args: LoadArgs, out: &mut impl Write) -> Result<(), Failure> {
    let scenario = args.scenario()?;
    let created_plot = match &args.plot {
        Some(path) => check_plot(path)?,
        None => false,
    };
    let counters = Arc::new(LoadCounters::default());
    let bar = progress(&counters, scenario.total_children().unwrap_or(0));
    let stop = subagents::CancellationToken::new();
    let interrupts = actix::spawn(stop_on_interrupt(stop.clone(), bar.clone()));
    let report = subagents::load::run_configured(
        &scenario,
        Arc::clone(&counters),
        stop,
        super::telemetry::instrumented,
    )
    .await;
    interrupts.abort();
    bar.finish_and_clear();
    let report = report.inspect_err(|_| {
        // Nothing of a failed run stays behind, not even the empty plot it was to draw.
        if let (Some(path), true) = (&args.plot, created_plot) {
            let _ = std::fs::remove_file(path);
        }
    })?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|error| {
            SubagentError::new(
                ErrorCode::ReportableBug,
                format!("the report does not serialize: {error}"),
            )
        })?;
        writeln!(out, "{json}")?;
    } else if args.verbose {
        writeln!(out, "{report:#}")?;
    } else {
        writeln!(out, "{report}")?;
    }
    // Drawn after the report is written: a plot that fails loses nothing of the run.
    if let Some(path) = &args.plot {
        super::plot::draw(&report, path)
            .map_err(|why| Failure::Plot(format!("{}: {why}", path.display())))?;
    }
    if !report.passed {
        Err(Failure::Unverified)
    } else if report.interrupted {
        Err(Failure::Interrupted)
    } else {
        Ok(())
    }
}

/// The first Ctrl-C stops the run growing (it drains, verifies and reports what it grew); a
/// second one exits at once, with the shell's code for an interrupt.
async fn stop_on_interrupt(stop: subagents::CancellationToken, bar: ProgressBar) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    stop.cancel();
    bar.suspend(|| {
        eprintln!(
            "interrupted: no more children start; draining what runs (Ctrl-C again exits at once)"
        );
    });
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(130);
    }
}
