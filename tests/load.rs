//! The load harness, through the same code path as `subagents load`: a small scenario runs,
//! verifies and reports; a broken scenario is refused naming what is wrong.

use std::sync::Arc;

use subagents::load::{run, Latency, LoadCounters, LoadStore, Scenario};
use subagents::{ErrorCode, SessionPersistence};

use crate::support::{assert_succeeded, within};

/// Runs `scenario` to its report, within the tests' deadline.
async fn run_to_end(scenario: &Scenario) -> subagents::load::LoadReport {
    within(
        "the load run",
        run(scenario, Arc::new(LoadCounters::default())),
    )
    .await
    .unwrap()
}

fn small(store: LoadStore) -> Scenario {
    Scenario {
        roots: 2,
        children: 6,
        depth: 2,
        followups: 2,
        continuable_share: 0.5,
        interrupt_share: 0.34,
        report_share: 0.34,
        budget_share: 0.34,
        store,
        workers: 1,
        // Fewer slots than root children: the window admits them a few at a time.
        in_flight: 3,
        ..Scenario::default()
    }
}

// The main job's last check reopens the sled store itself once the run closed it (a copy of a
// directory sled was still writing failed the check now and then: a file vanished under it).
// Run after run, it passes, and the run leaves the directory free for anyone to open.
#[actix_rt::test]
async fn the_default_scenario_reopens_the_sled_store_it_closed_run_after_run() {
    for attempt in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario {
            store_dir: Some(dir.path().to_path_buf()),
            seed: attempt + 1,
            ..Scenario::default()
        };
        let report = run_to_end(&scenario).await;
        assert!(report.passed, "run {attempt}: {report}");
        let reopened = report
            .checks
            .iter()
            .find(|check| check.name == "the store reopens and lists the same forest")
            .expect("the reopening is checked");
        assert!(reopened.passed, "run {attempt}: {}", reopened.detail);
        // Opened off this thread: what the run dropped is released on it.
        let path = dir.path().to_path_buf();
        let store = tokio::task::spawn_blocking(move || subagents::SledStore::open(path))
            .await
            .unwrap()
            .expect("the run let go of its store");
        let roots = store
            .list()
            .await
            .unwrap()
            .into_iter()
            .filter(|listed| match listed {
                subagents::store::ListedSession::Header(header) => header.parent_session.is_none(),
                subagents::store::ListedSession::Corrupt { .. } => false,
            })
            .count();
        assert_eq!(roots, 4, "run {attempt}: the scenario's roots are stored");
    }
}

// `load --help` shows every default, and they are the scenario's own.
#[test]
fn load_help_shows_the_scenarios_defaults() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let defaults = Scenario::default();
    for (flag, default) in [
        ("--roots", defaults.roots.to_string()),
        ("--children", defaults.children.to_string()),
        ("--depth", defaults.depth.to_string()),
        ("--fork-share", defaults.fork_share.to_string()),
        (
            "--continuable-share",
            defaults.continuable_share.to_string(),
        ),
        ("--followups", defaults.followups.to_string()),
        ("--report-share", defaults.report_share.to_string()),
        ("--interrupt-share", defaults.interrupt_share.to_string()),
        ("--budget-share", defaults.budget_share.to_string()),
        ("--nodes", defaults.nodes.to_string()),
        ("--in-flight", defaults.in_flight.to_string()),
        ("--seed", defaults.seed.to_string()),
        (
            "--store-cache-mib",
            subagents::load::DEFAULT_STORE_CACHE_MIB.to_string(),
        ),
    ] {
        let at = help.find(&format!("{flag} <")).expect(flag);
        let described = &help[at..];
        let end = described[2..]
            .find(" --")
            .map_or(described.len(), |end| end + 2);
        assert!(
            described[..end].contains(&format!("[default: {default}]")),
            "{flag}: {}",
            &described[..end]
        );
    }
}

