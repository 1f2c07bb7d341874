//! Benchmarks what `subagents tree` does over a large sled store: the whole durable forest
//! streamed from a store opened to be read ([`Subagents::stream_forest`], the reader's 32 MiB
//! page cache), beside the actor floor measured in the same run. The store is grown first by
//! the load harness, as `subagents load --roots 1 --children N` grows it (default shares:
//! one-shot and continuable children, forks among them).
//!
//! After the timings it prints the most heap the listing held at once (exact live bytes, not
//! RSS) and per child: the corpus of headers the listing reads once, plus what is in flight.
//!
//! Run with `cargo bench --bench tree` (`SUBAGENTS_TREE=10000` for another N; default 100,000,
//! whose store takes about half a minute to grow).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, Criterion};
use futures::TryStreamExt;
use subagents::load::{LoadCounters, LoadStore, Scenario};
use subagents::store::SledStore;
use subagents::{CancellationToken, Runtime};

#[allow(dead_code)]
#[path = "support/floors.rs"]
mod floors;
#[path = "support/live_bytes.rs"]
mod live_bytes;
#[path = "support/process.rs"]
mod process;

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does, counting what is live.
#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

/// The reader's page cache, as `subagents tree` opens a sled store.
const READER_CACHE_BYTES: u64 = 32 << 20;

fn children() -> u64 {
    std::env::var("SUBAGENTS_TREE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
}

/// Streams the whole forest, holding one entry at a time; how many entries there were.
async fn stream_all(rt: &Runtime) -> u64 {
    let mut entries = rt
        .subagents()
        .stream_forest(CancellationToken::new())
        .await
        .expect("the corpus reads");
    let mut count = 0;
    while let Some(entry) = entries.try_next().await.expect("every entry reads") {
        std::hint::black_box(entry);
        count += 1;
    }
    count
}

fn bench(c: &mut Criterion) {
    process::like_the_binary();
    let n = children();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let system = System::new();
    system.block_on(async {
        let scenario = Scenario {
            roots: 1,
            children: n,
            store: LoadStore::Sled,
            store_dir: Some(dir.path().to_owned()),
            ..Scenario::default()
        };
        let report = subagents::load::run(&scenario, Arc::new(LoadCounters::default()))
            .await
            .expect("the store grows");
        assert!(
            report.checks.iter().all(|check| check.passed),
            "the grown store verifies"
        );
    });
    let mut group = c.benchmark_group("tree");
    group
        .measurement_time(Duration::from_secs(20))
        .sample_size(10);
    floors::actor_round_trip(&mut group, &system);
    let rt = system.block_on(async {
        let store = SledStore::open_with_cache_capacity(dir.path(), READER_CACHE_BYTES)
            .expect("the store opens");
        Runtime::builder()
            .shared_store(Arc::new(store))
            .build()
            .expect("a reader runtime")
    });
    group.bench_function(format!("stream_forest/{n}"), |b| {
        b.iter(|| assert_eq!(system.block_on(stream_all(&rt)), n));
    });
    group.finish();
    let before = live_bytes::live_bytes();
    live_bytes::reset_peak();
    system.block_on(stream_all(&rt));
    let held = live_bytes::peak_bytes().saturating_sub(before);
    println!(
        "tree/stream_forest/{n}: at most {:.1} MiB of heap held at once ({} B a child)",
        held as f64 / f64::from(1 << 20),
        held / usize::try_from(n).unwrap_or(usize::MAX).max(1),
    );
    system.block_on(async { rt.shutdown().await.expect("shutdown") });
}

criterion_group!(benches, bench);
criterion_main!(benches);
