//! Provides [`LossReporting`]: a span exporter that says when spans do not reach the
//! collector, on stderr through the command's log: once when the first batch fails (the
//! collector is unreachable, refuses, or times out), and at exit with how many spans were lost
//! and how many were exported.
//!
//! # Why
//! The SDK's batch processor keeps an export's failure to itself (or, with its internal logs
//! on, writes a line per failed batch: thousands in a long load run). A person who pointed
//! `--otlp-endpoint` at the wrong port saw an empty trace viewer and a run that said nothing.
//! Spans the processor drops before they reach the exporter (its queue full) are the SDK's own
//! to count: it warns at the first drop and at exit with the total.
//!
//! # Why a failing collector is not tried again at exit
//! The OTLP exporter retries a failed batch with backoff (about three quarters of a second when
//! the port is closed). At exit the processor exports every batch it still holds, one after
//! another, within a five-second deadline: a run with a few thousand spans queued for a
//! collector that is gone waited the whole deadline, and its exporter never got to say how
//! many spans were lost. Once the process has begun to exit ([`Exiting::begin`]), a batch
//! meant for a collector whose last export failed is counted lost without being sent; one that
//! answered last is still tried.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

/// Whether the process has begun to exit; shared by the exporter and whoever shuts it down.
#[derive(Clone, Debug, Default)]
pub(crate) struct Exiting(Arc<AtomicBool>);

impl Exiting {
    /// Marks the exit begun: a collector whose last export failed is not tried again.
    pub(crate) fn begin(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn begun(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `exporter`, counting what it exported and what it lost, and saying so.
#[derive(Debug)]
pub(crate) struct LossReporting<E> {
    exporter: E,
    /// Where the spans go, as the log names it.
    collector: String,
    exported: AtomicU64,
    lost: AtomicU64,
    /// Whether the first failure was told.
    told: AtomicBool,
    /// Whether the last export failed.
    failing: AtomicBool,
    exiting: Exiting,
}

impl<E> LossReporting<E> {
    /// Wraps `exporter`, which sends to `collector` (a URL, or a description of where the
    /// standard variables point); from `exiting`'s start on, a failing collector is not tried
    /// again.
    pub(crate) fn new(exporter: E, collector: String, exiting: Exiting) -> Self {
        Self {
            exporter,
            collector,
            exported: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            told: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            exiting,
        }
    }

    /// Counts an export of `spans` spans that ended in `result`, and tells the first failure.
    fn count(&self, spans: u64, result: &OTelSdkResult) {
        self.failing.store(result.is_err(), Ordering::Relaxed);
        match result {
            Ok(()) => {
                self.exported.fetch_add(spans, Ordering::Relaxed);
            }
            Err(error) => {
                self.lost.fetch_add(spans, Ordering::Relaxed);
                if !self.told.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        collector = %self.collector,
                        %error,
                        "spans are not reaching the OTLP collector (the run goes on; the spans \
                         lost are counted at exit)"
                    );
                }
            }
        }
    }

    /// Tells, once the exporter is done, how many spans were lost, if any.
    fn tell_losses(&self) {
        let lost = self.lost.load(Ordering::Relaxed);
        if lost > 0 {
            tracing::error!(
                collector = %self.collector,
                lost,
                exported = self.exported.load(Ordering::Relaxed),
                "spans were not exported to the OTLP collector"
            );
        }
    }
}

impl<E: SpanExporter> SpanExporter for LossReporting<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let spans = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let abandoned = self.exiting.begun() && self.failing.load(Ordering::Relaxed);
        let export = (!abandoned).then(|| self.exporter.export(batch));
        async move {
            let result = match export {
                Some(export) => export.await,
                None => Err(OTelSdkError::InternalFailure(
                    "not sent: the collector failed the last export and the process is exiting"
                        .to_owned(),
                )),
            };
            self.count(spans, &result);
            result
        }
    }

    // The batch processor exports what it still holds before it shuts its exporter down, with
    // `shutdown` (which the OTLP exporter implements, not `shutdown_with_timeout`): both are
    // forwarded as they were called.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.tell_losses();
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.tell_losses();
        self.exporter.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.exporter.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::executor::block_on;

    use super::*;

    /// An exporter that answers every export with `fails`, counting the calls it got.
    #[derive(Debug, Default)]
    struct Collector {
        fails: AtomicBool,
        calls: AtomicUsize,
    }

    impl SpanExporter for &Collector {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.fails.load(Ordering::Relaxed) {
                Err(OTelSdkError::InternalFailure("refused".to_owned()))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn at_exit_only_a_collector_that_failed_the_last_export_is_not_tried_again() {
        let collector = Collector::default();
        let exiting = Exiting::default();
        let exporter = LossReporting::new(&collector, "a collector".to_owned(), exiting.clone());
        let calls = || collector.calls.load(Ordering::Relaxed);

        // Before the exit, a failing collector is still tried at every batch.
        collector.fails.store(true, Ordering::Relaxed);
        assert!(block_on(exporter.export(Vec::new())).is_err());
        assert!(block_on(exporter.export(Vec::new())).is_err());
        assert_eq!(calls(), 2);

        // One that answered its last export is tried at exit too.
        collector.fails.store(false, Ordering::Relaxed);
        assert!(block_on(exporter.export(Vec::new())).is_ok());
        exiting.begin();
        assert!(block_on(exporter.export(Vec::new())).is_ok());
        assert_eq!(calls(), 4);

        // Once it fails at exit, the batches after are lost without being sent.
        collector.fails.store(true, Ordering::Relaxed);
        assert!(block_on(exporter.export(Vec::new())).is_err());
        assert_eq!(calls(), 5);
        let abandoned = block_on(exporter.export(Vec::new())).unwrap_err();
        assert!(abandoned.to_string().contains("not sent"), "{abandoned}");
        assert_eq!(calls(), 5);
    }
}
