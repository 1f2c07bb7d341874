//! Provides [`LoadReport`]: what a load run measured, beside the floors measured in the same
//! process, and whether its verification held. It prints for a person (`Display`) or
//! serializes for machines.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::scenario::{Latency, LoadStore, Scenario};
use super::verify::{Check, Created, Persisted};
use crate::seam::DelegationMode;

/// A latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// How many were recorded.
    pub count: u64,
    /// The median.
    pub p50_us: u64,
    /// The 90th percentile.
    pub p90_us: u64,
    /// The 99th percentile.
    pub p99_us: u64,
    /// The largest.
    pub max_us: u64,
}

impl LatencySummary {
    pub(crate) fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        Self {
            count: histogram.len(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            max_us: histogram.max(),
        }
    }
}

/// Records latencies of one kind, in microseconds: from 1 µs to an hour with three significant
/// figures, fixed-size, so recording never allocates.
pub(crate) struct LatencyRecorder(Mutex<Option<Histogram<u64>>>);

impl Default for LatencyRecorder {
    fn default() -> Self {
        // The bounds are constants within hdrhistogram's limits: `None` cannot happen.
        Self(Mutex::new(
            Histogram::new_with_bounds(1, 3_600_000_000, 3).ok(),
        ))
    }
}

impl LatencyRecorder {
    pub(crate) fn record(&self, elapsed: Duration) {
        self.record_micros(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    pub(crate) fn record_micros(&self, micros: u64) {
        let mut histogram = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(histogram) = histogram.as_mut() {
            histogram.saturating_record(micros.max(1));
        }
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(LatencySummary::of)
            .unwrap_or_default()
    }
}

/// The floors measured in the same process before the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Floors {
    /// Starting a bare actor and one request/response with it, nanoseconds.
    pub actor_round_trip_ns: u64,
    /// One sled row of a short turn's event bytes, nanoseconds (sled runs only).
    pub sled_turn_append_ns: Option<u64>,
}

struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "u64")]
struct Ping(u64);

impl Handler<Ping> for Echo {
    type Result = u64;

    fn handle(&mut self, msg: Ping, ctx: &mut Context<Self>) -> u64 {
        ctx.stop();
        msg.0
    }
}

/// The actor floor: starts a bare actor, sends it `value` and awaits the echo (the actor then
/// stops). Benches and `subagents load` quote their figures against it.
pub async fn actor_round_trip(value: u64) -> u64 {
    Echo.start().send(Ping(value)).await.unwrap_or(value)
}

impl Floors {
    /// Measures the actor floor (and the sled floor when `sled`).
    pub(crate) async fn measure(sled: bool) -> Self {
        const ROUNDS: u32 = 2_000;
        let began = Instant::now();
        for round in 0..ROUNDS {
            actor_round_trip(u64::from(round)).await;
        }
        let actor_round_trip_ns = per_round(began.elapsed(), ROUNDS);
        Self {
            actor_round_trip_ns,
            sled_turn_append_ns: if sled { sled_floor() } else { None },
        }
    }
}

fn per_round(elapsed: Duration, rounds: u32) -> u64 {
    u64::try_from(elapsed.as_nanos() / u128::from(rounds.max(1))).unwrap_or(u64::MAX)
}

/// One sled row of a short turn's event bytes (six 300-byte events), as the store appends it.
fn sled_floor() -> Option<u64> {
    const ROUNDS: u32 = 500;
    let db = sled::Config::new().temporary(true).open().ok()?;
    let tree = db.open_tree("event_batches").ok()?;
    let value = vec![b'x'; 6 * 300];
    let began = Instant::now();
    for round in 0..ROUNDS {
        let mut key = [0u8; 24];
        key[..4].copy_from_slice(&round.to_be_bytes());
        tree.insert(key, value.as_slice()).ok()?;
    }
    Some(per_round(began.elapsed(), ROUNDS))
}

/// How many children of each kind were created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ChildCounts {
    /// One-shot children.
    pub one_shot: u64,
    /// Continuable children.
    pub continuable: u64,
    /// All of them.
    pub total: u64,
}