#[actix_rt::test]
async fn a_small_scenario_runs_verifies_and_reports_on_every_store() {
    let postgres = crate::support::postgres::postgres_or_skip!().fresh_database();
    for store in [LoadStore::Memory, LoadStore::Sled, LoadStore::Postgres] {
        let mut scenario = small(store);
        if store == LoadStore::Postgres {
            scenario.store_url = Some(postgres.clone());
        }
        let counters = Arc::new(LoadCounters::default());
        let report = within("the load run", run(&scenario, Arc::clone(&counters)))
            .await
            .unwrap();
        assert!(report.passed, "{report}");
        // 2 roots x 6 children (3 continuable each), and 6 children below each continuable one.
        assert_eq!(report.children.one_shot, 6);
        assert_eq!(report.children.continuable, 6 + 6 * 6);
        assert_eq!(report.children.total, scenario.total_children().unwrap());
        // Per root: one budgeted child (refused), one interrupted after its only accepted
        // follow-up... counted exactly.
        assert_eq!(report.followups.refused_by_budget, 2);
        assert_eq!(report.followups.interrupts_sent, 2);
        assert_eq!(
            report.followups.reports_sent, 2,
            "one reporting child per root"
        );
        assert_eq!(report.latency.one_shot_start_to_result.count, 6);
        assert_eq!(report.latency.continuable_start_acceptance.count, 42);
        assert_eq!(
            report.latency.followup_acceptance.count,
            report.followups.accepted
        );
        // Every accepted follow-up that a turn claimed has its turn-start latency.
        assert!(report.latency.followup_to_turn_start.count > 0);
        assert!(report.latency.followup_to_turn_start.count <= report.followups.accepted);
        assert!(report.floors.actor_round_trip_ns > 0);
        assert_eq!(
            report.floors.sled_turn_append_ns.is_some(),
            store == LoadStore::Sled
        );
        let names: Vec<&str> = report
            .checks
            .iter()
            .map(|check| check.name.as_str())
            .collect();
        assert_eq!(
            names.len(),
            if store == LoadStore::Memory { 7 } else { 8 },
            "{names:?}: a persistent store is reopened and listed"
        );
        assert_eq!(
            counters.settled.load(std::sync::atomic::Ordering::Relaxed),
            counters.started.load(std::sync::atomic::Ordering::Relaxed)
        );
        assert!(
            report.persisted.events > report.children.total * 4,
            "{report}"
        );
        assert_eq!(
            report.persisted.bytes_on_disk.is_some(),
            store == LoadStore::Sled
        );
        // The JSON form carries the same facts.
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["passed"], true);
        assert_eq!(json["children"]["total"], 48);
    }
}

// Roots that page out their settled events (a window of 16, far below what they append, and
// forks of them among their children) still verify on every store: every report in their
// stored logs, every follow-up run once, the forest listed (and reopened).
#[actix_rt::test]
async fn roots_that_page_out_their_logs_verify_with_forks_of_them() {
    let postgres = crate::support::postgres::postgres_or_skip!().fresh_database();
    for store in [LoadStore::Memory, LoadStore::Sled, LoadStore::Postgres] {
        let scenario = Scenario {
            roots: 2,
            children: 60,
            fork_share: 0.5,
            resident_events: 16,
            store,
            store_url: (store == LoadStore::Postgres).then(|| postgres.clone()),
            ..Scenario::default()
        };
        let report = run_to_end(&scenario).await;
        assert!(report.passed, "{store:?}: {report}");
        assert_eq!(report.children.total, 120);
        assert_eq!(report.children.one_shot, 60);
    }
}

