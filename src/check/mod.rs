//! The history checker: randomized, seeded, reproducible schedules over a forest of continuable
//! children, each checked against the promises the runtime makes (`subagents check`, and the
//! `histories` tests).
//!
//! In the spirit of Jepsen's checkers and FoundationDB's simulation, run in-process: a seed
//! names a [`schedule`] of operations — starts (spawn and fork, held turns, budgets, cancelled
//! or dropped callers, racing in the background), one-shot runs below any node (spawn and fork,
//! held, cancelled or dropped callers), bursts of follow-ups (from the parent, a
//! stale incarnation of it or a stranger, some raising budgets), interrupts under right and
//! wrong authority, quiet and waking reports, released turns, scoped drains, root parents
//! disposed and resumed (by racing `Agents::resume` calls), store operations failing or held
//! ([`crate::testing::FaultInjectingStore`]), shutdown and reopen (half of them with operations
//! in flight and turns held) — against a model with seeded
//! latency. The driver records every operation's answer and every lifecycle and inbox event in
//! one order (the runtime runs on one thread); once the runtime is shut down, every log is
//! read back from the store and the history is checked:
//!
//! - **exactly once**: every accepted message is inserted once, then claimed once or
//!   discarded once (its recorded reason); a session whose durable write failed is excused
//!   only from settling it; nothing is inserted, claimed or discarded twice;
//! - **FIFO**: turns claim a child's messages in acceptance order, and sequential follow-ups
//!   are accepted in the order they were sent;
//! - **one Activation**: a child's `subagent/start` and `subagent/end` alternate, and every
//!   epoch ends;
//! - **notices**: each announced epoch makes its parent session hear exactly one settled
//!   notice (in its log, or in its stored inbox while it is away), a rolled-back one none;
//! - **no ghost**: a refused or cancelled start leaves nothing stored or listed, and listing
//!   shows no diagnostic;
//! - **durable answers**: no answered start is missing from the store, no accepted follow-up
//!   from its child's stored log (unless a failed write faulted the child);
//! - **readable**: every stored session's log reads back whole, through its seed's references;
//! - **nothing live** after a drain (below it) or a shutdown, each within a deadline, and no
//!   operation hangs;
//! - **nothing left behind**: once every operation is over, the live agents are the live roots
//!   and the resident continuable children: a one-shot run, however its caller let go of it,
//!   disposes of its child (within a deadline), and a one-shot child's result goes to its
//!   caller, never as a settled notice to its parent;
//! - **authority**: a stale or foreign sender is refused, a wrong interrupt is refused, racing
//!   resumes have at most one winner, and no live session is ever fenced.
//!
//! A failing schedule is shrunk ([`shrink`]) by dropping operations while it still fails, and
//! reported with a command that replays it.

mod book;
mod calls;
mod driver;
mod model;
mod schedule;
mod verify;

use std::time::{Duration, Instant};

use serde::Serialize;

pub use book::Anomaly;
use book::SharedBook;
use driver::{reader, Backing, World};
pub use schedule::{roots_resident_events, schedule, Authority, LetGo, Op, Pick, Sender, Shape};

use crate::error::Result;
use crate::store::MemoryStore;

/// The store a schedule runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckStore {
    /// In memory.
    Memory,
    /// A sled directory (reopened from disk).
    Sled,
}

/// How a schedule is made and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckConfig {
    /// The store.
    pub store: CheckStore,
    /// What the schedule may contain.
    pub shape: Shape,
    /// The root agents.
    pub roots: usize,
    /// The most latency a model call draws.
    pub max_latency: Duration,
    /// The threads the runtime spreads its agents over ([`crate::RuntimeBuilder::workers`]):
    /// 1 keeps every schedule on one thread; 2 puts children on a second thread too, and a
    /// sled store's writes then go through its write thread.
    pub workers: usize,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            store: CheckStore::Memory,
            shape: Shape {
                ops: 48,
                faults: true,
                reopen: true,
            },
            roots: 2,
            max_latency: Duration::from_micros(300),
            workers: 1,
        }
    }
}

/// One schedule's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleReport {
    /// The seed that names the schedule.
    pub seed: u64,
    /// The store it ran on.
    pub store: CheckStore,
    /// The settled events its roots kept in memory, when they paged the rest out
    /// ([`roots_resident_events`]).
    pub resident_events: Option<u32>,
    /// The events its roots' logs paged out of memory (counted when each root's handle went:
    /// a resumed root counts again what it pages out again).
    pub paged_out: u64,
    /// The operations it ran (all of the schedule's, or the kept ones).
    pub ops: Vec<Op>,
    /// The kept operations' positions, when only some ran.
    pub kept: Option<Vec<usize>>,
    /// What broke; empty for a schedule that kept every promise.
    pub anomalies: Vec<Anomaly>,
    /// Continuable children whose start was answered.
    pub children: usize,
    /// One-shot runs whose start was answered.
    pub one_shots: usize,
    /// Messages answered as accepted.
    pub accepted: usize,
    /// How long it took.
    #[serde(with = "millis")]
    pub elapsed: Duration,
}