/// What happened to follow-ups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FollowupCounts {
    /// Accepted (each one cold-resumed its child).
    pub accepted: u64,
    /// Refused with `BUDGET_EXHAUSTED`.
    pub refused_by_budget: u64,
    /// Quiet reports children sent their parents.
    pub reports_sent: u64,
    /// Interrupts sent right after a child's last follow-up (an interrupt that finds the
    /// epoch already settled is an accepted no-op, and still counts here).
    pub interrupts_sent: u64,
}

/// Rates over the run's growing phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// One-shot runs completed per second.
    pub one_shot_runs_per_s: f64,
    /// Follow-ups accepted per second (each a cold resume, but those that crossed nodes).
    pub followups_per_s: f64,
    /// Events persisted per second (those the children's logs stored, over the growing phase).
    pub events_per_s: f64,
    /// Children created per second.
    pub children_per_s: f64,
}

/// Memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Memory {
    /// The process's peak resident set size.
    pub peak_rss_bytes: u64,
    /// The most children live (started, not yet ended) at once.
    pub peak_live_children: u64,
    /// Peak RSS growth over the run divided by the peak live children.
    pub rss_per_live_child_bytes: u64,
}

/// The latencies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latencies {
    /// A one-shot start to its result.
    pub one_shot_start_to_result: LatencySummary,
    /// A continuable start to inbox acceptance.
    pub continuable_start_acceptance: LatencySummary,
    /// A follow-up to its acceptance (including the cold resume).
    pub followup_acceptance: LatencySummary,
    /// A follow-up, from its sending to the turn that claimed it (the cold resume included),
    /// from the child's log (millisecond resolution).
    pub followup_to_turn_start: LatencySummary,
    /// A follow-up to the end of the epoch it opened.
    pub followup_to_settled: LatencySummary,
    /// A follow-up to its acceptance by a child resident on another node (a cluster run's
    /// first follow-up of each child placed elsewhere, when it caught the child there).
    pub cross_node_followup_acceptance: LatencySummary,
}

/// One point of the run's timeline, taken while the forest grows and while it drains: every
/// 10 ms at first, the interval doubling (and every other point dropped) whenever the timeline
/// reaches 2,000 points, so a run of any length keeps at most that many, evenly spaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Milliseconds since the growing phase began.
    pub at_ms: u64,
    /// Epochs started so far.
    pub started: u64,
    /// Epochs ended so far.
    pub settled: u64,
    /// Follow-ups accepted so far.
    pub followups: u64,
    /// The process's resident set size.
    pub rss_bytes: u64,
}

/// What a load run measured and whether its verification held.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    /// The scenario that ran.
    pub scenario: Scenario,
    /// Whether every check passed.
    pub passed: bool,
    /// Whether the run was stopped before it grew the whole scenario (see
    /// [`super::run_until`]): the report is of what it grew.
    pub interrupted: bool,
    /// The growing phase (start of the first child to the last settlement), seconds.
    pub elapsed_s: f64,
    /// Listing the grown forest (every root's descendants) right after it grew, for the
    /// reopening check, seconds.
    pub listing_s: f64,
    /// The final drain (shutdown), after the listing, seconds.
    pub drain_s: f64,
    /// Children created.
    pub children: ChildCounts,
    /// Follow-ups.
    pub followups: FollowupCounts,
    /// Rates.
    pub throughput: Throughput,
    /// Latencies.
    pub latency: Latencies,
    /// Memory.
    pub memory: Memory,
    /// What the children's logs hold in the store.
    pub persisted: Persisted,
    /// The floors measured in the same process.
    pub floors: Floors,
    /// The one-shot median latency over the actor floor.
    pub one_shot_p50_over_actor_floor: f64,
    /// The verification checks.
    pub checks: Vec<Check>,
    /// The counters every 100 ms while the forest grew (for plots).
    pub timeline: Vec<Sample>,
}

