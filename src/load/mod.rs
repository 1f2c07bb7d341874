//! The load harness behind `subagents load`: a [`Scenario`] of roots, children, depth,
//! follow-ups, interrupts and budgets runs against the deterministic [`LoadModel`], and
//! [`run`] answers a [`LoadReport`] of throughput, latency percentiles, memory and the floors
//! measured in the same process — and whether the run verified (lifecycle pairs, the durable
//! forest, follow-up accounting, nothing live after the drain, the store reopening).

mod memory;
mod model;
mod report;
mod run;
mod scenario;
mod store;
mod timeline;
mod verify;

pub use memory::rss_bytes;
pub(crate) use model::mix;
pub use model::{delegate_directive, LoadModel, DELEGATE_TOOL, REPORT_DIRECTIVE, REPORT_TOOL};
pub use report::{
    actor_round_trip, ChildCounts, Floors, FollowupCounts, Latencies, LatencySummary, LoadReport,
    Memory, Sample, Throughput,
};
pub use run::{run, run_configured, run_until, LoadCounters};
pub use scenario::{
    in_share, share_count, Latency, LoadFlush, LoadStore, Scenario, DEFAULT_STORE_CACHE_MIB,
};
pub use verify::{Check, Persisted};
