//! Provides [`WorkerPool`]: the arbiters (threads) agents are spread over, by measured load.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{ErrorCode, Result, SubagentError};

/// How many agents a started worker takes for each one the building arbiter takes when the pool
/// starts, before anything is measured. Measured on 2 cores with 1,000 and 4,000 one-shot runs
/// in flight, with the split fixed: an even split left the building arbiter at 60% of the
/// samples and the worker idle a third of the time; a third of the agents on the building
/// arbiter was best; a quarter was slower at 1,000. From there the share follows the load: the
/// host's own work can saturate the building arbiter (the load harness), and a run with few
/// children in flight is fastest with every agent beside the caller, since each hop to another
/// thread waits for that thread to wake.
const STARTED_WORKER_SHARE: u64 = 2;

/// The fixed-point 1 of the building arbiter's share of placements.
const SHARE_ONE: u64 = 1 << 16;

/// How often placements sample how busy the arbiters' threads are: often enough to follow a run
/// that lasts a second, rarely enough that a probe is noise beside the agents it places.
const SAMPLE_PERIOD: Duration = Duration::from_millis(10);

/// A thread busy this share of the time (per mille of its wall time running or waiting to run)
/// is saturated; one busy less than this by more than [`MARGIN`] has room for more agents.
const SATURATED: u64 = 900;

/// How much busier one thread must be than another before agents move between them, per mille:
/// less, and the share would chase noise.
const MARGIN: u64 = 100;

/// How busy a thread is before anything was measured: the share does not move on it.
const UNMEASURED: u64 = u64::MAX;

/// Arbiters agents are spread over (see [`crate::RuntimeBuilder::workers`]): the arbiter that
/// built the runtime and the worker threads started beside it, so a pool of `n` keeps `n` threads
/// busy, not `n + 1`. The building arbiter also runs the delegation API's actors and the host's
/// own work, so it starts with a smaller share of the agents than a started worker. Every
/// [`SAMPLE_PERIOD`] a placement posts a probe to each arbiter, which reads how long its thread
/// ran or waited to run, and the building arbiter's share follows: down while its thread is
/// saturated and busier than the workers', up (to every agent) while it has room or the workers
/// are busier. Without Linux's per-thread scheduler counts the share stays where it started. The
/// started workers share the rest round-robin.
pub(crate) struct WorkerPool {
    /// The worker threads this pool started (and stops).
    started: Vec<actix::Arbiter>,
    building: Arc<ArbiterLoad>,
    workers: Vec<Arc<ArbiterLoad>>,
    /// The building arbiter's share of placements, out of [`SHARE_ONE`].
    building_share: AtomicU64,
    /// Placements made; the share picks which of them stay on the building arbiter.
    placed: AtomicU64,
    /// Placements made on the started workers, which take turns.
    worker_turn: AtomicUsize,
    /// What the pool's clock counts from.
    epoch: Instant,
    /// When the arbiters were last sampled (microseconds since `epoch`).
    sampled: AtomicU64,
}

/// One arbiter and how busy its thread has been lately.
struct ArbiterLoad {
    handle: actix::ArbiterHandle,
    /// Per mille of the wall time that the thread ran or waited to run, averaged over the last
    /// few measurements (see [`ArbiterLoad::measure`]); [`UNMEASURED`] before the first.
    busy: AtomicU64,
    /// [`thread_demand`] at the last probe (nanoseconds).
    probed_demand: AtomicU64,
    /// When the last probe ran (microseconds since the pool's epoch), 0 before the first.
    probed_at: AtomicU64,
    /// Whether a probe is posted and not yet run: one at a time, so a busy arbiter is not
    /// flooded.
    waiting: AtomicBool,
}

/// File descriptors one started worker holds: its event loop and wakers (4; measured on Linux
/// under a limit of 1,024 descriptors, 230 workers started and 256 did not) and the scheduler
/// counts its probes read ([`thread_demand`]).
const DESCRIPTORS_PER_WORKER: u64 = 5;

/// Descriptors left for everything else a process holds (the store, sockets, the terminal).
const DESCRIPTORS_RESERVED: u64 = 64;

