//! Benchmarks a fork against the length of its parent's transcript: a one-shot `fork` child of
//! a parent with 10 / 1,000 / 10,000 completed turns (`start` → `result` → `dispose`), on the
//! in-memory and the sled store, beside a `spawn` child of the same parent (the floor: a child
//! that inherits nothing), measured in the same run.
//!
//! A fork's seed is stored by reference and shared with the parent's log in memory, so both its
//! time and the bytes its creation stores should stay flat as the transcript grows. The bytes
//! are printed once per size (`stored bytes per child`), from the child's own stored events.
//! Run with `cargo bench --bench fork`.

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does.
#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

#[path = "support/process.rs"]
mod process;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, ContentBlock, MemoryStore, MessageSource, SessionId, SessionPersistence, SledStore,
};

#[path = "support/one_run.rs"]
mod one_run;
#[path = "support/parent.rs"]
mod parent;

use one_run::one_run;

/// The transcript lengths a parent is grown to, in completed turns.
const TURNS: [u64; 3] = [10, 1_000, 10_000];

/// Completes turns of `parent` until it has `turns`.
async fn grow_to(parent: &AgentHandle, done: &mut u64, turns: u64) {
    while *done < turns {
        parent
            .agent()
            .followup(
                vec![ContentBlock::text("more context")],
                MessageSource::User,
            )
            .await
            .expect("parent turn");
        parent.agent().when_idle().await;
        *done += 1;
    }
}

/// The bytes of `child`'s own stored events (its seed, stored by reference, is not among them).
async fn stored_bytes(store: &dyn SessionPersistence, child: SessionId) -> usize {
    store
        .read_stored(child, 0, u64::MAX)
        .await
        .expect("the child is stored")
        .iter()
        .map(|event| serde_json::to_vec(&**event).map_or(0, |bytes| bytes.len()))
        .sum()
}

fn by_transcript(c: &mut Criterion, system: &SystemRunner) {
    let mut group = c.benchmark_group("fork/by_parent_turns");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .throughput(Throughput::Elements(1));
    let stores: [(&str, Arc<dyn SessionPersistence>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        (
            "sled",
            Arc::new(SledStore::temporary().expect("sled store")),
        ),
    ];
    for (store_name, store) in stores {
        let (rt, parent) = system.block_on(parent::runtime_with_parent(
            Arc::clone(&store),
            ScriptedModel::repeating(ScriptStep::text("done")),
            1,
        ));
        let mut done = 1;
        for turns in TURNS {
            system.block_on(grow_to(&parent, &mut done, turns));
            for provider in ["spawn", "fork"] {
                let child = system.block_on(one_run(&rt, &parent, provider));
                let bytes = system.block_on(stored_bytes(&*store, child));
                println!(
                    "fork/by_parent_turns/{provider}/{store_name}/{turns}: \
                     stored bytes per child {bytes}"
                );
                group.bench_function(
                    BenchmarkId::new(format!("{provider}/{store_name}"), turns),
                    |b| {
                        b.iter(|| system.block_on(one_run(&rt, &parent, provider)));
                    },
                );
            }
        }
        system.block_on(rt.shutdown()).expect("shutdown");
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    process::like_the_binary();
    let system = System::new();
    by_transcript(c, &system);
}

criterion_group!(benches, bench);
criterion_main!(benches);
