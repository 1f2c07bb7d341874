//! The metrics a runtime records when its host hands it an OpenTelemetry meter
//! ([`crate::RuntimeBuilder::meter`]): what a node's operator watches. A runtime built without
//! one records nothing and pays nothing (no clock is read for a histogram).
//!
//! | instrument | kind | what it counts |
//! | --- | --- | --- |
//! | `subagents.children.resident` | up-down counter | continuable children resident now (one live Activation each) |
//! | `subagents.activations.starting` | up-down counter | Activations being materialized now (a start or a cold resume) |
//! | `subagents.activations.settling` | up-down counter | Activations tearing down now (between their epoch's end and the settled notice) |
//! | `subagents.followups` | counter | follow-ups answered: accepted, or refused with `error.type` (the `ErrorCode`) |
//! | `subagents.cold_resumes` | counter | cold resumes of absent children (failed ones with `error.type`) |
//! | `subagents.cold_resume.duration` | histogram (s) | from the follow-up that found the child absent to its acceptance |
//! | `subagents.drains` | counter | `drain_continuable_descendants` calls (failed ones with `error.type`) |
//! | `subagents.drain.duration` | histogram (s) | each drain, until every descendant is released |
//! | `subagents.store.append.duration` | histogram (s) | each append to the session store (failed ones with `error.type`) |
//! | `subagents.store.flush.duration` | histogram (s) | each flush (a durability point: an fsync, a commit) |
//! | `subagents.lease.takeovers` | counter | session leases granted over a lapsed holder (expired, gone, or its node declared dead) |
//! | `subagents.cluster.deliveries.in_flight` | up-down counter | operations sent to another node and not yet answered |
//! | `subagents.cluster.delivery.duration` | histogram (s) | from sending an operation to its answer, by `subagents.operation` (`start`, `follow-up`, `interrupt`, `notify`, `release`); unanswered ones with `error.type` (an `ErrorCode`, or `ABANDONED` when the sender stopped waiting) |
//!
//! The names follow OpenTelemetry's conventions (dotted, `error.type` on a failure only, its
//! code, seconds for durations); a Prometheus exporter writes them with underscores and
//! suffixes (`subagents_followups_total`, `subagents_store_append_duration_seconds_bucket`,
//! `error_type`). A success carries no attribute, the cheapest measurement the SDK makes: a
//! metered store records one per append.

use std::time::Instant;

use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};
use opentelemetry::KeyValue;

use crate::error::{Result, SubagentError};

/// Latency buckets in seconds: from a memory store's append (well under a millisecond) to a
/// networked delivery's deadline.
const LATENCY_BOUNDARIES: [f64; 18] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The attribute naming a failure's code.
const ERROR_TYPE: &str = "error.type";

/// The attribute naming the operation a delivery carried.
const OPERATION: &str = "subagents.operation";

/// A runtime's instruments, made once from its meter.
#[derive(Debug)]
pub(crate) struct Metrics {
    resident: UpDownCounter<i64>,
    starting: UpDownCounter<i64>,
    settling: UpDownCounter<i64>,
    followups: Counter<u64>,
    cold_resumes: Counter<u64>,
    cold_resume_duration: Histogram<f64>,
    drains: Counter<u64>,
    drain_duration: Histogram<f64>,
    append_duration: Histogram<f64>,
    flush_duration: Histogram<f64>,
    lease_takeovers: Counter<u64>,
    deliveries_in_flight: UpDownCounter<i64>,
    delivery_duration: Histogram<f64>,
}

/// Which way a continuable child's residency changed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Residency {
    /// A materialization (start or cold resume) began.
    Starting,
    /// A materialization ended (installed or rolled back).
    Started,
    /// An Activation was installed: the child is resident.
    Resident,
    /// An Activation's teardown began.
    Settling,
    /// An Activation's teardown is over: the child is no longer resident.
    Settled,
}

