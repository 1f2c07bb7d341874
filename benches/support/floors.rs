//! The floors every bench measures in its own run, so results can be quoted as ratios: a bare
//! actix actor spawn with one round trip, and a bare sled batch of a turn's event bytes.

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

/// `floor/sled_insert_turn_bytes`: one sled batch of `rows` (a turn's keys and event bytes),
/// under fresh keys each iteration, in a temporary database.
pub fn sled_insert(group: &mut BenchmarkGroup<'_, WallTime>, rows: &[(Vec<u8>, Vec<u8>)]) {
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("sled opens");
    let tree = db.open_tree("events").expect("tree opens");
    let mut round = 0u64;
    group.bench_function("floor/sled_insert_turn_bytes", |b| {
        b.iter(|| {
            round += 1;
            let mut batch = sled::Batch::default();
            for (key, value) in rows {
                let mut key = key.clone();
                key.extend_from_slice(&round.to_be_bytes());
                batch.insert(key, value.as_slice());
            }
            tree.apply_batch(batch).expect("batch applies");
        });
    });
}