mod millis {
    pub(super) fn serialize<S: serde::Serializer>(
        value: &std::time::Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Runs the schedule `seed` names (only the operations at `keep`, when given) and checks its
/// history. Must run inside an actix `System` (whose thread the schedule's calls run on; with
/// more than one worker, agents run on started worker threads too).
///
/// # Errors
/// Only when the check itself could not run (a store that would not open); every broken
/// promise is an [`Anomaly`] in the report.
pub async fn run_schedule(
    seed: u64,
    config: &CheckConfig,
    keep: Option<&[usize]>,
) -> Result<ScheduleReport> {
    let began = Instant::now();
    let all = schedule(seed, config.shape);
    let ops: Vec<Op> = match keep {
        Some(keep) => keep.iter().filter_map(|at| all.get(*at).cloned()).collect(),
        None => all,
    };
    let backing = match config.store {
        CheckStore::Memory => Backing::Memory(std::sync::Arc::new(MemoryStore::new())),
        CheckStore::Sled => Backing::Sled(
            tempfile::tempdir().map_err(|error| {
                crate::error::SubagentError::new(
                    crate::error::ErrorCode::StoreIo,
                    format!("a temporary directory for the check: {error}"),
                )
            })?,
            std::sync::Weak::new(),
        ),
    };
    let book = SharedBook::default();
    let model = model::CheckModel::new(seed, config.max_latency);
    let resident_events = roots_resident_events(seed);
    let root_options = crate::AgentOptions {
        resident_events,
        ..crate::AgentOptions::default()
    };
    let mut world = World::open(
        backing,
        model,
        book.clone(),
        (config.roots, config.workers),
        root_options,
    )
    .await?;
    for op in &ops {
        world.apply(op).await?;
    }
    let roots = world.root_ids();
    let (mut backing, paged_out) = world.close().await;
    let (reading, store, released) = reader(&mut backing).await?;
    // The runtime is gone: the book is the driver's alone now.
    let mut book = std::mem::take(&mut *book.lock());
    if !released {
        book.anomaly(
            "left-behind",
            "the store was still held a deadline after the runtime was shut down and dropped",
        );
    }
    verify::verify(&mut book, &reading, &store, &roots).await?;
    reading.shutdown().await?;
    drop((reading, store));
    Ok(ScheduleReport {
        seed,
        store: config.store,
        resident_events: resident_events.map(std::num::NonZeroU32::get),
        paged_out,
        ops,
        kept: keep.map(<[usize]>::to_vec),
        children: book.children.len(),
        one_shots: book.one_shots.len(),
        accepted: book.accepted.len(),
        anomalies: book.anomalies,
        elapsed: began.elapsed(),
    })
}

/// Shrinks a failing schedule: drops runs of operations (halves, then quarters, down to
/// single ones) while what is left still fails (any anomaly, in one of `tries` runs: timing
/// varies between runs). Answers the positions of the operations kept.
///
/// # Errors
/// As [`run_schedule`].
pub async fn shrink(seed: u64, config: &CheckConfig, tries: usize) -> Result<Vec<usize>> {
    let mut kept: Vec<usize> = (0..config.shape.ops).collect();
    let mut chunk = kept.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        let mut removed_any = false;
        while start < kept.len() {
            let end = (start + chunk).min(kept.len());
            let candidate: Vec<usize> = kept[..start].iter().chain(&kept[end..]).copied().collect();
            let mut fails = false;
            for _ in 0..tries.max(1) {
                if !run_schedule(seed, config, Some(&candidate))
                    .await?
                    .anomalies
                    .is_empty()
                {
                    fails = true;
                    break;
                }
            }
            if fails {
                kept = candidate;
                removed_any = true;
            } else {
                start = end;
            }
        }
        if chunk == 1 && !removed_any {
            return Ok(kept);
        }
        chunk = (chunk / 2).max(1);
    }
}

/// The command that replays schedule `seed` on `store` (only the operations at `kept`).
pub fn replay_command(seed: u64, config: &CheckConfig, kept: Option<&[usize]>) -> String {
    let store = match config.store {
        CheckStore::Memory => "memory",
        CheckStore::Sled => "sled",
    };
    let mut command = format!(
        "cargo run --release -- check --seed {seed} --schedules 1 --store {store} --ops {}",
        config.shape.ops
    );
    if !config.shape.faults {
        command.push_str(" --no-faults");
    }
    if config.workers > 1 {
        command.push_str(&format!(" --workers {}", config.workers));
    }
    if let Some(kept) = kept {
        let list: Vec<String> = kept.iter().map(ToString::to_string).collect();
        command.push_str(&format!(" --keep {}", list.join(",")));
    }
    command
}
