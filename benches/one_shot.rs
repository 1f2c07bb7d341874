//! Benchmarks one-shot delegations: `spawn` and `fork`, one at a time and with 100 / 1,000 / 4,000 /
//! 10,000 in flight, against a zero-latency scripted model, on the in-memory and the sled
//! store. The floors of `agent_turn` are measured in the same run so results can be quoted as
//! ratios:
//!
//! - `floor/actor_spawn_round_trip`: start a bare actix actor, one request/response, stop it.
//! - `floor/sled_insert_turn_bytes`: one sled row of a child turn's event bytes.
//!
//! A run here is: `start` → `result` → `dispose`. Run with `cargo bench --bench one_shot`.
//! The memory an in-flight child holds is measured by `cargo bench --bench in_flight_memory`.

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does: glibc's allocator fragments
/// badly under tens of thousands of short-lived children.
#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

#[path = "support/process.rs"]
mod process;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::future::join_all;
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{AgentHandle, MemoryStore, Runtime, SessionPersistence, SledStore};

#[path = "support/floors.rs"]
mod floors;
#[path = "support/one_run.rs"]
mod one_run;
#[path = "support/parent.rs"]
mod parent;

use one_run::one_run;

/// A runtime with both in-process providers and a parent that completed one turn (so a fork
/// child inherits a real prefix).
async fn setup(store: Arc<dyn SessionPersistence>, model: ScriptedModel) -> (Runtime, AgentHandle) {
    parent::runtime_with_parent(store, model, 1).await
}

async fn many_runs(rt: &Runtime, parent: &AgentHandle, provider: &str, in_flight: usize) {
    join_all((0..in_flight).map(|_| one_run(rt, parent, provider))).await;
}

fn floors(c: &mut Criterion, system: &SystemRunner) {
    let mut group = c.benchmark_group("one_shot");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    floors::actor_round_trip(&mut group, system);
    // A child turn's 14 events at a typical ~300 bytes each, as one row.
    floors::sled_insert(&mut group, 14 * 300);
    group.finish();
}

/// The stores each load runs on, by name.
const STORES: [&str; 3] = ["memory", "memory-forgetting", "sled"];

/// A fresh store named `name` (see [`STORES`]).
fn store(name: &str) -> Arc<dyn SessionPersistence> {
    match name {
        "memory" => Arc::new(MemoryStore::new()),
        // Lets each disposed child go: the store stays the size of what is in flight.
        "memory-forgetting" => Arc::new(MemoryStore::forgetting_one_shots()),
        _ => Arc::new(SledStore::temporary().expect("sled store")),
    }
}

/// Runs `body` against a fresh runtime on a fresh store named `store_name`, then shuts the
/// runtime down. Each benchmark gets its own: a store that keeps every child (`memory`) would
/// otherwise hold every child of every benchmark before it until the process ends, which
/// outgrew this machine's 24 GiB in one `cargo bench --bench one_shot`.
fn on_fresh_runtime(
    system: &SystemRunner,
    store_name: &str,
    body: impl FnOnce(&Runtime, &AgentHandle),
) {
    let (rt, parent) = system.block_on(setup(
        store(store_name),
        ScriptedModel::repeating(ScriptStep::text("done")),
    ));
    body(&rt, &parent);
    drop(parent);
    system.block_on(rt.shutdown()).expect("shutdown");
}

fn sequential(c: &mut Criterion, system: &SystemRunner) {
    let mut group = c.benchmark_group("one_shot/sequential");
    group
        .measurement_time(Duration::from_secs(4))
        .sample_size(30)
        .throughput(Throughput::Elements(1));
    for store_name in STORES {
        for provider in ["spawn", "fork"] {
            on_fresh_runtime(system, store_name, |rt, parent| {
                group.bench_function(BenchmarkId::new(provider, store_name), |b| {
                    b.iter(|| system.block_on(one_run(rt, parent, provider)));
                });
            });
        }
    }
    group.finish();
}

fn in_flight(c: &mut Criterion, system: &SystemRunner) {
    let mut group = c.benchmark_group("one_shot/in_flight");
    group
        .measurement_time(Duration::from_secs(6))
        .sample_size(10);
    for store_name in STORES {
        for n in [100usize, 1_000, 4_000, 10_000] {
            group.throughput(Throughput::Elements(u64::try_from(n).expect("small")));
            for provider in ["spawn", "fork"] {
                on_fresh_runtime(system, store_name, |rt, parent| {
                    group.bench_function(
                        BenchmarkId::new(format!("{provider}/{store_name}"), n),
                        |b| {
                            b.iter(|| system.block_on(many_runs(rt, parent, provider, n)));
                        },
                    );
                });
            }
        }
    }
    group.finish();
}

/// The same in-flight loads with agents spread over both cores.
fn in_flight_two_workers(c: &mut Criterion, system: &SystemRunner) {
    let mut group = c.benchmark_group("one_shot/in_flight_2_workers");
    group
        .measurement_time(Duration::from_secs(6))
        .sample_size(10);
    let (rt, parent) = system.block_on(parent::runtime_with_parent(
        Arc::new(MemoryStore::forgetting_one_shots()),
        ScriptedModel::repeating(ScriptStep::text("done")),
        2,
    ));
    for n in [1usize, 1_000, 4_000] {
        group.throughput(Throughput::Elements(u64::try_from(n).expect("small")));
        group.bench_function(BenchmarkId::new("spawn/memory-forgetting", n), |b| {
            b.iter(|| system.block_on(many_runs(&rt, &parent, "spawn", n)));
        });
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    process::like_the_binary();
    let system = System::new();
    floors(c, &system);
    sequential(c, &system);
    in_flight(c, &system);
    in_flight_two_workers(c, &system);
}

criterion_group!(benches, bench);
criterion_main!(benches);