/// The raw measurements a report is made from.
pub(crate) struct Measured<'a> {
    pub(crate) scenario: Scenario,
    pub(crate) stopped_early: bool,
    pub(crate) elapsed: Duration,
    pub(crate) listing: Duration,
    pub(crate) drain: Duration,
    pub(crate) created: &'a [Created],
    pub(crate) accepted: usize,
    pub(crate) refused: u64,
    pub(crate) reports: u64,
    pub(crate) interrupted: u64,
    pub(crate) one_shot: LatencySummary,
    pub(crate) start: LatencySummary,
    pub(crate) followup: LatencySummary,
    pub(crate) followup_settled: LatencySummary,
    pub(crate) cross_node: LatencySummary,
    pub(crate) peak_rss: u64,
    pub(crate) rss_before: u64,
    pub(crate) peak_live: u64,
    pub(crate) floors: Floors,
    pub(crate) checks: Vec<Check>,
    pub(crate) persisted: Persisted,
    pub(crate) followup_turn_start: LatencySummary,
    pub(crate) timeline: Vec<Sample>,
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

impl LoadReport {
    /// Adds a check made after the report (the reopening of a store the run closed).
    pub(crate) fn push_check(&mut self, check: Check) {
        self.passed &= check.passed;
        self.checks.push(check);
    }

    pub(crate) fn new(measured: Measured<'_>) -> Self {
        let count = |mode| {
            u64::try_from(measured.created.iter().filter(|c| c.mode == mode).count())
                .unwrap_or(u64::MAX)
        };
        let one_shot = count(DelegationMode::OneShot);
        let continuable = count(DelegationMode::Continuable);
        let accepted = u64::try_from(measured.accepted).unwrap_or(u64::MAX);
        let floor_us = measured.floors.actor_round_trip_ns as f64 / 1000.0;
        Self {
            passed: measured.checks.iter().all(|check| check.passed),
            interrupted: measured.stopped_early,
            elapsed_s: measured.elapsed.as_secs_f64(),
            listing_s: measured.listing.as_secs_f64(),
            drain_s: measured.drain.as_secs_f64(),
            children: ChildCounts {
                one_shot,
                continuable,
                total: one_shot + continuable,
            },
            followups: FollowupCounts {
                accepted,
                refused_by_budget: measured.refused,
                interrupts_sent: measured.interrupted,
                reports_sent: measured.reports,
            },
            throughput: Throughput {
                one_shot_runs_per_s: rate(one_shot, measured.elapsed),
                followups_per_s: rate(accepted, measured.elapsed),
                events_per_s: rate(measured.persisted.events, measured.elapsed),
                children_per_s: rate(one_shot + continuable, measured.elapsed),
            },
            latency: Latencies {
                one_shot_start_to_result: measured.one_shot,
                continuable_start_acceptance: measured.start,
                followup_acceptance: measured.followup,
                followup_to_turn_start: measured.followup_turn_start,
                followup_to_settled: measured.followup_settled,
                cross_node_followup_acceptance: measured.cross_node,
            },
            memory: Memory {
                peak_rss_bytes: measured.peak_rss,
                peak_live_children: measured.peak_live,
                rss_per_live_child_bytes: measured
                    .peak_rss
                    .saturating_sub(measured.rss_before)
                    .checked_div(measured.peak_live)
                    .unwrap_or(0),
            },
            one_shot_p50_over_actor_floor: if floor_us > 0.0 {
                measured.one_shot.p50_us as f64 / floor_us
            } else {
                0.0
            },
            floors: measured.floors,
            persisted: measured.persisted,
            scenario: measured.scenario,
            checks: measured.checks,
            timeline: measured.timeline,
        }
    }
}

/// A duration in microseconds for a person: three significant digits, in µs, ms or s.
pub(crate) fn human_us(us: u64) -> String {
    if us < 1_000 {
        // Whole microseconds are what the histograms hold.
        return format!("{us} µs");
    }
    #[allow(clippy::cast_precision_loss)]
    let us = us as f64;
    let (value, unit) = if us < 1_000_000.0 {
        (us / 1_000.0, "ms")
    } else {
        (us / 1_000_000.0, "s")
    };
    format!("{} {unit}", three_digits(value))
}

