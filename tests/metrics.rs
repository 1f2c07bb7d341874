//! The metrics a runtime records with a meter (issue #19 item 4): read back through the
//! Prometheus exporter a node serves, in process and from `subagents node --metrics-addr`,
//! and exported over OTLP by `subagents demo`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use subagents::testing::{FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    ContentBlock, CreateAgent, ErrorCode, EventScope, FollowupOptions, MemoryStore, MessageSource,
    ResumeAgent, Runtime, SessionPersistence,
};

use crate::cluster_nodes::NodeProcess;
use crate::support::{
    eventually, followup_child, released, root, seam_runtime_on, settled, start_continuable,
    SeamRecorder,
};
use crate::trace::Collector;

/// One series of a scrape: its labels and value.
#[derive(Debug)]
struct Series {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A Prometheus text scrape, by metric name.
#[derive(Debug, Default)]
struct Scrape(BTreeMap<String, Vec<Series>>);

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut scrape = Self::default();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
                .collect();
            scrape.0.entry(name.to_owned()).or_default().push(Series {
                labels,
                value: value.parse().unwrap_or(f64::NAN),
            });
        }
        scrape
    }

    /// The sum of `name`'s series whose labels include `labels`, a label asked for as `""`
    /// being absent (0 when there is none).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .get(name)
            .into_iter()
            .flatten()
            .filter(|series| {
                labels.iter().all(|(key, value)| {
                    series.labels.get(*key).map_or("", String::as_str) == *value
                })
            })
            .map(|series| series.value)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// A meter provider whose metrics are read back as a Prometheus scrape.
struct Meter {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
}

impl Meter {
    fn new() -> Self {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .unwrap();
        Self {
            provider: SdkMeterProvider::builder().with_reader(exporter).build(),
            registry,
        }
    }

    fn meter(&self) -> opentelemetry::metrics::Meter {
        self.provider.meter("subagents")
    }

    fn scrape(&self) -> Scrape {
        use prometheus::Encoder as _;
        let mut text = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .unwrap();
        Scrape::parse(&String::from_utf8(text).unwrap())
    }
}

/// The series of successes: those without an `error_type`.
const ACCEPTED: (&str, &str) = ("error_type", "");

// Issue #19 item 4: a child's residency moves the gauges and leaves them at zero; follow-ups
// are counted by outcome and code, the cold resume and the drain by outcome with their
// durations, and the store's appends and flushes are timed.
#[actix_rt::test]
async fn a_continuable_lifecycle_moves_the_gauges_and_counts_each_operation() {
    let meter = Meter::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let gate = Gate::new();
    model.push(ScriptStep::text("held").gated(&gate));
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = seam_runtime_on(
        Runtime::builder()
            .model("scripted", model)
            .meter(meter.meter()),
        faults.clone(),
    )
    .await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let child = start_continuable(&rt, parent.agent(), "task")
        .await
        .child_id;
    gate.reached().await;
    let resident = |scrape: &Scrape| {
        (
            scrape.value("subagents_children_resident", &[]),
            scrape.value("subagents_activations_starting", &[]),
            scrape.value("subagents_activations_settling", &[]),
        )
    };
    eventually("the child resident, its start over", || {
        resident(&meter.scrape()) == (1.0, 0.0, 0.0)
    })
    .await;
    // Its teardown waits to release its lease: the child is settling, and still resident.
    faults.hold(StoreOperation::ReleaseLease);
    gate.release();
    faults.held_calls(1).await;
    eventually("the child settling", || {
        resident(&meter.scrape()) == (1.0, 0.0, 1.0)
    })
    .await;
    faults.release(StoreOperation::ReleaseLease);
    settled(&recorder, child, 1).await;
    released(&rt, child).await;
    assert_eq!(resident(&meter.scrape()), (0.0, 0.0, 0.0));

    followup_child(&rt, parent.agent(), child, "again")
        .await
        .expect("the absent child is resumed");
    settled(&recorder, child, 2).await;
    let refused = rt
        .subagents()
        .followup(
            parent.agent(),
            child,
            Vec::<ContentBlock>::new(),
            FollowupOptions::new(MessageSource::User),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidArgs);
    rt.subagents()
        .drain_continuable_descendants(&[parent.agent().clone()])
        .await
        .unwrap();
    released(&rt, child).await;

    let scrape = meter.scrape();
    assert_eq!(resident(&scrape), (0.0, 0.0, 0.0), "{scrape:#?}");
    assert_eq!(scrape.value("subagents_followups_total", &[ACCEPTED]), 1.0);
    assert_eq!(
        scrape.value(
            "subagents_followups_total",
            &[("error_type", "INVALID_ARGS")]
        ),
        1.0,
        "{scrape:#?}"
    );
    assert_eq!(
        scrape.value("subagents_cold_resumes_total", &[ACCEPTED]),
        1.0
    );
    assert_eq!(
        scrape.value("subagents_cold_resume_duration_seconds_count", &[ACCEPTED]),
        1.0
    );
    assert_eq!(scrape.value("subagents_drains_total", &[ACCEPTED]), 1.0);
    assert_eq!(
        scrape.value("subagents_drain_duration_seconds_count", &[]),
        1.0
    );
    let appends = scrape.value("subagents_store_append_duration_seconds_count", &[ACCEPTED]);
    let stored = rt.store().unwrap().read_from(child, 0).await.unwrap().len();
    assert!(
        appends >= 2.0 && appends <= stored as f64 * 2.0,
        "appends {appends} for {stored} events of the child"
    );
    assert!(scrape.value("subagents_store_flush_duration_seconds_count", &[ACCEPTED]) >= 1.0);
    assert_eq!(scrape.value("subagents_lease_takeovers_total", &[]), 0.0);
    assert!(
        !scrape.has("subagents_cluster_deliveries_in_flight"),
        "no cluster, no deliveries: {scrape:#?}"
    );
    rt.shutdown().await.unwrap();
}

