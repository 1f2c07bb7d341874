//! Benchmarks one agent lifecycle — create → one scripted text turn → when-idle → dispose — on
//! the in-memory and the sled store, beside the floors measured in the same run:
//!
//! - `floor/actor_spawn_round_trip`: start a bare actix actor, one request/response, stop it.
//! - `floor/sled_insert_turn_bytes`: insert into a bare sled tree the same bytes one turn's
//!   events serialize to (one batch, no flush), as the store does for one turn.
//!
//! Run with `cargo bench --bench agent_turn`; compare the lifecycle to the floors as ratios.

use std::sync::Arc;
use std::time::Duration;

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

/// The serialized events of one text turn, as the store writes them.
fn turn_bytes(system: &SystemRunner) -> Vec<(Vec<u8>, Vec<u8>)> {
    let events =
        system.block_on(async { one_lifecycle(&runtime(Arc::new(MemoryStore::new()))).await });
    events
        .iter()
        .map(|event| {
            // The store's key layout: session id (16 bytes) ‖ big-endian seq.
            let mut key = [7u8; 16].to_vec();
            key.extend_from_slice(&event.seq.to_be_bytes());
            (key, serde_json::to_vec(event).expect("event encodes"))
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let system = System::new();
    let mut group = c.benchmark_group("agent_turn");
    group
        .measurement_time(Duration::from_secs(4))
        .sample_size(40);

    floors::actor_round_trip(&mut group, &system);
    floors::sled_insert(&mut group, &turn_bytes(&system));

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
}

criterion_group!(benches, bench);
criterion_main!(benches);
