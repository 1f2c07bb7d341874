//! Benchmarks one agent lifecycle — create → one scripted text turn → when-idle → dispose — on
//! the in-memory and the sled store, beside the floors measured in the same run:
//!
//! - `floor/actor_spawn_round_trip`: start a bare actix actor, one request/response, stop it.
//! - `floor/sled_insert_turn_bytes`: insert into a bare sled tree the same bytes one turn's
//!   events serialize to (one batch, no flush), as the store does for one turn.
//!
//! - `history/step_at/N`: one more text turn of a conversation that already holds N turns. The
//!   model history is kept incrementally, so this stays flat as N grows (a conversation costs
//!   O(turns) in total); the conversation is re-seeded, untimed, before it grows by 2%, and its
//!   first turn (which grows the seeded buffers once) is untimed too.
//!
//! Run with `cargo bench --bench agent_turn`; compare the lifecycle to the floors as ratios.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, Criterion};
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{
    ContentBlock, CreateAgent, MemoryStore, MessageSource, Runtime, SessionEvent,
    SessionPersistence, SledStore,
};

#[path = "support/floors.rs"]
mod floors;

fn runtime(store: Arc<dyn SessionPersistence>) -> Runtime {
    Runtime::builder()
        .shared_store(store)
        .model(
            "scripted",
            ScriptedModel::repeating(ScriptStep::text("done")),
        )
        .build()
        .expect("runtime builds")
}

/// Create → one text turn → when-idle → dispose; returns the agent's log.
async fn one_lifecycle(rt: &Runtime) -> Vec<SessionEvent> {
    let handle = rt
        .agents()
        .create(CreateAgent::new())
        .await
        .expect("create");
    handle
        .agent()
        .followup(vec![ContentBlock::text("work")], MessageSource::User)
        .await
        .expect("followup");
    handle.agent().when_idle().await;
    let events = handle.agent().log().events();
    handle.dispose().await.expect("dispose");
    events
}

/// The size of one text turn's events, serialized as the store writes them (one row).
fn turn_bytes(system: &SystemRunner) -> usize {
    let events =
        system.block_on(async { one_lifecycle(&runtime(Arc::new(MemoryStore::new()))).await });
    serde_json::to_vec(&events).expect("events encode").len()
}

fn bench(c: &mut Criterion) {
    let system = System::new();
    let mut group = c.benchmark_group("agent_turn");
    group
        .measurement_time(Duration::from_secs(4))
        .sample_size(40);

    floors::actor_round_trip(&mut group, &system);
    floors::sled_insert(&mut group, turn_bytes(&system));

    let memory = system.block_on(async { runtime(Arc::new(MemoryStore::new())) });
    group.bench_function("lifecycle/memory", |b| {
        b.iter(|| system.block_on(one_lifecycle(&memory)));
    });

    let sled_rt =
        system.block_on(async { runtime(Arc::new(SledStore::temporary().expect("sled store"))) });
    group.bench_function("lifecycle/sled", |b| {
        b.iter(|| system.block_on(one_lifecycle(&sled_rt)));
    });
    group.finish();

    let mut group = c.benchmark_group("history");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let rt = system.block_on(async { quiet_runtime() });
    for turns in [10u64, 1_000, 10_000] {
        let seed = system.block_on(conversation(&rt, turns));
        let mut current: Option<(subagents::AgentHandle, u64)> = None;
        group.bench_function(format!("step_at/{turns}"), |b| {
            b.iter_custom(|iters| {
                system.block_on(async {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let fresh = match &current {
                            Some((_, grown)) => *grown > (turns / 50).max(10),
                            None => true,
                        };
                        if fresh {
                            if let Some((old, _)) = current.take() {
                                old.dispose().await.expect("dispose");
                            }
                            let fresh = seeded(&rt, &seed).await;
                            // Untimed: the first append grows the seeded log's buffers once
                            // (a one-off page-faulting copy, not a per-step cost).
                            one_turn(fresh.agent()).await;
                            current = Some((fresh, 0));
                        }
                        let (handle, grown) = current.as_mut().expect("an agent");
                        let start = Instant::now();
                        one_turn(handle.agent()).await;
                        timed += start.elapsed();
                        *grown += 1;
                    }
                    timed
                })
            });
        });
        if let Some((old, _)) = current.take() {
            system.block_on(old.dispose()).expect("dispose");
        }
    }
    group.finish();
}

/// A memory-store runtime whose scripted model keeps no request (as a load run does).
fn quiet_runtime() -> Runtime {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    model.set_recording(false);
    Runtime::builder()
        .store(MemoryStore::new())
        .model("scripted", model)
        .build()
        .expect("runtime builds")
}

async fn one_turn(agent: &subagents::AgentRef) {
    agent
        .followup(vec![ContentBlock::text("work")], MessageSource::User)
        .await
        .expect("followup");
    agent.when_idle().await;
}

/// The log of a conversation of `turns` text turns.
async fn conversation(rt: &Runtime, turns: u64) -> Vec<SessionEvent> {
    let handle = rt
        .agents()
        .create(CreateAgent::new())
        .await
        .expect("create");
    for _ in 0..turns {
        one_turn(handle.agent()).await;
    }
    let events = handle.agent().log().events();
    handle.dispose().await.expect("dispose");
    events
}

/// A fresh agent that continues the conversation `seed`.
async fn seeded(rt: &Runtime, seed: &[SessionEvent]) -> subagents::AgentHandle {
    let inherited = u64::try_from(seed.len()).expect("seed length");
    rt.agents()
        .create(CreateAgent::new().seed(seed.to_vec(), inherited))
        .await
        .expect("a seeded agent")
}

criterion_group!(benches, bench);
criterion_main!(benches);