impl Metrics {
    /// The instruments of `meter`.
    pub(crate) fn new(meter: &Meter) -> Self {
        let latency = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(LATENCY_BOUNDARIES.to_vec())
                .build()
        };
        Self {
            resident: meter
                .i64_up_down_counter("subagents.children.resident")
                .with_unit("{child}")
                .with_description("Continuable children resident now, one live Activation each")
                .build(),
            starting: meter
                .i64_up_down_counter("subagents.activations.starting")
                .with_unit("{activation}")
                .with_description("Activations being materialized now (starts and cold resumes)")
                .build(),
            settling: meter
                .i64_up_down_counter("subagents.activations.settling")
                .with_unit("{activation}")
                .with_description("Activations tearing down now")
                .build(),
            followups: meter
                .u64_counter("subagents.followups")
                .with_unit("{followup}")
                .with_description("Follow-ups answered, accepted or refused (by error code)")
                .build(),
            cold_resumes: meter
                .u64_counter("subagents.cold_resumes")
                .with_unit("{resume}")
                .with_description("Cold resumes of absent continuable children")
                .build(),
            cold_resume_duration: latency(
                "subagents.cold_resume.duration",
                "From finding a child absent to its follow-up's acceptance",
            ),
            drains: meter
                .u64_counter("subagents.drains")
                .with_unit("{drain}")
                .with_description("Drains of continuable descendants")
                .build(),
            drain_duration: latency(
                "subagents.drain.duration",
                "Each drain, until every descendant is released",
            ),
            append_duration: latency(
                "subagents.store.append.duration",
                "Each append to the session store",
            ),
            flush_duration: latency(
                "subagents.store.flush.duration",
                "Each flush of the session store (a durability point)",
            ),
            lease_takeovers: meter
                .u64_counter("subagents.lease.takeovers")
                .with_unit("{lease}")
                .with_description("Session leases granted over a lapsed holder")
                .build(),
            deliveries_in_flight: meter
                .i64_up_down_counter("subagents.cluster.deliveries.in_flight")
                .with_unit("{delivery}")
                .with_description("Operations sent to another node and not yet answered")
                .build(),
            delivery_duration: latency(
                "subagents.cluster.delivery.duration",
                "From sending an operation to another node to its answer",
            ),
        }
    }

    /// Records a change of a continuable child's residency.
    pub(crate) fn residency(&self, change: Residency) {
        let (gauge, delta) = match change {
            Residency::Starting => (&self.starting, 1),
            Residency::Started => (&self.starting, -1),
            Residency::Resident => (&self.resident, 1),
            Residency::Settling => (&self.settling, 1),
            Residency::Settled => {
                self.resident.add(-1, &[]);
                (&self.settling, -1)
            }
        };
        gauge.add(delta, &[]);
    }

    /// Records a follow-up's answer.
    pub(crate) fn followup<T>(&self, answer: &Result<T>) {
        with_outcome(answer, None, |attributes| self.followups.add(1, attributes));
    }

    /// Records a cold resume's outcome and how long it took since `began`.
    pub(crate) fn cold_resume<T>(&self, answer: &Result<T>, began: Instant) {
        with_outcome(answer, None, |attributes| {
            self.cold_resumes.add(1, attributes);
            self.cold_resume_duration
                .record(began.elapsed().as_secs_f64(), attributes);
        });
    }

    /// Records a drain's outcome and how long it took since `began`.
    pub(crate) fn drain<T>(&self, answer: &Result<T>, began: Instant) {
        with_outcome(answer, None, |attributes| {
            self.drains.add(1, attributes);
            self.drain_duration
                .record(began.elapsed().as_secs_f64(), attributes);
        });
    }

    /// Records a store append's outcome and latency.
    pub(crate) fn append<T>(&self, answer: &Result<T>, began: Instant) {
        let seconds = began.elapsed().as_secs_f64();
        with_outcome(answer, None, |attributes| {
            self.append_duration.record(seconds, attributes);
        });
    }

    /// Records a store flush's outcome and latency.
    pub(crate) fn flush<T>(&self, answer: &Result<T>, began: Instant) {
        let seconds = began.elapsed().as_secs_f64();
        with_outcome(answer, None, |attributes| {
            self.flush_duration.record(seconds, attributes);
        });
    }

    /// Counts a lease granted over a lapsed holder.
    pub(crate) fn lease_taken_over(&self) {
        self.lease_takeovers.add(1, &[]);
    }

    /// Marks an operation sent to another node; the returned guard records its answer (or,
    /// dropped unanswered, that it was abandoned) and ends it.
    pub(crate) fn delivery(&self, operation: &'static str) -> DeliveryInFlight<'_> {
        self.deliveries_in_flight.add(1, &[]);
        DeliveryInFlight {
            metrics: self,
            operation,
            began: Instant::now(),
            answered: false,
        }
    }
}

