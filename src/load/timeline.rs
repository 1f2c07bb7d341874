//! The run's timeline: the counters sampled from a thread of the sampler's own, so a runtime
//! busy with a drain (or starved by one) is measured instead of silencing the measurement.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::rss_bytes;
use super::report::Sample;
use super::run::LoadCounters;

/// The first interval between samples: a default run, a fraction of a second, still draws a
/// picture.
const FIRST_INTERVAL: Duration = Duration::from_millis(10);

/// The most samples a timeline holds (see [`Sample`]).
const MOST_SAMPLES: usize = 2_000;

/// Samples a run's counters until it is finished.
pub(crate) struct Sampler {
    /// Dropped to stop the sampler (which then takes one last sample).
    stop: mpsc::Sender<()>,
    timeline: tokio::sync::oneshot::Receiver<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling `counters`, times counted from `began`. A sampler that cannot get a
    /// thread answers an empty timeline (the run goes on; only its plot is lost).
    pub(crate) fn start(counters: Arc<LoadCounters>, began: Instant) -> Self {
        let (stop, stopped) = mpsc::channel();
        let (answer, timeline) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("load-sampler".to_owned())
            .spawn(move || {
                let _ = answer.send(sample(&counters, began, &stopped));
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "the load run's sampler did not start: no timeline");
        }
        Self { stop, timeline }
    }

    /// Takes one last sample and answers the timeline.
    pub(crate) async fn finish(self) -> Vec<Sample> {
        drop(self.stop);
        self.timeline.await.unwrap_or_default()
    }
}

/// Samples `counters` until `stopped` hears from its sender (or loses it), once more then:
/// every [`FIRST_INTERVAL`] at first; whenever the timeline reaches [`MOST_SAMPLES`], every
/// other sample is dropped and the interval doubles, so the samples stay evenly spaced.
fn sample(counters: &LoadCounters, began: Instant, stopped: &mpsc::Receiver<()>) -> Vec<Sample> {
    let mut timeline = Vec::new();
    let mut interval = FIRST_INTERVAL;
    loop {
        if timeline.len() >= MOST_SAMPLES {
            let mut index = 0;
            timeline.retain(|_| {
                index += 1;
                index % 2 == 1
            });
            interval *= 2;
        }
        timeline.push(now(counters, began));
        if !matches!(
            stopped.recv_timeout(interval),
            Err(RecvTimeoutError::Timeout)
        ) {
            timeline.push(now(counters, began));
            return timeline;
        }
    }
}

/// The counters as they are now.
fn now(counters: &LoadCounters, began: Instant) -> Sample {
    Sample {
        at_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
        started: counters.started.load(Ordering::Relaxed),
        settled: counters.settled.load(Ordering::Relaxed),
        followups: counters.followups.load(Ordering::Relaxed),
        rss_bytes: rss_bytes(),
    }
}
