//! Benchmarks the stores' write path: one append of a child turn's events (a user message, a
//! step, an assistant message, the turn's end: 6 events) with compare-and-append and the
//! writer's lease, on sled and on PostgreSQL (a throwaway local server, as the tests start
//! one: unix socket, fsync off), and a flush after each append. Floors in the same run: one bare
//! sled row of the same bytes.
//!
//! `store/postgres/delivery_round_trip`: one delivery between two cluster nodes (each with its
//! own connections), from its commit to its answer read back by the sender, served by a
//! handler that answers at once: the transport under a cross-node follow-up.
//!
//! Run with `cargo bench --bench store`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::executor::block_on;
use subagents::content::Message;
use subagents::store::{LeaseHolder, PostgresStore};
use subagents::{
    ContentBlock, EventKind, MessageSource, SessionEvent, SessionHeader, SessionId,
    SessionPersistence, SledStore, TurnEndReason,
};

#[allow(dead_code)]
#[path = "support/floors.rs"]
mod floors;

// The tests' throwaway server: the bench starts one the same way.
#[allow(dead_code, unused_macros, unused_imports)]
#[path = "../tests/support/postgres.rs"]
mod postgres;

/// One turn's events, numbered from `seq`.
fn turn(seq: u64, turn: u64) -> Vec<Arc<SessionEvent>> {
    let user = Message::user(vec![ContentBlock::text("go")], MessageSource::User);
    let answer = Message::assistant(
        vec![ContentBlock::text("done, as asked")],
        "scripted",
        "bench",
    );
    [
        EventKind::TurnStart { turn },
        EventKind::UserMessage(user),
        EventKind::StepStart { turn, step: 1 },
        EventKind::AssistantMessage {
            turn,
            step: 1,
            message: answer,
            usage: None,
            interrupted: false,
        },
        EventKind::StepEnd { turn, step: 1 },
        EventKind::TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
            traceparent: None,
        },
    ]
    .into_iter()
    .zip(seq..)
    .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
    .collect()
}

fn bench_store(c: &mut Criterion, name: &str, store: &dyn SessionPersistence) {
    let mut group = c.benchmark_group("store");
    group.throughput(Throughput::Elements(1));
    let id = SessionId::new();
    let lease = block_on(store.create_leased(SessionHeader::new(id), vec![], LeaseHolder::new()))
        .expect("session created");
    let mut next = 0u64;
    let mut turns = 0u64;
    group.bench_function(format!("append_turn/{name}"), |b| {
        b.iter(|| {
            turns += 1;
            let events = turn(next, turns);
            let count = events.len() as u64;
            block_on(store.append(id, next, events, Some(lease.epoch))).expect("append");
            next += count;
        });
    });
    group.bench_function(format!("append_turn_and_flush/{name}"), |b| {
        b.iter(|| {
            turns += 1;
            let events = turn(next, turns);
            let count = events.len() as u64;
            block_on(store.append(id, next, events, Some(lease.epoch))).expect("append");
            block_on(store.flush(id)).expect("flush");
            next += count;
        });
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let bytes = serde_json::to_vec(&turn(0, 1))
        .expect("events encode")
        .len();
    let mut floor = c.benchmark_group("store");
    floors::sled_insert(&mut floor, bytes);
    floor.finish();
    let sled = SledStore::temporary().expect("sled opens");
    bench_store(c, "sled", &sled);
    // Without PostgreSQL installed, its rows are left out (its absence said once).
    let Some(server) = postgres::available() else {
        return;
    };
    let url = server.fresh_database();
    let pg = block_on(PostgresStore::connect(&url)).expect("postgres connects");
    bench_store(c, "postgres", &pg);
    delivery_round_trip(c, &url);
}

fn delivery_round_trip(c: &mut Criterion, url: &str) {
    let sender_store = Arc::new(block_on(PostgresStore::connect(url)).expect("postgres connects"));
    let target_store = Arc::new(block_on(PostgresStore::connect(url)).expect("postgres connects"));
    let sender = block_on(sender_store.join(&LeaseHolder::new(), "sender")).expect("joins");
    let target = block_on(target_store.join(&LeaseHolder::new(), "target")).expect("joins");
    target
        .serve(Arc::new(
            |delivery: subagents::store::deliveries::Delivery| {
                Box::pin(async move { Ok(delivery.payload) })
            },
        ))
        .expect("the target serves");
    let session = SessionId::new();
    let payload = serde_json::json!({ "kind": "followup", "text": "go on" });
    let mut group = c.benchmark_group("store/postgres");
    group.throughput(Throughput::Elements(1));
    group.bench_function("delivery_round_trip", |b| {
        b.iter(|| block_on(sender.deliver(target.node(), session, &payload)).expect("answered"));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