// Issue #19 item 4: a lease granted over a holder whose lease expired unrenewed is a takeover;
// the same holder's own leases are not.
#[actix_rt::test]
async fn a_lease_taken_over_from_an_expired_holder_is_counted() {
    tokio::time::pause();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let inner: Arc<dyn SessionPersistence> =
        Arc::new(MemoryStore::with_lease_ttl(Duration::from_secs(30)));
    let faults = Arc::new(FaultInjectingStore::new(Arc::clone(&inner)));
    let first = Runtime::builder()
        .model("scripted", model.clone())
        .shared_store(Arc::clone(&faults) as Arc<dyn SessionPersistence>)
        .build()
        .unwrap();
    let handle = first.agents().create(CreateAgent::new()).await.unwrap();
    let id = handle.agent().id();

    let meter = Meter::new();
    let second = Runtime::builder()
        .model("scripted", model)
        .shared_store(inner)
        .meter(meter.meter())
        .build()
        .unwrap();
    let own = second.agents().create(CreateAgent::new()).await.unwrap();
    // The first runtime can no longer renew (a partition): its lease runs out.
    faults.arm(StoreOperation::RenewLease);
    tokio::time::advance(Duration::from_secs(31)).await;
    let resumed = second.agents().resume(ResumeAgent::new(id)).await.unwrap();
    let scrape = meter.scrape();
    assert_eq!(
        scrape.value("subagents_lease_takeovers_total", &[]),
        1.0,
        "{scrape:#?}"
    );
    resumed.dispose().await.unwrap();
    own.dispose().await.unwrap();
    let _ = handle.dispose().await;
}

/// `GET path` on `addr`, answered with its status line, headers and body.
fn get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