/// An operation sent to another node, in flight until answered or dropped.
pub(crate) struct DeliveryInFlight<'a> {
    metrics: &'a Metrics,
    operation: &'static str,
    began: Instant,
    answered: bool,
}

impl DeliveryInFlight<'_> {
    /// Records the answer.
    pub(crate) fn answered<T>(mut self, answer: &Result<T>) {
        self.answered = true;
        let seconds = self.began.elapsed().as_secs_f64();
        let operation = KeyValue::new(OPERATION, self.operation);
        with_outcome(answer, Some(operation), |attributes| {
            self.metrics.delivery_duration.record(seconds, attributes);
        });
    }
}

impl Drop for DeliveryInFlight<'_> {
    fn drop(&mut self) {
        self.metrics.deliveries_in_flight.add(-1, &[]);
        if !self.answered {
            self.metrics.delivery_duration.record(
                self.began.elapsed().as_secs_f64(),
                &[
                    KeyValue::new(OPERATION, self.operation),
                    KeyValue::new(ERROR_TYPE, "ABANDONED"),
                ],
            );
        }
    }
}

/// Records with `extra` and, for a failed `answer`, its error code as `error.type`; a success
/// without `extra` carries no attribute. Built on the stack.
fn with_outcome<T>(answer: &Result<T>, extra: Option<KeyValue>, record: impl FnOnce(&[KeyValue])) {
    let code = |error: &SubagentError| KeyValue::new(ERROR_TYPE, error.code().as_str());
    match (answer, extra) {
        (Ok(_), None) => record(&[]),
        (Ok(_), Some(extra)) => record(&[extra]),
        (Err(error), None) => record(&[code(error)]),
        (Err(error), Some(extra)) => record(&[extra, code(error)]),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;

    use super::*;
    use crate::error::ErrorCode;

    /// The Prometheus text of what `record` recorded in a fresh runtime's metrics.
    fn scraped(record: impl FnOnce(&Metrics)) -> String {
        use prometheus::Encoder as _;
        let registry = prometheus::Registry::new();
        let reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .unwrap();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(reader)
            .build();
        record(&Metrics::new(&provider.meter("subagents")));
        let mut text = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        String::from_utf8(text).unwrap()
    }

    /// The value of series `name` with exactly the labels `labels` (`key="value"` each, in any
    /// order: the exporter writes them in the order they were recorded).
    fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
        let mut wanted: Vec<&str> = labels.to_vec();
        wanted.push(r#"otel_scope_name="subagents""#);
        wanted.sort_unstable();
        text.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (named, labelled) = series.split_once('{')?;
            let mut found: Vec<&str> = labelled.strip_suffix('}')?.split(',').collect();
            found.sort_unstable();
            (named == name && found == wanted).then(|| value.parse().ok())?
        })
    }

    #[test]
    fn a_delivery_dropped_unanswered_is_recorded_abandoned_and_leaves_none_in_flight() {
        let text = scraped(|metrics| {
            let answered = metrics.delivery("start");
            let dropped = metrics.delivery("follow-up");
            let refused = metrics.delivery("interrupt");
            answered.answered(&Ok(()));
            refused.answered::<()>(&Err(SubagentError::new(ErrorCode::Unauthorized, "no")));
            drop(dropped);
        });
        let count = |labels: &[&str]| {
            value(
                &text,
                "subagents_cluster_delivery_duration_seconds_count",
                labels,
            )
        };
        let abandoned = [
            r#"subagents_operation="follow-up""#,
            r#"error_type="ABANDONED""#,
        ];
        assert_eq!(count(&abandoned), Some(1.0), "{text}");
        let refused = [
            r#"subagents_operation="interrupt""#,
            r#"error_type="UNAUTHORIZED""#,
        ];
        assert_eq!(count(&refused), Some(1.0), "{text}");
        assert_eq!(
            count(&[r#"subagents_operation="start""#]),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "subagents_cluster_deliveries_in_flight", &[]),
            Some(0.0),
            "{text}"
        );
    }
}
