//! Benchmarks continuable children beside the actor floor measured in the same run:
//!
//! - `start_and_settle/memory`: one continuable start, from the call to its `subagent/end`
//!   (creation, the prompt's turn, the teardown and the parent's settled notice).
//! - `cold_resume/memory`: a follow-up to a released child with one epoch stored, to its
//!   `subagent/end`: the store is read once, the descriptor folded, the agent resumed under
//!   its lease, one turn, settlement; on the in-memory store and on sled (`cold_resume/sled`,
//!   one flush per resume: nothing overlaps). Each iteration resumes a fresh child.
//! - `reference/1000`: the reference's scenario: 1,000 children under one parked parent are
//!   started, each gets one cold-resume follow-up, then everything is drained (the reference
//!   took 13.2 s on a machine of this kind).
//! - `cold_resumes/1000/memory` and `/sled`: throughput: 1,000 released children, one
//!   follow-up each sent one after another, until every epoch ended (the epochs overlap, and on
//!   sled their end-of-epoch flushes share group commits).
//!
//! - `scale` (printed once after the groups, not sampled): N = 10,000 and 100,000 resident
//!   children under one parent, each held mid-turn at a gate (a resident child that is idle
//!   between turns settles and is released, so a held turn is what residency costs): the RSS
//!   growth and the live heap growth per resident child, the latency of 1,000 follow-ups
//!   enqueued to resident children (p50 and p99), and the time to drain the whole forest, with
//!   the processor time the drain took on the manager's thread and on the others.
//!
//! - `away` (printed once, not sampled): a parent whose log holds 20,000 events starts 200
//!   continuable children, each held in its first turn, and is disposed (away); then every
//!   child is let go: the time until the parent's stored inbox holds all 200 settled notices,
//!   on memory and on sled. Each notice is written into the log of a parent no agent holds.
//!
//! Run with `cargo bench --bench continuable` (`-- scale` for the scale pass alone;
//! `SUBAGENTS_SCALE=20000,50000` for other sizes, `SUBAGENTS_SCALE_WORKERS=2` for two threads;
//! `-- away` for the away pass alone).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, ContentBlock, ContinuableStartSpec, CreateAgent, EventKind, FollowupOptions,
    MemoryStore, MessageSource, Runtime, SessionEvent, SessionId, SessionPersistence, SledStore,
    SpawnInProcess,
};
use tokio::sync::mpsc;

// Only the actor floor applies here: a cold resume reads a whole log, not one turn's batch.
#[path = "support/ended.rs"]
mod ended;
#[allow(dead_code)]
#[path = "support/floors.rs"]
mod floors;

#[path = "support/live_bytes.rs"]
mod live_bytes;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;

#[path = "../src/allocator.rs"]
mod allocator;

/// The bench runs on mimalloc, as the `subagents` binary does, counting live heap bytes for
/// the scale pass.
#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

#[path = "support/process.rs"]
mod process;

struct Fixture {
    rt: Runtime,
    parent: AgentHandle,
    /// Child ids as their epochs end.
    ended: mpsc::UnboundedReceiver<SessionId>,
    _subscription: subagents::Subscription,
}

async fn fixture() -> Fixture {
    fixture_on(Arc::new(MemoryStore::new())).await
}

/// A runtime over `store` with `spawn` registered and one root parent; the parent answers each
/// settled notice with one scripted step.
async fn fixture_on(store: Arc<dyn SessionPersistence>) -> Fixture {
    fixture_with(store, ScriptedModel::repeating(ScriptStep::text("done"))).await
}

/// [`fixture_on`] with `model` answering every agent.
async fn fixture_with(store: Arc<dyn SessionPersistence>, model: ScriptedModel) -> Fixture {
    fixture_with_workers(store, model, 1).await
}

/// [`fixture_with`], the agents spread over `workers` threads.
async fn fixture_with_workers(
    store: Arc<dyn SessionPersistence>,
    model: ScriptedModel,
    workers: usize,
) -> Fixture {
    // A recorded request keeps a copy of its whole history: memory the runtime does not hold.
    model.set_recording(false);
    let rt = Runtime::builder()
        .shared_store(store)
        .model("scripted", model)
        .workers(workers)
        .build()
        .expect("runtime builds");
    rt.subagents()
        .register_provider(SpawnInProcess::default())
        .await
        .expect("spawn registers")
        .keep();
    let parent = rt
        .agents()
        .create(CreateAgent::new())
        .await
        .expect("parent");
    let (ended, subscription) = ended::ended_children(&rt, parent.agent().id());
    Fixture {
        rt,
        parent,
        ended,
        _subscription: subscription,
    }
}