/// The address of a node's metrics endpoint, from its `metrics <addr>` line.
fn metrics_addr(node: &NodeProcess) -> String {
    // Printed right after the `node` line the process started with.
    let line = node.next_line();
    line.strip_prefix("metrics ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned()
}

// Issue #19 item 4: `subagents node --metrics-addr` serves Prometheus text: the driving node
// counts its follow-ups, the deliveries it sent the other node (none left in flight) and its
// store's appends, and the serving node the children it holds and its store's flushes.
#[test]
fn a_node_serves_its_metrics_in_prometheus_text() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let local = ["--metrics-addr", "127.0.0.1:0"];
    let mut b = NodeProcess::start_with_env(&url, "b", &local, &[]);
    let b_metrics = metrics_addr(&b);
    // A client that connects and never asks: the endpoint closes its connection (in 5 s)
    // rather than keep it, and a task, for as long as the node runs.
    let mut quiet = std::net::TcpStream::connect(&b_metrics).unwrap();
    let mut a = NodeProcess::start_with_env(
        &url,
        "a",
        &[
            local[0],
            local[1],
            "--drive",
            "1",
            "--children",
            "2",
            "--followups",
            "1",
            "--place-on",
            &b.id.clone(),
        ],
        &[],
    );
    let a_metrics = metrics_addr(&a);
    let round = a.lines_until("round 1");
    assert_eq!(
        round
            .iter()
            .filter(|line| line.starts_with("accepted "))
            .count(),
        2,
        "{round:?}"
    );
    let (head, body) = get(&a_metrics, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let on_a = Scrape::parse(&body);
    assert_eq!(
        on_a.value("subagents_followups_total", &[ACCEPTED]),
        2.0,
        "{body}"
    );
    let start = ("subagents_operation", "start");
    assert_eq!(
        on_a.value(
            "subagents_cluster_delivery_duration_seconds_count",
            &[start, ACCEPTED]
        ),
        2.0,
        "{body}"
    );
    // Each follow-up reached its child: delivered to B while the child was resident there,
    // or by a cold resume once B had released it (which of the two is a race with the
    // child's first epoch, and a resume may itself be delivered), each counted as such.
    let delivered = on_a.value(
        "subagents_cluster_delivery_duration_seconds_count",
        &[("subagents_operation", "follow-up"), ACCEPTED],
    );
    let resumed = on_a.value("subagents_cold_resumes_total", &[ACCEPTED]);
    assert!(delivered + resumed >= 2.0, "{body}");
    assert_eq!(
        on_a.value("subagents_cluster_deliveries_in_flight", &[]),
        0.0,
        "{body}"
    );
    // The root's log grew by appends (the children's settled notices).
    assert!(
        on_a.value("subagents_store_append_duration_seconds_count", &[ACCEPTED]) > 0.0,
        "{body}"
    );
    let (_, body) = get(&b_metrics, "/metrics");
    let on_b = Scrape::parse(&body);
    // Each epoch B ran ended durably.
    assert!(
        on_b.value("subagents_store_flush_duration_seconds_count", &[ACCEPTED]) >= 2.0,
        "{body}"
    );
    assert!(on_b.has("subagents_children_resident"), "{body}");
    let (head, _) = get(&b_metrics, "/elsewhere");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    quiet
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let closed = std::io::Read::read_to_end(&mut quiet, &mut Vec::new());
    assert!(closed.is_ok(), "the quiet connection was kept: {closed:?}");
    a.tell("quit");
    assert!(a.wait().success(), "{}", a.errors());
    b.signal("-TERM");
    assert!(b.wait().success(), "{}", b.errors());
}

// Issue #19 items 3 and 4: the metrics go to the same OTLP collector as the spans, exported a
// last time as the process exits.
#[test]
fn the_demo_exports_its_metrics_over_otlp() {
    let collector = Collector::start();
    collector.demo(&[]);
    let metrics = collector.metrics();
    let named = |name: &str| {
        metrics
            .iter()
            .find(|metric| metric["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {metrics:#?}"))
    };
    // The tour's follow-up was accepted.
    let followups = &named("subagents.followups")["sum"];
    assert_eq!(followups["isMonotonic"], true);
    let accepted: u64 = followups["dataPoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|point| {
            point["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|attribute| attribute["key"] != "error.type")
        })
        .map(|point| point["asInt"].as_str().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(accepted >= 1, "{followups:#}");
    let appends = &named("subagents.store.append.duration");
    assert_eq!(appends["unit"], "s");
    assert!(!appends["histogram"]["dataPoints"]
        .as_array()
        .unwrap()
        .is_empty());
    // Every child was released by the time the demo exited.
    let resident = &named("subagents.children.resident")["sum"];
    assert_eq!(resident["isMonotonic"], false);
    for point in resident["dataPoints"].as_array().unwrap() {
        assert_eq!(point["asInt"], "0", "{resident:#}");
    }
}