impl WorkerPool {
    /// Refuses a pool of `count` arbiters this process cannot open: actix panics when a
    /// worker thread's event loop finds no file descriptor left.
    ///
    /// # Errors
    /// `INVALID_ARGS` naming the descriptors needed and the process's limit.
    pub(crate) fn admit(count: usize) -> Result<()> {
        let started = u64::try_from(count.saturating_sub(1)).unwrap_or(u64::MAX);
        let needed = started
            .saturating_mul(DESCRIPTORS_PER_WORKER)
            .saturating_add(DESCRIPTORS_RESERVED);
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        match limit {
            Some(limit) if started > 0 && needed > limit => Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "{count} workers need about {needed} file descriptors and this process may \
                     open {limit}: use fewer workers, or raise the limit (`ulimit -n`)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A pool of `count` arbiters (at least 2): the current one and `count - 1` new threads.
    pub(crate) fn new(count: usize) -> Self {
        let started: Vec<actix::Arbiter> =
            (1..count.max(2)).map(|_| actix::Arbiter::new()).collect();
        let workers: Vec<Arc<ArbiterLoad>> = started
            .iter()
            .map(|arbiter| ArbiterLoad::new(arbiter.handle()))
            .collect();
        let rotation = 1 + STARTED_WORKER_SHARE * workers.len() as u64;
        Self {
            started,
            building: ArbiterLoad::new(actix::Arbiter::current()),
            workers,
            building_share: AtomicU64::new(SHARE_ONE.div_ceil(rotation)),
            placed: AtomicU64::new(0),
            worker_turn: AtomicUsize::new(0),
            epoch: Instant::now(),
            sampled: AtomicU64::new(0),
        }
    }

    /// The arbiter the next agent goes to.
    pub(crate) fn next(&self) -> actix::ArbiterHandle {
        self.sample();
        // The share spreads its placements evenly over each run of `SHARE_ONE`: this one stays
        // when the share's running total crosses a whole number here.
        let placed = self.placed.fetch_add(1, Ordering::Relaxed) % SHARE_ONE;
        let share = self.building_share.load(Ordering::Relaxed);
        if (placed + 1) * share / SHARE_ONE > placed * share / SHARE_ONE {
            return self.building.handle.clone();
        }
        let turn = self.worker_turn.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        self.workers[turn].handle.clone()
    }

    /// The building arbiter's current share of placements, out of [`SHARE_ONE`].
    #[cfg(test)]
    fn building_share(&self) -> u64 {
        self.building_share.load(Ordering::Relaxed)
    }

    /// Once a [`SAMPLE_PERIOD`] (the first placement past it does it): rebalances the building
    /// arbiter's share from how busy the threads were and posts the next probes.
    fn sample(&self) {
        let now = self.now();
        let sampled = self.sampled.load(Ordering::Relaxed);
        if now.saturating_sub(sampled) < micros(SAMPLE_PERIOD)
            || self
                .sampled
                .compare_exchange(sampled, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for arbiter in std::iter::once(&self.building).chain(&self.workers) {
            arbiter.probe(self.epoch);
        }
        let building = self.building.busy.load(Ordering::Relaxed);
        let mut workers = 0;
        for worker in &self.workers {
            match worker.busy.load(Ordering::Relaxed) {
                UNMEASURED => return,
                busy => workers += busy,
            }
        }
        if building == UNMEASURED {
            return;
        }
        let workers = workers / self.workers.len() as u64;
        let share = self.building_share.load(Ordering::Relaxed);
        let rebalanced = rebalanced(share, building, workers);
        if rebalanced != share {
            self.building_share.store(rebalanced, Ordering::Relaxed);
            tracing::trace!(
                building_busy_per_mille = building,
                workers_busy_per_mille = workers,
                share = rebalanced as f64 / SHARE_ONE as f64,
                "placement rebalanced"
            );
        }
    }

    /// Microseconds since the pool's epoch.
    fn now(&self) -> u64 {
        micros(self.epoch.elapsed())
    }

    /// Stops the worker threads this pool started (after every agent on them was released);
    /// the building arbiter is its owner's to stop.
    pub(crate) fn stop(&self) {
        for arbiter in &self.started {
            arbiter.stop();
        }
    }
}

impl ArbiterLoad {
    fn new(handle: actix::ArbiterHandle) -> Arc<Self> {
        Arc::new(Self {
            handle,
            busy: AtomicU64::new(UNMEASURED),
            probed_demand: AtomicU64::new(0),
            probed_at: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
        })
    }

    /// Posts a probe that measures how busy the thread was since the last one, unless one is
    /// still waiting.
    fn probe(self: &Arc<Self>, epoch: Instant) {
        if self.waiting.swap(true, Ordering::Relaxed) {
            return;
        }
        let arbiter = Arc::clone(self);
        let posted = self.handle.spawn_fn(move || arbiter.measure(epoch));
        if !posted {
            // A stopped arbiter takes no probe (and no agent); nothing waits.
            self.waiting.store(false, Ordering::Relaxed);
        }
    }

    /// On the arbiter's own thread: the time the thread wanted the CPU since the last
    /// measurement (ran or waited to run), over the wall time, averaged with the measurements
    /// before. The kernel brings a running thread's count up to date only at its clock tick (4 ms
    /// at 250 Hz), so a window shorter than half a sample period is left to grow, one window may
    /// read high or low by a tick, and the average evens that out: a tick missed in one window
    /// is counted in the next. Where the count cannot be read nothing is measured, and the
    /// share stays where it started.
    fn measure(&self, epoch: Instant) {
        let now = micros(epoch.elapsed()).max(1);
        let last_at = self.probed_at.load(Ordering::Relaxed);
        if last_at == 0 || now - last_at >= micros(SAMPLE_PERIOD) / 2 {
            if let Some(demand) = thread_demand() {
                let last_demand = self.probed_demand.swap(demand, Ordering::Relaxed);
                self.probed_at.store(now, Ordering::Relaxed);
                if last_at != 0 {
                    // Nanoseconds per microsecond of wall time is per mille.
                    let window = demand.saturating_sub(last_demand) / (now - last_at);
                    let busy = match self.busy.load(Ordering::Relaxed) {
                        UNMEASURED => window,
                        busy => busy.midpoint(window),
                    };
                    self.busy.store(busy, Ordering::Relaxed);
                }
            }
        }
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// Nanoseconds the calling thread has run or waited to run, from Linux's
/// `/proc/thread-self/schedstat`, or `None` where that cannot be read. The wait counts because a
/// thread that shares its core with others is as saturated as one that has the core to itself,
/// only slower.
fn thread_demand() -> Option<u64> {
    use std::os::unix::fs::FileExt;
    thread_local! {
        /// This thread's schedstat, opened once (procfs names the thread at open).
        static SCHEDSTAT: Option<std::fs::File> = std::fs::File::open("/proc/thread-self/schedstat").ok();
    }
    SCHEDSTAT.with(|file| {
        let mut buffer = [0u8; 96];
        let read = file.as_ref()?.read_at(&mut buffer, 0).ok()?;
        let text = std::str::from_utf8(&buffer[..read]).ok()?;
        // "<ran> <waited> <timeslices>", nanoseconds.
        let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
        let ran = fields.next()?.ok()?;
        let waited = fields.next()?.ok()?;
        Some(ran.saturating_add(waited))
    })
}

/// The building arbiter's next share, from how busy its thread and the started workers' were
/// (their mean), per mille: a quarter less while it is saturated and busier than the workers by
/// more than [`MARGIN`]; a thirty-second of all placements more, up to all of them, while it has
/// room (busy less than [`SATURATED`] by more than the margin) or the workers are busier by more
/// than the margin; unchanged between the two, so it settles instead of swinging.
fn rebalanced(share: u64, building: u64, workers: u64) -> u64 {
    if building >= SATURATED && building > workers + MARGIN {
        share - share / 4
    } else if building + MARGIN < SATURATED || workers > building + MARGIN {
        (share + SHARE_ONE / 32).min(SHARE_ONE)
    } else {
        share
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_the_descriptor_limit_cannot_hold_is_refused() {
        assert!(WorkerPool::admit(2).is_ok());
        let error = WorkerPool::admit(usize::MAX).expect_err("no limit holds that many");
        assert_eq!(error.code(), ErrorCode::InvalidArgs);
        assert!(error.message().contains("ulimit -n"), "{error}");
    }

    /// The thread `arbiter` runs on.
    async fn thread_of(arbiter: &actix::ArbiterHandle) -> std::thread::ThreadId {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        assert!(arbiter.spawn_fn(move || {
            let _ = sender.send(std::thread::current().id());
        }));
        receiver.await.expect("the arbiter ran the probe")
    }

    #[actix::test]
    async fn a_pool_of_two_starts_with_one_placement_in_three_on_the_building_arbiter() {
        let pool = WorkerPool::new(2);
        let building = std::thread::current().id();
        let mut threads = Vec::new();
        for _ in 0..6 {
            threads.push(thread_of(&pool.next()).await);
        }
        let on_building = threads.iter().filter(|thread| **thread == building).count();
        assert_eq!(
            on_building, 2,
            "one placement in three stays here: {threads:?}"
        );
        let worker = threads[1];
        assert_ne!(worker, building);
        assert!(
            threads
                .iter()
                .all(|thread| *thread == building || *thread == worker),
            "two threads in all: {threads:?}"
        );
        pool.stop();
    }

    #[test]
    fn the_share_falls_while_the_building_arbiter_is_saturated_and_rises_while_it_has_room() {
        let third = SHARE_ONE / 3;
        let step = SHARE_ONE / 32;
        // Saturated and busier than the workers: a quarter less each time.
        assert_eq!(rebalanced(third, 1_000, 400), third - third / 4);
        assert_eq!(rebalanced(third, SATURATED, 0), third - third / 4);
        // Saturated, but so are the workers: moving agents there helps nobody.
        assert_eq!(rebalanced(third, 1_000, 950), third);
        // Busy but within the margin of saturated: it settles.
        assert_eq!(rebalanced(third, SATURATED - MARGIN, 100), third);
        // Room to spare: more agents stay beside the caller, up to all of them.
        assert_eq!(rebalanced(third, 500, 550), third + step);
        assert_eq!(rebalanced(third, 0, 0), third + step);
        assert_eq!(rebalanced(SHARE_ONE - 1, 0, 0), SHARE_ONE);
        // Nearly saturated, but the workers are busier still: it takes more.
        assert_eq!(rebalanced(third, 850, 1_000), third + step);
    }

    /// Keeps this thread busy for `period` (a stand-in for agents' work).
    fn work_for(period: Duration) {
        let start = Instant::now();
        while start.elapsed() < period {
            std::hint::spin_loop();
        }
    }

    #[actix::test]
    async fn placements_move_off_a_saturated_building_arbiter_and_all_return_once_it_has_room() {
        let pool = WorkerPool::new(2);
        let initial = pool.building_share();
        // Bounded: the share falls by a quarter every sample, so 12 samples take it below a
        // quarter, and rises by a thirty-second, so 32 take it back to all; a pool that does
        // not follow the load never gets there.
        let deadline = Instant::now() + Duration::from_secs(10);
        // This (the building) arbiter saturated, the worker idle.
        while pool.building_share() >= initial / 4 && Instant::now() < deadline {
            let _ = pool.next();
            work_for(Duration::from_millis(3));
            actix_rt::task::yield_now().await;
        }
        let lowered = pool.building_share();
        assert!(lowered < initial / 4, "{lowered} of {initial}");

        // Now this arbiter idles between placements: every agent comes back beside it.
        while pool.building_share() < SHARE_ONE && Instant::now() < deadline {
            let _ = pool.next();
            // Time passing is what is measured here, not an ordering.
            actix_rt::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(pool.building_share(), SHARE_ONE, "every agent stays here");
        let building = std::thread::current().id();
        for _ in 0..3 {
            assert_eq!(thread_of(&pool.next()).await, building);
        }
        pool.stop();
    }
}
