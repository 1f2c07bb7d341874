//! Benchmarks `list_children` over N = 10,000 continuable children of one parent, beside the
//! actor floor measured in the same run:
//!
//! - `live`: every child resident (held mid-turn at a gate): each identity comes from the
//!   registry's watermark cell, with no store read.
//! - `cold_cached`: every child released, with the checkpoint rows its runtime wrote at turn end
//!   and disposal: each identity comes from the cache, behind the seq gate.
//! - `cold_refold`: the same store read by a runtime without the cache: each child's log is
//!   inspected and folded (4 at once).
//!
//! Run with `cargo bench --bench listing` (`SUBAGENTS_LISTING=1000` for another N).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, Criterion};
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, CancellationToken, ContentBlock, ContinuableStartSpec, CreateAgent, MemoryStore,
    Runtime, SessionId, SessionPersistence, SpawnInProcess, SubagentListEntry,
};
use tokio::sync::mpsc;

#[path = "support/ended.rs"]
mod ended;
#[allow(dead_code)]
#[path = "support/floors.rs"]
mod floors;

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does.
#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

#[path = "support/process.rs"]
mod process;

fn children() -> usize {
    std::env::var("SUBAGENTS_LISTING")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// The parent's id, once created: its steps are refused (it is parked, as in the reference's
/// scenario), so ten thousand settled notices do not make it converse with the model.
type Parked = Arc<std::sync::Mutex<Option<SessionId>>>;

/// A runtime over `store` answering with `model`, with `spawn` registered.
async fn runtime(
    store: Arc<dyn SessionPersistence>,
    model: ScriptedModel,
    cache: bool,
    parked: &Parked,
) -> Runtime {
    let parked = Arc::clone(parked);
    let park: subagents::host::PreStepHook = Arc::new(move |step, decision| {
        let parent = *parked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if Some(step.agent) == parent {
            subagents::host::PreStepDecision::Reject
        } else {
            decision
        }
    });
    let builder = Runtime::builder()
        .shared_store(store)
        .model("scripted", model)
        .pre_step_hook(park);
    let builder = if cache {
        builder
    } else {
        builder.without_projection_cache()
    };
    let rt = builder.build().expect("runtime builds");
    rt.subagents()
        .register_provider(SpawnInProcess::default())
        .await
        .expect("spawn registers")
        .keep();
    rt
}

/// Starts `n` continuable children under a fresh parent; the parent and the receiver of their
/// `subagent/end` events.
async fn grow(
    rt: &Runtime,
    n: usize,
    parked: &Parked,
) -> (
    AgentHandle,
    mpsc::UnboundedReceiver<SessionId>,
    subagents::Subscription,
) {
    let parent = rt
        .agents()
        .create(CreateAgent::new())
        .await
        .expect("parent");
    *parked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(parent.agent().id());
    let (ended, subscription) = ended::ended_children(rt, parent.agent().id());
    for _ in 0..n {
        rt.subagents()
            .start_continuable(ContinuableStartSpec::new(
                "spawn",
                "bench",
                parent.agent(),
                vec![ContentBlock::text("work")],
            ))
            .await
            .expect("start");
    }
    (parent, ended, subscription)
}

async fn list(rt: &Runtime, parent: SessionId, expected: usize) {
    let rows = rt
        .subagents()
        .list_children(parent, CancellationToken::new())
        .await
        .expect("listing");
    assert_eq!(rows.len(), expected);
    assert!(rows
        .iter()
        .all(|row| matches!(row, SubagentListEntry::Child { .. })));
}

fn bench(c: &mut Criterion) {
    process::like_the_binary();
    let n = children();
    let system = System::new();
    let mut group = c.benchmark_group("listing");
    group
        .measurement_time(Duration::from_secs(5))
        .sample_size(10);
    floors::actor_round_trip(&mut group, &system);

    // Cold: every child started, settled and released; the cache holds their rows.
    let store: Arc<MemoryStore> = Arc::new(MemoryStore::new());
    let parked = Parked::default();
    let (cached, refolding, parent) = system.block_on(async {
        let rt = runtime(
            store.clone(),
            ScriptedModel::repeating(ScriptStep::text("done")),
            true,
            &parked,
        )
        .await;
        let (parent, mut ended, _subscription) = grow(&rt, n, &parked).await;
        for _ in 0..n {
            ended.recv().await.expect("every child settles");
        }
        let parent_id = parent.agent().id();
        // The last turn-end checkpoints run on their own tasks: wait until the cache has every
        // row, so the cached pass measures the cache alone.
        let began = Instant::now();
        loop {
            let rows = rt
                .subagents()
                .list_children(parent_id, CancellationToken::new())
                .await
                .expect("listing");
            let mut missing = 0;
            for row in &rows {
                if store
                    .cache_get("subagent", row.id())
                    .await
                    .expect("cache read")
                    .is_none()
                {
                    missing += 1;
                }
            }
            if missing == 0 || began.elapsed() > Duration::from_secs(30) {
                break;
            }
            tokio::task::yield_now().await;
        }
        let refolding = runtime(
            store.clone(),
            ScriptedModel::repeating(ScriptStep::text("done")),
            false,
            &parked,
        )
        .await;
        (rt, refolding, parent_id)
    });
    group.bench_function(format!("cold_cached/{n}"), |b| {
        b.iter(|| system.block_on(list(&cached, parent, n)));
    });
    group.bench_function(format!("cold_refold/{n}"), |b| {
        b.iter(|| system.block_on(list(&refolding, parent, n)));
    });
    system.block_on(async {
        cached.shutdown().await.expect("shutdown");
        refolding.shutdown().await.expect("shutdown");
    });

    // Live: every child resident, held mid-turn.
    let gate = Gate::new();
    let (live, parent) = system.block_on(async {
        let rt = runtime(
            Arc::new(MemoryStore::new()),
            ScriptedModel::repeating(ScriptStep::text("held").gated(&gate)),
            true,
            &parked,
        )
        .await;
        let (parent, _ended, _subscription) = grow(&rt, n, &parked).await;
        let id = parent.agent().id();
        (rt, id)
    });
    group.bench_function(format!("live/{n}"), |b| {
        b.iter(|| system.block_on(list(&live, parent, n)));
    });
    group.finish();
    system.block_on(async {
        live.shutdown().await.expect("shutdown");
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