fn prompt() -> Vec<ContentBlock> {
    vec![ContentBlock::text("work")]
}

async fn start(fixture: &Fixture) -> SessionId {
    fixture
        .rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "bench",
            fixture.parent.agent(),
            prompt(),
        ))
        .await
        .expect("start")
        .child_id
}

async fn followup(fixture: &Fixture, child: SessionId) {
    fixture
        .rt
        .subagents()
        .followup(
            fixture.parent.agent(),
            child,
            prompt(),
            FollowupOptions::new(MessageSource::User),
        )
        .await
        .expect("follow-up");
}

/// Waits until `count` epochs ended.
async fn ended(fixture: &mut Fixture, count: usize) {
    for _ in 0..count {
        fixture.ended.recv().await.expect("end events");
    }
}

fn bench(c: &mut Criterion) {
    process::like_the_binary();
    let system = System::new();
    let mut group = c.benchmark_group("continuable");
    group
        .measurement_time(Duration::from_secs(4))
        .sample_size(20);
    floors::actor_round_trip(&mut group, &system);

    group.bench_function("start_and_settle/memory", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let mut fixture = fixture().await;
                let began = Instant::now();
                for _ in 0..iters {
                    start(&fixture).await;
                    ended(&mut fixture, 1).await;
                }
                let elapsed = began.elapsed();
                fixture.rt.shutdown().await.expect("shutdown");
                elapsed
            })
        });
    });

    group.bench_function("cold_resume/memory", |b| {
        b.iter_custom(|iters| system.block_on(cold_resumes_one_by_one(memory(), iters)));
    });
    group.bench_function("cold_resume/sled", |b| {
        b.iter_custom(|iters| {
            let (store, _dir) = sled();
            system.block_on(cold_resumes_one_by_one(store, iters))
        });
    });
    group.finish();

    let mut reference = c.benchmark_group("reference");
    reference
        .measurement_time(Duration::from_secs(10))
        .sample_size(10);
    reference.bench_function("1000_children_start_resume_drain", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut fixture = fixture().await;
                    let began = Instant::now();
                    let mut children = Vec::with_capacity(1000);
                    for _ in 0..1000 {
                        children.push(start(&fixture).await);
                    }
                    ended(&mut fixture, 1000).await;
                    for child in &children {
                        followup(&fixture, *child).await;
                    }
                    ended(&mut fixture, 1000).await;
                    fixture
                        .rt
                        .subagents()
                        .drain_continuable_descendants(&[fixture.parent.agent().clone()])
                        .await
                        .expect("drain");
                    total += began.elapsed();
                    fixture.rt.shutdown().await.expect("shutdown");
                }
                total
            })
        });
    });
    reference.finish();

    // Throughput: 1,000 released children, one follow-up each, sent one after another (each
    // answered at acceptance), until every epoch ended: the epochs overlap, so on sled their
    // end-of-epoch flushes share group commits.
    let mut throughput = c.benchmark_group("cold_resumes");
    throughput
        .measurement_time(Duration::from_secs(10))
        .sample_size(10)
        .throughput(Throughput::Elements(COLD_RESUMES as u64));
    throughput.bench_function("1000/memory", |b| {
        b.iter_custom(|iters| system.block_on(cold_resumes_at_once(memory, iters)));
    });
    throughput.bench_function("1000/sled", |b| {
        b.iter_custom(|iters| {
            let mut dirs = Vec::new();
            let elapsed = system.block_on(cold_resumes_at_once(
                || {
                    let (store, dir) = sled();
                    dirs.push(dir);
                    store
                },
                iters,
            ));
            drop(dirs);
            elapsed
        });
    });
    throughput.finish();
}

/// How many children the `cold_resumes` group resumes per iteration.
const COLD_RESUMES: usize = 1000;

