//! The floors every bench measures in its own run, so results can be quoted as ratios: a bare
//! actix actor spawn with one round trip, and a bare sled row of a turn's event bytes.

use std::hint::black_box;

use actix::SystemRunner;
use criterion::measurement::WallTime;
use criterion::BenchmarkGroup;

/// `floor/actor_spawn_round_trip`: start a bare actor, one request/response, stop it.
pub fn actor_round_trip(group: &mut BenchmarkGroup<'_, WallTime>, system: &SystemRunner) {
    group.bench_function("floor/actor_spawn_round_trip", |b| {
        b.iter(|| system.block_on(async { black_box(subagents::load::actor_round_trip(7).await) }));
    });
}

/// `floor/sled_insert_turn_bytes`: one sled row of a turn's event bytes (the store writes one
/// row per append), under a fresh, increasing key each iteration, in a temporary database.
pub fn sled_insert(group: &mut BenchmarkGroup<'_, WallTime>, turn_bytes: usize) {
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("sled opens");
    let tree = db.open_tree("event_batches").expect("tree opens");
    let value = vec![b'x'; turn_bytes];
    let mut round = 0u64;
    group.bench_function("floor/sled_insert_turn_bytes", |b| {
        b.iter(|| {
            round += 1;
            let mut key = [7u8; 24];
            key[..8].copy_from_slice(&round.to_be_bytes());
            tree.insert(key, value.as_slice()).expect("row inserts");
        });
    });
}