#[actix_rt::test]
async fn a_scenario_spread_over_two_cluster_nodes_verifies() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let mut scenario = small(LoadStore::Postgres);
    scenario.store_url = Some(url.clone());
    scenario.nodes = 2;
    // Slow enough turns that a first follow-up usually catches its child on the other node.
    scenario.latency = subagents::load::Latency::Fixed { ms: 50 };
    let report = run_to_end(&scenario).await;
    assert!(report.passed, "{report}");
    assert_eq!(report.children.total, scenario.total_children().unwrap());
    assert_eq!(report.followups.refused_by_budget, 2);
    assert_eq!(report.followups.reports_sent, 2);
    assert!(report.latency.cross_node_followup_acceptance.count <= report.followups.accepted);
    // The children placed on the second node were started, asked and released across nodes.
    let answered: i64 = tokio::task::spawn_blocking(move || {
        futures::executor::block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let driven = tokio::spawn(connection);
            let count = client
                .query_one(
                    "SELECT count(*) FROM subagents_deliveries WHERE state = 'answered'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            driven.abort();
            count
        })
    })
    .await
    .unwrap();
    assert!(answered > 0, "no delivery crossed the nodes");
}

#[actix_rt::test]
async fn the_window_bounds_the_root_children_in_flight() {
    // One level, so every child in flight is a root child.
    let scenario = Scenario {
        roots: 2,
        children: 10,
        depth: 1,
        in_flight: 2,
        store: LoadStore::Memory,
        workers: 1,
        ..Scenario::default()
    };
    let report = run_to_end(&scenario).await;
    assert!(report.passed, "{report}");
    assert_eq!(report.children.total, 20);
    assert!(
        report.memory.peak_live_children <= 2,
        "{} children were in flight at once",
        report.memory.peak_live_children
    );
}