fn memory() -> Arc<dyn SessionPersistence> {
    Arc::new(MemoryStore::new())
}

/// A sled store in a fresh temporary directory (deleted when the guard drops).
fn sled() -> (Arc<dyn SessionPersistence>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SledStore::open(dir.path()).expect("sled opens");
    (Arc::new(store), dir)
}

/// Starts `count` children of the fixture's parent and waits until each settled and was
/// released: each next follow-up is a cold resume of a child with one epoch stored.
async fn released_children(fixture: &mut Fixture, count: usize) -> Vec<SessionId> {
    let mut children = Vec::with_capacity(count);
    for _ in 0..count {
        children.push(start(fixture).await);
    }
    ended(fixture, count).await;
    while subagents::testing::resident_count(fixture.rt.subagents()).await > 0 {
        tokio::task::yield_now().await;
    }
    children
}

/// `iters` cold resumes, each of a fresh released child, one at a time: a follow-up, then its
/// `subagent/end` (on sled, one flush each: nothing overlaps).
async fn cold_resumes_one_by_one(store: Arc<dyn SessionPersistence>, iters: u64) -> Duration {
    let mut fixture = fixture_on(store).await;
    let count = usize::try_from(iters).expect("iterations fit in memory");
    let children = released_children(&mut fixture, count).await;
    let began = Instant::now();
    for child in children {
        followup(&fixture, child).await;
        ended(&mut fixture, 1).await;
    }
    let elapsed = began.elapsed();
    fixture.rt.shutdown().await.expect("shutdown");
    elapsed
}

/// `iters` rounds of [`COLD_RESUMES`] cold resumes, each round on a fresh store from `store`.
async fn cold_resumes_at_once(
    mut store: impl FnMut() -> Arc<dyn SessionPersistence>,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut fixture = fixture_on(store()).await;
        let children = released_children(&mut fixture, COLD_RESUMES).await;
        let began = Instant::now();
        for child in children {
            followup(&fixture, child).await;
        }
        ended(&mut fixture, COLD_RESUMES).await;
        total += began.elapsed();
        fixture.rt.shutdown().await.expect("shutdown");
    }
    total
}

/// The resident set size of this process, in bytes.
fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let last = sorted.len().saturating_sub(1);
    // Rounded to the nearest rank; the samples are few enough for exactness not to matter.
    let rank = (fraction * last as f64).round() as usize;
    sorted[rank.min(last)]
}

/// One scale pass with `n` resident children on `workers` threads (see the module docs).
async fn scale(n: usize, workers: usize) {
    let gate = subagents::testing::Gate::new();
    let fixture = fixture_with_workers(
        Arc::new(MemoryStore::new()),
        ScriptedModel::repeating(ScriptStep::text("held").gated(&gate)),
        workers,
    )
    .await;
    let rt = fixture.rt.clone();
    let before = subagents::load::rss_bytes();
    let heap_before = live_bytes::live_bytes();
    let began = Instant::now();
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(start(&fixture).await);
    }
    let started = began.elapsed();
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, n);
    let grown = subagents::load::rss_bytes().saturating_sub(before);
    let heap = live_bytes::live_bytes().saturating_sub(heap_before);
    let mut latencies = Vec::with_capacity(1000);
    for child in children.iter().step_by((n / 1000).max(1)).take(1000) {
        let sent = Instant::now();
        followup(&fixture, *child).await;
        latencies.push(sent.elapsed());
    }
    latencies.sort_unstable();
    let cpu = thread_cpu::ThreadCpu::now();
    let drain = Instant::now();
    rt.subagents()
        .drain_continuable_descendants(&[fixture.parent.agent().clone()])
        .await
        .expect("drain");
    let drained = drain.elapsed();
    let (on_main, elsewhere) = thread_cpu::ThreadCpu::now().since(&cpu);
    println!(
        "scale/{n} on {workers} thread(s): start {:.2} s ({:.1} µs each), RSS +{} MiB ({} B per resident child; \
         {} B of live heap), follow-up p50 {:.1} µs p99 {:.1} µs, drain {:.3} s (run on the \
         manager's thread {:.3} s, on the others {:.3} s)",
        started.as_secs_f64(),
        started.as_secs_f64() * 1e6 / n as f64,
        grown >> 20,
        grown / n as u64,
        heap / n,
        percentile(&latencies, 0.50).as_secs_f64() * 1e6,
        percentile(&latencies, 0.99).as_secs_f64() * 1e6,
        drained.as_secs_f64(),
        on_main.as_secs_f64(),
        elsewhere.as_secs_f64(),
    );
    rt.shutdown().await.expect("shutdown");
}

