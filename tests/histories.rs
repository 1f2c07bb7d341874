//! The history checker (`subagents::check`, `subagents check`): seeded random schedules over
//! a forest of continuable children and one-shot runs below it, each history checked against
//! every promise of the continuation core. The suite runs a few dozen schedules; `histories` (ignored: run it with
//! `cargo test --release -- --ignored histories`) runs as many as `SUBAGENTS_CHECK_SCHEDULES`
//! says (10,000 by default).

use subagents::check::{
    replay_command, roots_resident_events, run_schedule, CheckConfig, CheckStore, Shape,
};

/// Runs `count` schedules from seed `first` (memory and sled in turn) on a runtime of
/// `workers` threads and fails with every broken promise and the commands that replay them.
async fn check(first: u64, count: u64, ops: usize, workers: usize) {
    let mut failures = Vec::new();
    let (mut paged_out, mut one_shots) = (0, 0);
    for seed in first..first + count {
        let config = CheckConfig {
            store: if seed % 2 == 0 {
                CheckStore::Memory
            } else {
                CheckStore::Sled
            },
            shape: Shape {
                ops,
                faults: true,
                reopen: true,
            },
            workers,
            ..CheckConfig::default()
        };
        let report = run_schedule(seed, &config, None)
            .await
            .expect("the check runs");
        paged_out += report.paged_out;
        one_shots += report.one_shots;
        if !report.anomalies.is_empty() {
            failures.push(format!(
                "schedule {seed}: {:?}\n  replay: {}",
                report.anomalies,
                replay_command(seed, &config, None)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(one_shots > 0, "no one-shot run was answered");
    // The promises were checked across page-outs too, when some schedule's roots paged.
    if (first..first + count).any(|seed| roots_resident_events(seed).is_some()) {
        assert!(paged_out > 0, "no root paged its log out");
    }
}

// Every promise holds over the suite's share of schedules (seeds chosen apart from the CLI's
// default range, so the two cover different histories).
#[actix_rt::test]
async fn seeded_schedules_keep_every_promise() {
    check(1_000_000, 40, 48, 1).await;
}

// The same promises with the runtime's agents on two threads, where children run beside their
// callers: a start refused although its child was stored, and a stale parent's follow-up
// accepted, were found this way (`subagents check --workers 2`).
#[actix_rt::test]
async fn seeded_schedules_on_two_workers_keep_every_promise() {
    check(2_000_000, 40, 48, 2).await;
}

// The big run: `SUBAGENTS_CHECK_SCHEDULES` schedules (10,000 by default) from
// `SUBAGENTS_CHECK_SEED` (1 by default), on `SUBAGENTS_CHECK_WORKERS` threads (1 by default).
#[actix_rt::test]
#[ignore = "thousands of schedules: run with cargo test --release -- --ignored histories"]
async fn histories() {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    check(
        number("SUBAGENTS_CHECK_SEED", 1),
        number("SUBAGENTS_CHECK_SCHEDULES", 10_000),
        48,
        usize::try_from(number("SUBAGENTS_CHECK_WORKERS", 1)).unwrap_or(1),
    )
    .await;
}