#[test]
fn a_broken_scenario_file_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "roots = 2\nchildrn = 5\n").unwrap();
    let error = Scenario::from_file(&unknown).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgs);
    assert!(error.message().contains("childrn"), "{error}");

    let out_of_range = dir.path().join("share.json");
    std::fs::write(&out_of_range, r#"{"continuable_share": 1.5}"#).unwrap();
    let error = Scenario::from_file(&out_of_range).unwrap_err();
    assert!(error.message().contains("continuable_share"), "{error}");

    let no_window = dir.path().join("window.json");
    std::fs::write(&no_window, r#"{"in_flight": 0}"#).unwrap();
    let error = Scenario::from_file(&no_window).unwrap_err();
    assert!(error.message().contains("in_flight"), "{error}");

    let no_cache = dir.path().join("cache.json");
    std::fs::write(&no_cache, r#"{"store-cache-mib": 0}"#).unwrap();
    let error = Scenario::from_file(&no_cache).unwrap_err();
    assert!(error.message().contains("store_cache_mib"), "{error}");

    // The page cache is sled's: a run on memory has none to size.
    let not_sled = dir.path().join("cache_on_memory.json");
    std::fs::write(&not_sled, r#"{"store": "memory", "store_cache_mib": 64}"#).unwrap();
    let error = Scenario::from_file(&not_sled).unwrap_err();
    assert!(
        error.message().contains("only to the sled store"),
        "{error}"
    );

    // Unset, a run asks sled for the default cache; set, for what it names.
    assert_eq!(
        Scenario::default().store_cache_bytes(),
        subagents::load::DEFAULT_STORE_CACHE_MIB << 20
    );
    let sized = Scenario {
        store_cache_mib: Some(64),
        ..Scenario::default()
    };
    assert_eq!(sized.store_cache_bytes(), 64 << 20);

    let no_url = dir.path().join("postgres.json");
    std::fs::write(&no_url, r#"{"store": "postgres"}"#).unwrap();
    let error = Scenario::from_file(&no_url).unwrap_err();
    assert!(error.message().contains("store_url"), "{error}");

    let lone = dir.path().join("nodes.json");
    std::fs::write(&lone, r#"{"nodes": 2}"#).unwrap();
    let error = Scenario::from_file(&lone).unwrap_err();
    assert!(error.message().contains("`nodes`"), "{error}");
    assert!(error.message().contains("postgres"), "{error}");

    let wrong_type = dir.path().join("type.toml");
    std::fs::write(&wrong_type, "roots = \"many\"\n").unwrap();
    let error = Scenario::from_file(&wrong_type).unwrap_err();
    assert!(error.message().contains("roots"), "{error}");

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "roots = 1\nchildren = 3\n[latency]\nkind = \"uniform\"\nmin = 1\nmax = 3\n",
    )
    .unwrap();
    let scenario = Scenario::from_file(&good).unwrap();
    assert_eq!(scenario.children, 3);
    assert_eq!(
        scenario.depth,
        Scenario::default().depth,
        "the rest keeps its defaults"
    );

    // The flags' spelling and the flag's latency forms are accepted in a file too.
    let short = dir.path().join("short.toml");
    std::fs::write(
        &short,
        "in-flight = 3
fork-share = 0.5
latency = 5
",
    )
    .unwrap();
    let scenario = Scenario::from_file(&short).unwrap();
    assert_eq!((scenario.in_flight, scenario.fork_share), (3, 0.5));
    assert_eq!(scenario.latency, Latency::Fixed { ms: 5 });
    let range = dir.path().join("range.json");
    std::fs::write(&range, r#"{"latency": "2..10"}"#).unwrap();
    assert_eq!(
        Scenario::from_file(&range).unwrap().latency,
        Latency::Uniform { min: 2, max: 10 }
    );
    let negative = dir.path().join("negative.toml");
    std::fs::write(
        &negative,
        "latency = -3
",
    )
    .unwrap();
    let error = Scenario::from_file(&negative).unwrap_err();
    assert!(
        error.message().contains("number of milliseconds"),
        "{error}"
    );
    let yaml = dir.path().join("scenario.yaml");
    std::fs::write(
        &yaml,
        "roots: 1
",
    )
    .unwrap();
    let error = Scenario::from_file(&yaml).unwrap_err();
    assert!(error.message().contains("expected TOML"), "{error}");
}

/// Runs the default scenario with `--json --plot` into `file` in a fresh directory; the plot's
/// bytes and the report.
fn plotted(file: &str) -> (Vec<u8>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join(file);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--store", "memory", "--json", "--plot"])
        .arg(&plot)
        .output()
        .unwrap();
    assert_succeeded(&output);
    let report = serde_json::from_slice(&output.stdout).unwrap();
    (std::fs::read(&plot).unwrap(), report)
}

// The plot of a default run: a title naming the scenario, four panels with their units over
// one time axis, the drain shaded and labelled, and each series drawn from enough samples to be
// a picture (a default run lasts a fraction of a second).
#[test]
fn the_plot_of_a_default_run_shows_the_scenario_four_series_and_the_drain() {
    let (svg, report) = plotted("run.svg");
    let svg = String::from_utf8(svg).unwrap();
    // Sampled through the drain: the last sample is taken once the drain is over.
    let last_ms = report["timeline"]
        .as_array()
        .and_then(|timeline| timeline.last())
        .and_then(|sample| sample["at_ms"].as_u64())
        .unwrap();
    let grown_and_drained = report["elapsed_s"].as_f64().unwrap()
        + report["listing_s"].as_f64().unwrap()
        + report["drain_s"].as_f64().unwrap();
    assert!(
        last_ms + 1 >= (grown_and_drained * 1000.0) as u64,
        "the last sample at {last_ms} ms, the drain over at {grown_and_drained} s"
    );

    for text in [
        "subagents load: 4 roots × 250 children each",
        "children in flight",
        "epochs settled per second",
        "follow-ups accepted per second",
        "resident set size",
        "seconds since the first child started",
        "epochs/s",
        "follow-ups/s",
        "MiB",
        "listing, drain",
    ] {
        assert!(svg.contains(text), "the plot says {text:?}");
    }
    let lines: Vec<usize> = svg
        .split("<polyline")
        .skip(1)
        .map(|line| {
            let points = line.split("points=\"").nth(1).unwrap_or("");
            points
                .split('"')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .collect();
    assert!(lines.len() >= 4, "a line per series at least: {lines:?}");
    assert!(
        lines.iter().filter(|points| **points >= 10).count() >= 4,
        "each series has points enough to be a picture: {lines:?}"
    );
    // A PNG is a real image of the size the SVG has.
    let (png, _) = plotted("run.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1100, 1000));
}

// A plot that cannot be written (here a disk that is full) loses nothing of the run: the
// report is printed whole, and the failure is said once, without a runtime error code.
#[cfg(target_os = "linux")]
#[test]
fn a_plot_that_cannot_be_written_keeps_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("run.svg");
    std::os::unix::fs::symlink("/dev/full", &plot).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--store", "memory", "--plot"])
        .arg(&plot)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("verification passed"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the plot was not drawn"), "{stderr}");
    assert!(stderr.contains("the report above is whole"), "{stderr}");
    assert!(!stderr.contains("INVALID_ARGS"), "{stderr}");
}

#[test]
fn the_cli_prints_json_draws_the_plot_and_refuses_a_bad_flag_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("run.svg");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "load",
            "--roots",
            "1",
            "--children",
            "10",
            "--store",
            "memory",
            "--json",
        ])
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert_succeeded(&output);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["children"]["total"], 10);
    assert!(report["timeline"]
        .as_array()
        .is_some_and(|timeline| !timeline.is_empty()));
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));

    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--continuable-share", "2"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("continuable_share"), "{stderr}");
    assert!(
        !stderr.contains("SubagentError {"),
        "printed for a person: {stderr}"
    );

    // The report for a person leaves the floors to `--verbose` (the JSON above has them).
    let small_run = [
        "load",
        "--store",
        "memory",
        "--roots",
        "1",
        "--children",
        "10",
    ];
    for (verbose, floors) in [(false, false), (true, true)] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.args(small_run);
        if verbose {
            command.arg("--verbose");
        }
        let output = command.output().unwrap();
        assert!(output.status.success());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("children: 10 = 5 one-shot + 5 continuable"),
            "{stdout}"
        );
        assert_eq!(stdout.contains("the actor floor"), floors, "{stdout}");
    }
    assert!(report["floors"]["actor_round_trip_ns"].as_u64().is_some());

    // An output that cannot be written is said to be that, not a store failure.
    let full = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(small_run)
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    crate::support::assert_output_failure_said(&full);

    // Log lines (sled's own among them) reach a pipe as plain text.
    let logged = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--roots", "1", "--children", "3", "--store"])
        .arg(dir.path().join("sled"))
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(logged.status.success());
    let stderr = String::from_utf8_lossy(&logged.stderr);
    assert!(stderr.contains("DEBUG"), "the run logged: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "no terminal escapes: {stderr}");

    // Refused up front, by the flag's own name, before anything runs.
    for (args, named) in [
        (&["--children", "0"][..], "`--children`"),
        (&["--in-flight", "0"][..], "`--in-flight`"),
        (&["--store-cache-mib", "0"][..], "`--store-cache-mib`"),
        (
            &["--store", "memory", "--store-cache-mib", "64"][..],
            "`--store-cache-mib`",
        ),
        (&["--roots", "-1"][..], "'--roots <ROOTS>'"),
        (&["--workers", "100000"][..], "`--workers`"),
        (&["--plot", "run.jpg"][..], "name a `.svg` or `.png` file"),
        (&["--plot", "/nonexistent/run.svg"][..], "cannot be written"),
    ] {
        let refused = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .arg("load")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

#[test]
fn a_load_run_on_postgres_verifies_and_its_forest_prints_from_another_process() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "load",
            "--roots",
            "1",
            "--children",
            "4",
            "--json",
            "--store",
            &url,
        ])
        .output()
        .unwrap();
    assert_succeeded(&output);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["passed"], true);
    let checks = report["checks"].as_array().unwrap();
    assert!(
        checks
            .iter()
            .any(|check| check["name"] == "the store reopens and lists the same forest"),
        "{checks:?}"
    );
    let tree = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["tree", "--json", "--store", &url])
        .output()
        .unwrap();
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let forest: serde_json::Value = serde_json::from_slice(&tree.stdout).unwrap();
    let printed = forest.to_string();
    assert_eq!(
        printed.matches("\"mode\"").count(),
        4,
        "the four children of the run's root: {printed}"
    );
}

