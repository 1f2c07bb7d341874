//! Runs a [`Scenario`]: builds a runtime on the load model, grows the forest, sends the
//! follow-ups and interrupts, drains, measures, and verifies.
//!
//! Every root's children run concurrently, at most `in_flight` of them at once across the run
//! (each holds its slot for its whole life). A one-shot child is started, awaited and disposed;
//! a continuable child is started, awaited until it settles, then sent its follow-ups one by
//! one (each cold-resumes it), and maybe interrupted right after the last one. Continuable
//! children below the last level delegate their own children from their own turn, through the
//! `delegate` tool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Instant;

use futures::future::{join_all, try_join_all};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::memory::{peak_rss_bytes, rss_bytes};
use super::model::{delegate_directive, LoadModel, DELEGATE_TOOL, REPORT_DIRECTIVE, REPORT_TOOL};
use super::report::{LatencyRecorder, LoadReport};
use super::scenario::{in_share, share_count, LoadFlush, LoadStore, Scenario};
use super::store::{open_store, Reopen, RunStore};
use super::timeline::Sampler;
use super::verify::{verify, Created};
use crate::actors::agent::AgentRef;
use crate::content::{ContentBlock, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::{EventScope, Subscription};
use crate::host::{AgentOptions, Budget, CreateAgent, FlushPolicy};
use crate::ids::{FastHashMap, MessageId, RunId, SessionId};
use crate::seam::{
    ContinuableStartSpec, DelegationMode, FollowupOptions, InterruptAuthority, ReportDelivery,
    ReportOptions, SubagentEvent, SubagentStartRequest,
};
use crate::store::SharedStore;
use crate::tools::plugin::calling_agent;
use crate::tools::{Tool, ToolError, ToolOutput};
use crate::Runtime;

/// What a run has done so far; the CLI polls it for its progress bars.
#[derive(Debug, Default)]
pub struct LoadCounters {
    /// Children created (each once, whatever its epochs).
    pub created: AtomicU64,
    /// Epochs started: a one-shot run, or one activation of a continuable child (its first
    /// turns, then each follow-up that cold-resumes it).
    pub started: AtomicU64,
    /// Epochs ended (`subagent/end`).
    pub settled: AtomicU64,
    /// Follow-ups accepted.
    pub followups: AtomicU64,
}

impl LoadCounters {
    /// Epochs started but not settled yet.
    pub fn in_flight(&self) -> u64 {
        self.started
            .load(Ordering::Relaxed)
            .saturating_sub(self.settled.load(Ordering::Relaxed))
    }
}

/// A child's ended epochs: counted, and watched through a channel only while a task waits for
/// them (a channel per child costs a few hundred bytes, a million children's a few hundred
/// MB).
enum Ended {
    Counted(u64),
    Watched(watch::Sender<u64>),
}

/// The lifecycle events of the run, as the delegation API emitted them.
#[derive(Default)]
struct Lifecycle {
    /// The ended epochs of each child the run still follows (see [`Lifecycle::forget`]).
    epochs: Mutex<FastHashMap<SessionId, Ended>>,
    /// Each run id's `subagent/start` and `subagent/end` counts.
    runs: Mutex<FastHashMap<RunId, (u32, u32)>>,
    /// The most children in flight at once ([`LoadCounters::in_flight`]).
    peak: AtomicU64,
    /// Each child's started epochs, when the run follows children across nodes (a follow-up
    /// that began no epoch joined the one running, wherever it ran).
    starts: Option<Mutex<FastHashMap<SessionId, u64>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lifecycle {
    /// A receiver of `child`'s ended epochs, watched from now on.
    fn epochs_of(&self, child: SessionId) -> watch::Receiver<u64> {
        let mut epochs = lock(&self.epochs);
        let ended = epochs.entry(child).or_insert(Ended::Counted(0));
        match ended {
            Ended::Watched(sender) => sender.subscribe(),
            Ended::Counted(count) => {
                let (sender, receiver) = watch::channel(*count);
                *ended = Ended::Watched(sender);
                receiver
            }
        }
    }

    /// Stops watching `child`'s epochs once no task waits for them.
    fn unwatch(&self, child: SessionId) {
        if let Some(ended) = lock(&self.epochs).get_mut(&child) {
            let unwatched = match ended {
                Ended::Watched(sender) if sender.receiver_count() == 0 => *sender.borrow(),
                _ => return,
            };
            *ended = Ended::Counted(unwatched);
        }
    }

    /// Forgets `child`'s epochs: its task waits for none any more. (An epoch that ends later,
    /// an interrupted child's, is counted again, and nobody waits for it.)
    fn forget(&self, child: SessionId) {
        lock(&self.epochs).remove(&child);
    }

    fn observe(&self, event: &SubagentEvent, counters: &LoadCounters) {
        match event {
            SubagentEvent::Start(info) => {
                lock(&self.runs).entry(info.run_id).or_default().0 += 1;
                if let Some(starts) = &self.starts {
                    *lock(starts).entry(info.id).or_default() += 1;
                }
                counters.started.fetch_add(1, Ordering::Relaxed);
                self.peak.fetch_max(counters.in_flight(), Ordering::Relaxed);
            }
            SubagentEvent::End(end) => {
                lock(&self.runs).entry(end.info.run_id).or_default().1 += 1;
                counters.settled.fetch_add(1, Ordering::Relaxed);
                match lock(&self.epochs)
                    .entry(end.info.id)
                    .or_insert(Ended::Counted(0))
                {
                    Ended::Counted(count) => *count += 1,
                    Ended::Watched(sender) => sender.send_modify(|epochs| *epochs += 1),
                }
            }
            _ => {}
        }
    }

    /// How many epochs of `child` have started (0 unless starts are followed).
    fn starts_of(&self, child: SessionId) -> u64 {
        self.starts
            .as_ref()
            .and_then(|starts| lock(starts).get(&child).copied())
            .unwrap_or(0)
    }

    /// Waits until `child` has ended `epochs` epochs.
    async fn settled(&self, child: SessionId, epochs: u64) -> Result<()> {
        let mut ended = self.epochs_of(child);
        let waited = ended
            .wait_for(|ended| *ended >= epochs)
            .await
            .map(drop)
            .map_err(|_| SubagentError::bug("the lifecycle record closed during the run"));
        drop(ended);
        self.unwatch(child);
        waited
    }
}

/// Everything the run's tasks share.
struct Shared {
    /// Fired to stop the run early: no root starts another child.
    stop: CancellationToken,
    scenario: Scenario,
    /// The first node's runtime: the roots live there.
    rt: Runtime,
    /// The other nodes' runtimes, when the run is a cluster.
    peers: Vec<Runtime>,
    /// Every node's id, the first node's first (empty without a cluster).
    nodes: Vec<crate::cluster::NodeId>,
    lifecycle: Arc<Lifecycle>,
    counters: Arc<LoadCounters>,
    /// Every child created, in creation order.
    created: Mutex<Vec<Created>>,
    /// Every follow-up accepted: the child, the message id, and when it was sent (epoch
    /// milliseconds).
    accepted: Mutex<Vec<(SessionId, MessageId, u64)>>,
    /// The first delegation that failed inside a child's turn.
    failure: Mutex<Option<SubagentError>>,
    refused: AtomicU64,
    interrupted: AtomicU64,
    reports: AtomicU64,
    one_shot_latency: LatencyRecorder,
    start_latency: LatencyRecorder,
    followup_latency: LatencyRecorder,
    followup_settle_latency: LatencyRecorder,
    /// Follow-ups accepted by a child resident on another node.
    cross_node_latency: LatencyRecorder,
    /// The run's window of root children in flight (`Scenario::in_flight` permits).
    window: tokio::sync::Semaphore,
}

fn prompt(text: String) -> Vec<ContentBlock> {
    vec![ContentBlock::text(text)]
}

/// The work a continuable child at `level` below `root` is given: above the last level, a
/// directive to delegate the next level (the arguments its `delegate` call carries), and for a
/// reporting child the directive to report.
fn task_for(scenario: &Scenario, root: SessionId, level: u64, report: bool) -> String {
    let mut task = "work".to_owned();
    if level < scenario.depth && scenario.children > 0 {
        let arguments = json!({"count": scenario.children, "level": level + 1, "root": root});
        task.push_str(&format!(", then {}", delegate_directive(&arguments)));
    }
    if report {
        task.push_str(&format!(" and {REPORT_DIRECTIVE}"));
    }
    task
}

impl Shared {
    fn record(&self, created: Created) {
        lock(&self.created).push(created);
        self.counters.created.fetch_add(1, Ordering::Relaxed);
    }

    /// The runtime of node `node` (0: the roots' node).
    fn node(&self, node: usize) -> &Runtime {
        node.checked_sub(1)
            .and_then(|peer| self.peers.get(peer))
            .unwrap_or(&self.rt)
    }

    /// Starts one continuable child of `parent` (an agent of `rt`) at `level`, placed on
    /// `placement` when given, recorded.
    #[allow(clippy::too_many_arguments)]
    async fn start_continuable(
        &self,
        rt: &Runtime,
        parent: &AgentRef,
        root: SessionId,
        level: u64,
        budget: Option<Budget>,
        report: bool,
        placement: Option<crate::cluster::NodeId>,
    ) -> Result<SessionId> {
        let mut spec = ContinuableStartSpec::new(
            "spawn",
            format!("level {level}"),
            parent,
            prompt(task_for(&self.scenario, root, level, report)),
        );
        if let Some(budget) = budget {
            spec = spec.budget(budget);
        }
        if let Some(node) = placement {
            spec = spec.on_node(node);
        }
        let began = Instant::now();
        let started = rt.subagents().start_continuable(spec).await?;
        self.start_latency.record(began.elapsed());
        self.record(Created {
            id: started.child_id,
            parent: parent.id(),
            root,
            mode: DelegationMode::Continuable,
        });
        Ok(started.child_id)
    }

    /// The `report` tool's work: a quiet report from the calling child to its parent.
    async fn report(&self, rt: &Runtime, child: &AgentRef) -> Result<()> {
        rt.subagents()
            .report_from(
                child,
                prompt("progress".to_owned()),
                ReportOptions::new(ReportDelivery::Quiet),
            )
            .await?;
        self.reports.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The `delegate` tool's work: `count` continuable children of the calling agent, at
    /// `level` below `root`.
    async fn delegate(
        &self,
        rt: &Runtime,
        parent: &AgentRef,
        count: u64,
        level: u64,
        root: SessionId,
    ) -> Result<()> {
        try_join_all(
            (0..count).map(|_| self.start_continuable(rt, parent, root, level, None, false, None)),
        )
        .await
        .map(drop)
    }

    async fn one_shot(&self, root: &AgentRef, index: u64) -> Result<()> {
        let provider = if in_share(index, self.scenario.fork_share) {
            "fork"
        } else {
            "spawn"
        };
        let mut request = SubagentStartRequest::new(root, prompt("work".to_owned()));
        request.label = Some(format!("one-shot {index}"));
        let began = Instant::now();
        let run = self.rt.subagents().start(provider, request).await?;
        self.record(Created {
            id: run.id(),
            parent: root.id(),
            root: root.id(),
            mode: DelegationMode::OneShot,
        });
        let result = run.result().await;
        self.one_shot_latency.record(began.elapsed());
        run.dispose().await?;
        self.lifecycle.forget(run.id());
        result.map(drop)
    }

    async fn continuable(&self, root: &AgentRef, index: u64, position: u64) -> Result<()> {
        let budgeted = in_share(position, self.scenario.budget_share);
        // Counted from the other end, so the interrupted children are not the budgeted ones.
        let continuable = share_count(self.scenario.children, self.scenario.continuable_share);
        let interrupt = in_share(
            continuable.saturating_sub(position + 1),
            self.scenario.interrupt_share,
        );
        let budget = budgeted.then(|| Budget::unlimited().turns(1));
        let report = in_share(position, self.scenario.report_share);
        // Round-robin over the cluster's nodes; the first is the roots' own.
        let placed = (!self.nodes.is_empty())
            .then(|| usize::try_from(position).unwrap_or(0) % self.nodes.len());
        let placement = placed.map(|node| self.nodes[node]);
        let child = self
            .start_continuable(&self.rt, root, root.id(), 1, budget, report, placement)
            .await?;
        // A child placed elsewhere is chased there by its first follow-up while its first
        // turn runs (a budgeted one would refuse it): no wait for the epoch to end.
        let chase = placed.is_some_and(|node| node > 0) && !budgeted && self.scenario.followups > 0;
        // The epochs the child will have ended once idle after what was sent so far.
        let mut epochs = 1;
        if !chase {
            self.lifecycle.settled(child, 1).await?;
        }
        for followup in 0..self.scenario.followups {
            let began = Instant::now();
            let sent_at = crate::session::header::now_ms();
            let sent = self
                .rt
                .subagents()
                .followup(
                    root,
                    child,
                    prompt(format!("follow-up {followup} of child {index}")),
                    FollowupOptions::new(MessageSource::User),
                )
                .await;
            let id = match sent {
                Ok(id) => id,
                Err(error) if budgeted && error.code() == ErrorCode::BudgetExhausted => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(error) => return Err(error),
            };
            if chase && followup == 0 && self.lifecycle.starts_of(child) == 1 {
                // No epoch began for it: the running epoch on the other node took it.
                self.cross_node_latency.record(began.elapsed());
            } else {
                epochs += 1;
            }
            self.followup_latency.record(began.elapsed());
            self.counters.followups.fetch_add(1, Ordering::Relaxed);
            lock(&self.accepted).push((child, id, sent_at));
            if interrupt && followup + 1 == self.scenario.followups {
                // Parks whatever is pending; the final drain settles the child.
                self.rt
                    .subagents()
                    .interrupt(
                        child,
                        InterruptAuthority::User {
                            parent_session_id: root.id(),
                        },
                    )
                    .await?;
                self.interrupted.fetch_add(1, Ordering::Relaxed);
                break;
            }
            self.lifecycle.settled(child, epochs).await?;
            self.followup_settle_latency.record(began.elapsed());
        }
        self.lifecycle.forget(child);
        Ok(())
    }

    async fn root(&self, root: &AgentRef) -> Result<()> {
        let mut continuable = 0;
        let mut one_shot = 0;
        let tasks = (0..self.scenario.children).map(|index| {
            let is_continuable = in_share(index, self.scenario.continuable_share);
            let position = if is_continuable {
                continuable += 1;
                continuable - 1
            } else {
                one_shot += 1;
                one_shot - 1
            };
            async move {
                // Held for the child's whole life: the window bounds what is in memory.
                let _slot = self
                    .window
                    .acquire()
                    .await
                    .map_err(|_| SubagentError::bug("the load window closed"))?;
                if self.stop.is_cancelled() {
                    return Ok(());
                }
                if is_continuable {
                    self.continuable(root, index, position).await
                } else {
                    self.one_shot(root, position).await
                }
            }
        });
        // Polled as they are admitted, so a million children are never a million futures;
        // none is admitted once the run is stopped.
        stream::iter(tasks)
            .take_until(self.stop.clone().cancelled_owned())
            .buffer_unordered(usize::try_from(self.scenario.in_flight).unwrap_or(usize::MAX))
            .try_collect::<()>()
            .await
    }
}

/// Where the load tools find the run's state once it exists.
type SharedSlot = Arc<OnceLock<Weak<Shared>>>;

/// A tool of the load agents: `work` runs on the run's state for the calling agent. A failure
/// is the tool's error in the child's turn, which goes on, and the run's failure (the first
/// one wins), so a run never passes with work a child could not do.
fn load_tool<F, Fut>(
    name: &str,
    description: &str,
    parameters: serde_json::Value,
    (slot, node): (&SharedSlot, usize),
    work: F,
) -> Tool
where
    F: Fn(Arc<Shared>, serde_json::Value, AgentRef, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<String>> + Send + 'static,
{
    let slot = Arc::clone(slot);
    let tool = name.to_owned();
    Tool::new(name, description, parameters, move |args, ctx| {
        let caller = calling_agent(&ctx, &tool);
        let running = slot.get().and_then(Weak::upgrade).map(|shared| {
            let work = caller.map(|caller| work(Arc::clone(&shared), args, caller, node));
            (shared, work)
        });
        async move {
            let Some((shared, work)) = running else {
                return Err(ToolError::new("NOT_READY", "the load run is not running"));
            };
            let work = work?;
            match work.await {
                Ok(text) => Ok(ToolOutput::text(text)),
                Err(error) => {
                    let result = ToolError::new(error.code().as_str(), error.message());
                    lock(&shared.failure).get_or_insert(error);
                    Err(result)
                }
            }
        }
    })
}

/// Runs `scenario` to the end: grows the forest, drains it, measures and verifies. The report
/// says whether verification held; a run whose setup or delegation calls fail is an `Err`.
///
/// # Errors
/// `INVALID_ARGS` for a scenario out of range; the store's error when it cannot be opened; the
/// first delegation error a child's task met.
pub async fn run(scenario: &Scenario, counters: Arc<LoadCounters>) -> Result<LoadReport> {
    run_until(scenario, counters, CancellationToken::new()).await
}

/// [`run`], stopping early once `stop` fires: no root starts another child, the children
/// already started finish what they were given, and the run drains and verifies what it
/// grew. The report says it was interrupted.
///
/// # Errors
/// As [`run`].
pub async fn run_until(
    scenario: &Scenario,
    counters: Arc<LoadCounters>,
    stop: CancellationToken,
) -> Result<LoadReport> {
    run_configured(scenario, counters, stop, std::convert::identity).await
}

/// [`run_until`], every node's runtime assembled by the run and then passed through
/// `configure` before it is built: a host's meter ([`crate::RuntimeBuilder::meter`]) or
/// content tracing ([`crate::RuntimeBuilder::trace_content`]).
///
/// # Errors
/// As [`run`].
pub async fn run_configured(
    scenario: &Scenario,
    counters: Arc<LoadCounters>,
    stop: CancellationToken,
    configure: fn(crate::RuntimeBuilder) -> crate::RuntimeBuilder,
) -> Result<LoadReport> {
    scenario.validate()?;
    let floors = super::report::Floors::measure(scenario.store == LoadStore::Sled).await;
    let rss_before = rss_bytes();
    let opened = open_store(scenario).await?;
    let workers = match scenario.workers {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        workers => workers,
    };
    // Weak: the tools live in the runtime, and `Shared` holds the runtime.
    let shared_slot: SharedSlot = Arc::default();
    let mut nodes = Vec::new();
    let mut builder = configure(build_node(
        scenario,
        &opened.store,
        &shared_slot,
        0,
        workers,
    ));
    if let Some(store) = &opened.cluster {
        let (holder, membership) = join(store, "load-0").await?;
        nodes.push(holder.id());
        builder = builder.lease_holder(holder).cluster(membership);
    }
    let rt = builder.build()?;
    rt.subagents().register_in_process_providers().await?;
    let mut peers = Vec::new();
    if let Some(url) = opened.cluster.as_ref().and(scenario.store_url.as_ref()) {
        for node in 1..usize::try_from(scenario.nodes).unwrap_or(1) {
            // A store (and connections) of its own, as another process would have.
            let store = Arc::new(crate::store::PostgresStore::connect(url).await?);
            let (holder, membership) = join(&store, &format!("load-{node}")).await?;
            nodes.push(holder.id());
            let store: SharedStore = store;
            let peer = configure(build_node(scenario, &store, &shared_slot, node, workers))
                .lease_holder(holder)
                .cluster(membership)
                .build()?;
            peer.subagents().register_in_process_providers().await?;
            peers.push(peer);
        }
    }
    let lifecycle = Arc::new(Lifecycle {
        starts: (!nodes.is_empty()).then(Mutex::default),
        ..Lifecycle::default()
    });
    // Every node's lifecycle: a child's epochs start and end on the node it is resident on.
    let _subscriptions: Vec<Subscription> = std::iter::once(&rt)
        .chain(&peers)
        .map(|node| {
            let observer = Arc::clone(&lifecycle);
            let observed = Arc::clone(&counters);
            node.subagents()
                .events()
                .subscribe(EventScope::All, move |event: &SubagentEvent| {
                    observer.observe(event, &observed);
                })
        })
        .collect();
    let shared = Arc::new(Shared {
        stop,
        scenario: scenario.clone(),
        rt: rt.clone(),
        peers,
        nodes,
        lifecycle: Arc::clone(&lifecycle),
        counters: Arc::clone(&counters),
        created: Mutex::default(),
        accepted: Mutex::default(),
        refused: AtomicU64::new(0),
        interrupted: AtomicU64::new(0),
        reports: AtomicU64::new(0),
        failure: Mutex::default(),
        one_shot_latency: LatencyRecorder::default(),
        start_latency: LatencyRecorder::default(),
        followup_latency: LatencyRecorder::default(),
        followup_settle_latency: LatencyRecorder::default(),
        cross_node_latency: LatencyRecorder::default(),
        window: tokio::sync::Semaphore::new(
            usize::try_from(scenario.in_flight)
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        ),
    });
    // Set before any agent can call the tool.
    let _ = shared_slot.set(Arc::downgrade(&shared));
    let outcome = grow(&shared, scenario, &opened, floors, rss_before).await;
    if outcome.is_err() {
        // Nothing of a failed run stays behind in the caller's actor system.
        if let Err(drain) = shut_down(&shared).await {
            tracing::warn!(%drain, "the failed load run did not drain cleanly");
        }
    }
    let (mut report, pending) = outcome?;
    if let (Some(pending), Some(Reopen::Sled(dir))) = (pending, &opened.reopen) {
        // Every handle on the store goes, so sled flushes it and lets go of its directory.
        drop((shared, rt, _subscriptions));
        let RunStore {
            store, _temporary, ..
        } = opened;
        drop(store);
        report.push_check(super::verify::reopened_sled(dir, &pending.roots, &pending.pairs).await);
        drop(_temporary);
    }
    Ok(report)
}

/// Shuts every node down, the roots' node first: its drain releases the children it placed
/// on the others, which must still serve them.
async fn shut_down(shared: &Shared) -> Result<()> {
    let mut outcome = shared.rt.shutdown().await;
    for peer in &shared.peers {
        let peer = peer.shutdown().await;
        if outcome.is_ok() {
            outcome = peer;
        }
    }
    outcome
}

/// The runtime of node `node` (the only one without a cluster), its tools bound to it.
fn build_node(
    scenario: &Scenario,
    store: &SharedStore,
    slot: &SharedSlot,
    node: usize,
    workers: usize,
) -> crate::RuntimeBuilder {
    let delegate = load_tool(
        DELEGATE_TOOL,
        "Delegates continuable children.",
        json!({"type": "object", "properties": {"count": {"type": "integer", "minimum": 0}}, "required": ["count"]}),
        (slot, node),
        |shared, args, caller, node| async move {
            let invalid = || {
                SubagentError::new(
                    ErrorCode::InvalidArgs,
                    "delegate needs count, level and root",
                )
            };
            let count = args["count"].as_u64().ok_or_else(invalid)?;
            let level = args["level"].as_u64().ok_or_else(invalid)?;
            let root: SessionId = args["root"]
                .as_str()
                .and_then(|root| root.parse().ok())
                .ok_or_else(invalid)?;
            shared
                .delegate(shared.node(node), &caller, count, level, root)
                .await?;
            Ok(format!("delegated {count}"))
        },
    );
    let report = load_tool(
        REPORT_TOOL,
        "Reports progress to the delegating parent.",
        json!({"type": "object"}),
        (slot, node),
        |shared, _, caller, node| async move {
            shared.report(shared.node(node), &caller).await?;
            Ok("reported".to_owned())
        },
    );
    Runtime::builder()
        .shared_store(Arc::clone(store))
        .model("load", LoadModel::new(scenario.latency, scenario.seed))
        .tool(delegate)
        .tool(report)
        .workers(workers)
}

/// Joins `store`'s cluster as a new node named `name`.
async fn join(
    store: &Arc<crate::store::PostgresStore>,
    name: &str,
) -> Result<(crate::store::LeaseHolder, crate::store::NodeMembership)> {
    let holder = crate::store::LeaseHolder::new();
    let membership = store.join(&holder, name).await?;
    Ok((holder, membership))
}

/// Grows, drains and verifies the forest on the run's runtime.
async fn grow(
    shared: &Arc<Shared>,
    scenario: &Scenario,
    opened: &RunStore,
    floors: super::report::Floors,
    rss_before: u64,
) -> Result<(LoadReport, Option<PendingReopen>)> {
    let rt = &shared.rt;
    let lifecycle = &shared.lifecycle;

    let flush = match scenario.flush {
        LoadFlush::OnRequest => FlushPolicy::OnRequest,
        LoadFlush::EveryStep => FlushPolicy::EveryStep,
    };
    let mut roots = Vec::new();
    for _ in 0..scenario.roots {
        let root = rt
            .agents()
            .create(CreateAgent::new().options(AgentOptions {
                flush,
                resident_events: std::num::NonZeroU32::new(scenario.resident_events),
                ..AgentOptions::default()
            }))
            .await?;
        roots.push(root);
    }
    let began = Instant::now();
    // A run that fails on the way drops its sampler, which stops it.
    let sampler = Sampler::start(Arc::clone(&shared.counters), began);
    let outcomes = join_all(roots.iter().map(|root| shared.root(root.agent()))).await;
    // A continuable child settles only after every child it delegated settled, so once the
    // roots' tasks are done the whole forest exists.
    let elapsed = began.elapsed();
    let peak_rss = peak_rss_bytes();
    outcomes.into_iter().collect::<Result<Vec<()>>>()?;
    if let Some(failure) = lock(&shared.failure).take() {
        return Err(failure);
    }
    let root_ids: Vec<SessionId> = roots.iter().map(|root| root.agent().id()).collect();
    // Taken, not copied: at a million children each record is held once.
    let created = std::mem::take(&mut *lock(&shared.created));
    let accepted = std::mem::take(&mut *lock(&shared.accepted));
    // Listed for the reopening check (the same forest after it), and timed on its own: at a
    // million children the listing takes seconds, the drain that follows milliseconds.
    let listing_began = Instant::now();
    // Only the listing's shape is kept through the drain, not a million listed entries.
    let listed_before = super::verify::shape(&super::verify::list_forest(rt, &root_ids).await?);
    let listing = listing_began.elapsed();
    let drain_began = Instant::now();
    let shutdown = shut_down(shared).await;
    let drain = drain_began.elapsed();
    // Sampled through the drain too: the plot shows what releasing the forest costs.
    let timeline = sampler.finish().await;
    // A root's handle keeps its log's events readable, and a root that heard a million settled
    // notices has millions: the verification reads them back from the store instead.
    drop(roots);
    let verified = verify(
        rt,
        &shared.peers,
        &lifecycle_runs(lifecycle),
        &created,
        &accepted,
        &root_ids,
        // An interrupted run has the size it grew to.
        if shared.stop.is_cancelled() {
            None
        } else {
            scenario.total_children()
        },
        shared.reports.load(Ordering::Relaxed),
        listed_before,
        shutdown,
        opened.reopen.as_ref(),
    )
    .await;
    let reopen = verified.listed.map(|pairs| PendingReopen {
        roots: root_ids,
        pairs,
    });
    let report = LoadReport::new(super::report::Measured {
        scenario: scenario.clone(),
        stopped_early: shared.stop.is_cancelled(),
        elapsed,
        listing,
        drain,
        created: &created,
        accepted: accepted.len(),
        refused: shared.refused.load(Ordering::Relaxed),
        reports: shared.reports.load(Ordering::Relaxed),
        interrupted: shared.interrupted.load(Ordering::Relaxed),
        one_shot: shared.one_shot_latency.summary(),
        start: shared.start_latency.summary(),
        followup: shared.followup_latency.summary(),
        followup_settled: shared.followup_settle_latency.summary(),
        cross_node: shared.cross_node_latency.summary(),
        peak_rss,
        rss_before,
        peak_live: lifecycle.peak.load(Ordering::Relaxed),
        floors,
        checks: verified.checks,
        persisted: verified.persisted,
        followup_turn_start: verified.followup_to_turn_start,
        timeline,
    });
    Ok((report, reopen))
}

/// What the reopening of a closed sled store checks: the forest listed before the drain.
struct PendingReopen {
    roots: Vec<SessionId>,
    pairs: std::collections::HashSet<(SessionId, SessionId)>,
}

fn lifecycle_runs(lifecycle: &Lifecycle) -> FastHashMap<RunId, (u32, u32)> {
    lock(&lifecycle.runs).clone()
}
