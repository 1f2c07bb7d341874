//! Measures the memory one in-flight one-shot child holds, from 100 to 100,000 in flight: each
//! pass holds N `spawn` runs mid-turn at a gate (every child's model request waiting), reads
//! the live heap (exact, counted by the allocator) and the RSS, then releases and disposes
//! them. The goal is a figure flat from 100 to 100,000.
//!
//! Run with `cargo bench --bench in_flight_memory` (`SUBAGENTS_HELD=1000,50000` for other
//! counts). Not sampled by criterion: one figure per count.

use std::sync::Arc;

use actix::prelude::*;
use futures::future::join_all;
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{ContentBlock, MemoryStore, SubagentStartRequest};

#[path = "support/live_bytes.rs"]
mod live_bytes;
#[path = "support/parent.rs"]
mod parent;

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does, counting live heap bytes.
#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

#[path = "support/process.rs"]
mod process;

/// The counts to hold: `SUBAGENTS_HELD` (comma-separated), else 100 to 100,000.
fn held_counts() -> Vec<usize> {
    std::env::var("SUBAGENTS_HELD")
        .ok()
        .map(|counts| {
            counts
                .split(',')
                .filter_map(|count| count.trim().parse().ok())
                .filter(|count| *count > 0)
                .collect::<Vec<usize>>()
        })
        .filter(|counts| !counts.is_empty())
        .unwrap_or_else(|| vec![100, 1_000, 10_000, 100_000])
}

/// Holds `held` runs mid-turn; answers (live heap bytes, RSS bytes) per held child.
async fn hold(held: usize) -> (u64, u64) {
    let gate = Gate::new();
    // The parent's own turn answers at once; every child's answer is held at the gate.
    let model = ScriptedModel::with_script([ScriptStep::text("parent")]);
    model.set_fallback(ScriptStep::text("held").gated(&gate));
    let (rt, parent) = parent::runtime_with_parent(
        Arc::new(MemoryStore::forgetting_one_shots()),
        model.clone(),
        1,
    )
    .await;
    let heap_before = live_bytes::live_bytes();
    let rss_before = subagents::load::rss_bytes();
    let runs = join_all((0..held).map(|_| {
        rt.subagents().start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), vec![ContentBlock::text("work")]),
        )
    }))
    .await;
    // Every child is mid-turn once its model request is waiting at the gate.
    while model.request_count() < held + 1 {
        tokio::task::yield_now().await;
    }
    let heap = live_bytes::live_bytes().saturating_sub(heap_before);
    let rss = subagents::load::rss_bytes().saturating_sub(rss_before);
    gate.release();
    for run in runs {
        let run = run.expect("start");
        run.result().await.expect("result");
        run.dispose().await.expect("dispose");
    }
    parent.dispose().await.expect("parent disposes");
    rt.shutdown().await.expect("shutdown");
    let held = u64::try_from(held).expect("small");
    (u64::try_from(heap).expect("small") / held, rss / held)
}

fn main() {
    process::like_the_binary();
    let system = System::new();
    for held in held_counts() {
        let (heap, rss) = system.block_on(hold(held));
        // RSS moves in pages and reuses what an earlier pass freed; the live heap is exact.
        eprintln!(
            "memory: {held} one-shot children in flight hold {heap} B of live heap each ({rss} B of RSS growth each)"
        );
    }
}