/// `value` with three significant digits (whole numbers from 100 up).
fn three_digits(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A rate or a duration, rounded to a whole number for display (negative and NaN read as 0).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn whole(value: f64) -> u64 {
    // `as` saturates: a rate past u64::MAX (never seen) reads as u64::MAX.
    value.round().max(0.0) as u64
}

/// `count` with thousands separated (`10,000`).
pub(crate) fn grouped(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `count` and its noun, singular or plural (`1 root`, `4 roots`).
fn counted(count: u64, singular: &str, plural: &str) -> String {
    format!(
        "{} {}",
        grouped(count),
        if count == 1 { singular } else { plural }
    )
}

/// A share as a percentage (`25%`).
fn percent(share: f64) -> String {
    let digits = three_digits(share * 100.0);
    let digits = if digits.contains('.') {
        digits.trim_end_matches('0').trim_end_matches('.')
    } else {
        &digits
    };
    format!("{digits}%")
}

/// One row of the latency table; nothing when nothing was recorded.
fn latency_line(f: &mut fmt::Formatter<'_>, name: &str, summary: &LatencySummary) -> fmt::Result {
    if summary.count == 0 {
        return Ok(());
    }
    writeln!(
        f,
        "  {name:<38} {:>9} {:>9} {:>9} {:>9} {:>9}",
        human_us(summary.p50_us),
        human_us(summary.p90_us),
        human_us(summary.p99_us),
        human_us(summary.max_us),
        grouped(summary.count)
    )
}

impl LoadReport {
    /// The scenario in one line, as the report's first line and the plot's title say it: its
    /// shape, its store and its seed.
    pub fn scenario_headline(&self) -> String {
        let scenario = &self.scenario;
        let store = match (scenario.store, &scenario.store_dir) {
            // Named, so a user finds it again (`subagents tree --store DIR`).
            (LoadStore::Sled, Some(dir)) => format!("sled store at {}", dir.display()),
            (LoadStore::Sled, None) => "sled store (temporary)".to_owned(),
            (LoadStore::Memory, _) => "memory store".to_owned(),
            (LoadStore::Postgres, _) => "postgres store".to_owned(),
        };
        format!(
            "{} × {} each, depth {}, {} continuable with {} each, {}{}, seed {}",
            counted(scenario.roots, "root", "roots"),
            counted(scenario.children, "child", "children"),
            scenario.depth,
            percent(scenario.continuable_share),
            counted(scenario.followups, "follow-up", "follow-ups"),
            store,
            if scenario.nodes > 1 {
                format!(" shared by {} nodes", scenario.nodes)
            } else {
                String::new()
            },
            scenario.seed
        )
    }
}

impl fmt::Display for LoadReport {
    /// The report for a person; the alternate form (`{:#}`) adds the floors measured in the
    /// same process, which the JSON always has.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scenario = &self.scenario;
        if self.interrupted {
            writeln!(
                f,
                "INTERRUPTED: the run was stopped early; this is the report of what it grew"
            )?;
        }
        let latency = match scenario.latency {
            Latency::Fixed { ms } => format!("{ms} ms"),
            Latency::Uniform { min, max } => format!("{min}..{max} ms"),
        };
        writeln!(f, "scenario: {}", self.scenario_headline())?;
        writeln!(
            f,
            "          forks {} of one-shot children; of continuable ones {} report, {} are \
             interrupted, {} have a one-turn budget; model latency {latency}; {} in flight at most",
            percent(scenario.fork_share),
            percent(scenario.report_share),
            percent(scenario.interrupt_share),
            percent(scenario.budget_share),
            grouped(scenario.in_flight),
        )?;
        writeln!(
            f,
            "children: {} = {} one-shot + {} continuable, grown in {:.2} s; listed in {}; drain \
             (releasing what is still live) {}",
            grouped(self.children.total),
            grouped(self.children.one_shot),
            grouped(self.children.continuable),
            self.elapsed_s,
            human_us(whole(self.listing_s * 1e6)),
            human_us(whole(self.drain_s * 1e6)),
        )?;
        let sent = self.followups.accepted + self.followups.refused_by_budget;
        writeln!(
            f,
            "follow-ups: {} sent = {} accepted ({} cold resumes, {} to a child running on \
             another node) + {} refused by budget; {} and {} sent",
            grouped(sent),
            grouped(self.followups.accepted),
            grouped(
                self.followups
                    .accepted
                    .saturating_sub(self.latency.cross_node_followup_acceptance.count)
            ),
            grouped(self.latency.cross_node_followup_acceptance.count),
            grouped(self.followups.refused_by_budget),
            counted(self.followups.interrupts_sent, "interrupt", "interrupts"),
            counted(self.followups.reports_sent, "report", "reports"),
        )?;
        writeln!(
            f,
            "throughput: {} children/s, {} one-shot runs/s, {} follow-ups/s, {} events \
             persisted/s",
            grouped(whole(self.throughput.children_per_s)),
            grouped(whole(self.throughput.one_shot_runs_per_s)),
            grouped(whole(self.throughput.followups_per_s)),
            grouped(whole(self.throughput.events_per_s)),
        )?;
        writeln!(
            f,
            "latency{:<33} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "", "p50", "p90", "p99", "max", "n"
        )?;
        latency_line(
            f,
            "one-shot start to result",
            &self.latency.one_shot_start_to_result,
        )?;
        latency_line(
            f,
            "continuable start to acceptance",
            &self.latency.continuable_start_acceptance,
        )?;
        latency_line(
            f,
            "follow-up to acceptance",
            &self.latency.followup_acceptance,
        )?;
        latency_line(
            f,
            "follow-up to its turn (log time, ms)",
            &self.latency.followup_to_turn_start,
        )?;
        latency_line(f, "follow-up to settled", &self.latency.followup_to_settled)?;
        latency_line(
            f,
            "follow-up across nodes to acceptance",
            &self.latency.cross_node_followup_acceptance,
        )?;
        writeln!(
            f,
            "memory: peak RSS {} MiB with at most {} live at once: {} B of RSS growth per \
             child live at the peak",
            grouped(self.memory.peak_rss_bytes >> 20),
            counted(self.memory.peak_live_children, "child", "children"),
            grouped(self.memory.rss_per_live_child_bytes)
        )?;
        write!(
            f,
            "persisted: {} stored in the children's logs (a fork's inherited turns are stored \
             once, in its parent's)",
            counted(self.persisted.events, "event", "events")
        )?;
        if let Some(bytes) = self.persisted.bytes_on_disk {
            write!(
                f,
                "; {} MiB on disk (the whole store)",
                grouped(bytes >> 20)
            )?;
        }
        writeln!(f)?;
        if f.alternate() {
            write!(
                f,
                "floors (measured in this process): actor spawn + round trip {}",
                human_us(self.floors.actor_round_trip_ns / 1000)
            )?;
            if let Some(sled) = self.floors.sled_turn_append_ns {
                write!(f, ", sled turn append {}", human_us(sled / 1000))?;
            }
            writeln!(
                f,
                "; one-shot p50 = {:.0}× the actor floor",
                self.one_shot_p50_over_actor_floor
            )?;
        }
        writeln!(f, "verification:")?;
        for check in &self.checks {
            writeln!(
                f,
                "  [{}] {} ({})",
                if check.passed { "ok" } else { "FAILED" },
                check.name,
                check.detail
            )?;
        }
        write!(
            f,
            "{}",
            if self.passed {
                "verification passed"
            } else {
                "verification FAILED"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_with_three_significant_digits_and_their_unit() {
        assert_eq!(human_us(0), "0 µs");
        assert_eq!(human_us(999), "999 µs");
        assert_eq!(human_us(1_234), "1.23 ms");
        assert_eq!(human_us(289_791), "290 ms");
        assert_eq!(human_us(1_321_983), "1.32 s");
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(10_000), "10,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(counted(1, "root", "roots"), "1 root");
        assert_eq!(counted(4, "root", "roots"), "4 roots");
        assert_eq!(percent(0.5), "50%");
        assert_eq!(percent(0.125), "12.5%");
        assert_eq!(percent(0.0), "0%");
    }
}