// A PostgreSQL store that cannot be reached is named by host and port, with the root cause
// once (it printed four nested "caused by" lines before).
#[test]
fn an_unreachable_postgres_store_is_named_by_host_and_port_once() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["tree", "--store", "postgres://postgres@127.0.0.1:1/db"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: connecting to PostgreSQL at 127.0.0.1:1: "),
        "{stderr}"
    );
    assert!(!stderr.contains("caused by"), "{stderr}");
    assert_eq!(
        stderr.lines().count(),
        2,
        "the error and its code: {stderr}"
    );
}

// `acp-agent --store` reads a URL as a URL (it made a directory named after it before).
#[test]
fn acp_agent_takes_a_postgres_url_as_its_store() {
    let cwd = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["acp-agent", "--store", "postgres://postgres@127.0.0.1:1/db"])
        .current_dir(cwd.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("connecting to PostgreSQL at 127.0.0.1:1"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing was created in the working directory"
    );
    // Unnamed, its store is every command's default, `.subagents` in the working directory;
    // `memory` keeps nothing there.
    for (store, kept) in [(None, true), (Some("memory"), false)] {
        let cwd = tempfile::tempdir().unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        command
            .arg("acp-agent")
            .args(store.map(|store| ["--store", store]).into_iter().flatten());
        let output = command
            .current_dir(cwd.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_succeeded(&output);
        assert_eq!(cwd.path().join(".subagents").is_dir(), kept, "{store:?}");
    }
}

// `load --store DIR` reads a directory as every other command's `--store` does: the run's
// forest is then in that sled store for `tree` (it was refused, asking for `--store-dir`).
#[test]
fn load_into_a_store_directory_leaves_its_forest_for_tree() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("forest");
    let subagents = |args: &[&str], store: Option<&std::path::Path>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.args(args).current_dir(dir.path());
        if let Some(store) = store {
            command.arg("--store").arg(store);
        }
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let roots_and_children = |store: Option<&std::path::Path>| {
        let tree = subagents(&["tree", "--json"], store);
        let forest: serde_json::Value = serde_json::from_slice(&tree.stdout).unwrap();
        let roots = forest.as_array().unwrap();
        (
            roots.len(),
            roots
                .iter()
                .map(|root| root["descendants"].as_array().unwrap().len())
                .sum::<usize>(),
        )
    };
    let run = ["load", "--roots", "1", "--children", "4"];
    // Named, as every command names a store.
    subagents(&run, Some(&store));
    assert_eq!(roots_and_children(Some(&store)), (1, 4));
    // Unnamed: every command's default, `.subagents` in the working directory, which a second
    // run adds its own forest to (and verifies on its own).
    subagents(&run, None);
    assert_eq!(roots_and_children(None), (1, 4));
    subagents(&run, None);
    assert_eq!(roots_and_children(None), (2, 8));
    assert!(dir.path().join(".subagents").is_dir());
    // `memory` is a throwaway store: nothing in it to list.
    let memory = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["tree", "--store", "memory"])
        .output()
        .unwrap();
    assert_eq!(memory.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&memory.stderr);
    assert!(
        stderr.contains("a memory store holds nothing to read"),
        "{stderr}"
    );
}

// A run that fails leaves no empty plot behind (`--plot` is created up front to check it).
#[test]
fn a_failed_run_leaves_no_plot_file() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("run.svg");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "load",
            "--store",
            "postgres://postgres@127.0.0.1:1/db",
            "--plot",
        ])
        .arg(&plot)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(!plot.exists(), "the empty plot was removed");
}