/// Whether the criterion filter this bench was run with, if any, names the unsampled pass
/// `pass`.
fn pass_is_named(pass: &str) -> bool {
    std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-') && arg != "continuable")
        .is_none_or(|filter| pass.contains(filter.as_str()))
}

/// How many settled notices `events` insert into an inbox.
fn notices(events: &[Arc<SessionEvent>]) -> usize {
    events
        .iter()
        .filter(|event| {
            matches!(&event.kind, EventKind::InboxSpliced { inserted, .. }
            if inserted.iter().any(|message| {
                matches!(message.source, MessageSource::SubagentSettledNotice { .. })
            }))
        })
        .count()
}

/// The away pass on `store` (see the module docs): `children` children of a parent whose log
/// holds at least `events` events settle while the parent is away.
async fn away(store: Arc<dyn SessionPersistence>, label: &str, events: u64, children: usize) {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("answer"));
    let fixture = fixture_with(Arc::clone(&store), model.clone()).await;
    let agent = fixture.parent.agent().clone();
    while agent.log().len() < events {
        agent
            .followup(prompt(), MessageSource::User)
            .await
            .expect("the parent's prompt");
        agent.when_idle().await;
    }
    for _ in 0..children {
        model.push(ScriptStep::text("held").gated(&gate));
    }
    for _ in 0..children {
        start(&fixture).await;
    }
    let Fixture { rt, parent, .. } = fixture;
    let id = agent.id();
    drop(agent);
    parent.dispose().await.expect("the parent goes away");
    let mut read = u64::try_from(
        store
            .read_stored(id, 0, u64::MAX)
            .await
            .expect("the parent's log")
            .len(),
    )
    .expect("a log length");
    let len = read;
    let began = Instant::now();
    gate.release();
    let mut stored = 0;
    while stored < children {
        // Only what was added since the last look is read: the pass measures the writers.
        let added = store
            .read_stored(id, read, u64::MAX)
            .await
            .expect("the parent's log");
        read += u64::try_from(added.len()).expect("a log length");
        stored += notices(&added);
        if added.is_empty() {
            tokio::task::yield_now().await;
        }
    }
    let elapsed = began.elapsed();
    println!(
        "away/{label}: {children} notices stored into a parent away with {len} events in {:.1} ms \
         ({:.1} µs a notice)",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / children as f64,
    );
    rt.shutdown().await.expect("shutdown");
}

fn away_pass(_: &mut Criterion) {
    process::like_the_binary();
    // The pass is not sampled; a criterion filter that does not name it skips it.
    if !pass_is_named("away") {
        return;
    }
    let system = System::new();
    system.block_on(away(memory(), "memory", 20_000, 200));
    let (store, _dir) = sled();
    system.block_on(away(store, "sled", 20_000, 200));
}

fn scale_pass(_: &mut Criterion) {
    process::like_the_binary();
    // The pass is not sampled; a criterion filter that does not name it skips it.
    if !pass_is_named("scale") {
        return;
    }
    // `SUBAGENTS_SCALE=20000,50000` picks other sizes.
    let sizes: Vec<usize> = std::env::var("SUBAGENTS_SCALE")
        .ok()
        .map(|sizes| {
            sizes
                .split(',')
                .filter_map(|size| size.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![10_000, 100_000]);
    // `SUBAGENTS_SCALE_WORKERS=2` spreads the agents over two threads (one per core here).
    let workers = std::env::var("SUBAGENTS_SCALE_WORKERS")
        .ok()
        .and_then(|workers| workers.trim().parse().ok())
        .unwrap_or(1);
    let system = System::new();
    for n in sizes {
        system.block_on(scale(n, workers));
    }
}

criterion_group!(benches, bench, scale_pass, away_pass);
criterion_main!(benches);
