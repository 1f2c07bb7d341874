//! Provides [`World`], the driver of one schedule: a runtime over a fault-injecting store, two
//! root agents, and each operation carried out through the public API with its answer written
//! into the [`SharedBook`]. Foreground operations are awaited (each within a deadline);
//! background ones run on and race what follows.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::book::SharedBook;
use super::calls::{text, yields, Ctx};
use super::model::CheckModel;
use super::schedule::{Authority, Op, Pick, Sender};
use crate::actors::agent::AgentRef;
use crate::error::{ErrorCode, Result};
use crate::events::Subscription;
use crate::host::{AgentHandle, AgentOptions, CreateAgent, ResumeAgent};
use crate::ids::SessionId;
use crate::runtime::Runtime;
use crate::seam::{InterruptAuthority, ReportDelivery, ReportOptions};
use crate::store::{MemoryStore, SharedStore, SledStore};
use crate::testing::{FaultInjectingStore, StoreOperation};

/// How long one awaited operation, a drain or a shutdown may take before it counts as hung.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// The deepest a child is started (roots are at 0).
const MAX_DEPTH: u8 = 3;

/// The store a schedule runs on.
pub enum Backing {
    /// In memory: the same store across a reopen.
    Memory(Arc<MemoryStore>),
    /// A sled directory, closed and opened again across a reopen; the last store opened on it,
    /// watched so that it is opened again only once nothing holds it.
    Sled(tempfile::TempDir, std::sync::Weak<SledStore>),
}

impl Backing {
    /// Opens the store (again). A sled directory is opened once the last store on it is let
    /// go of: an answer of `false` means it was still held (by something a shutdown left
    /// behind) after the deadline.
    async fn open(&mut self) -> Result<(SharedStore, bool)> {
        match self {
            Self::Memory(store) => Ok((Arc::clone(store) as SharedStore, true)),
            Self::Sled(dir, last) => {
                let began = std::time::Instant::now();
                while last.strong_count() > 0 && began.elapsed() < DEADLINE {
                    tokio::task::yield_now().await;
                    if last.strong_count() > 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                let released = last.strong_count() == 0;
                let store = Arc::new(SledStore::open(dir.path())?);
                *last = Arc::downgrade(&store);
                Ok((store, released))
            }
        }
    }
}

/// A root agent of the schedule: its current handle while live, and the references of its
/// disposed incarnations (stale senders).
struct Root {
    id: SessionId,
    handle: Option<AgentHandle>,
    stale: Vec<AgentRef>,
}

/// A store fault in force for a number of operations.
struct ActiveFault {
    operation: StoreOperation,
    hold: bool,
    ops_left: u8,
}

/// The driver of one schedule.
pub(crate) struct World {
    ctx: Ctx,
    backing: Backing,
    faults: Arc<FaultInjectingStore>,
    _listening: [Subscription; 2],
    roots: Vec<Root>,
    background: Vec<tokio::task::JoinHandle<()>>,
    active: Vec<ActiveFault>,
    /// The events the roots' logs had paged out of memory when their handles went.
    paged_out: u64,
}

/// A runtime over `store` behind a fault injector, with the in-process providers.
async fn open_runtime(
    store: SharedStore,
    model: &CheckModel,
    workers: usize,
) -> Result<(Runtime, Arc<FaultInjectingStore>)> {
    let faults = Arc::new(FaultInjectingStore::new(store));
    let rt = Runtime::builder()
        .shared_store(Arc::clone(&faults) as SharedStore)
        .model("check", model.clone())
        .workers(workers)
        .build()?;
    rt.subagents().register_in_process_providers().await?;
    Ok((rt, faults))
}

impl World {
    /// A world on `backing` with `roots` root agents.
    pub(crate) async fn open(
        backing: Backing,
        model: CheckModel,
        book: SharedBook,
        (roots, workers): (usize, usize),
        root_options: AgentOptions,
    ) -> Result<Self> {
        let mut backing = backing;
        let (store, _) = backing.open().await?;
        let (rt, faults) = open_runtime(store, &model, workers).await?;
        let listening = book.listen(&rt);
        let mut made = Vec::with_capacity(roots);
        for _ in 0..roots {
            let handle = rt
                .agents()
                .create(CreateAgent::new().options(root_options.clone()))
                .await?;
            made.push(Root {
                id: handle.agent().id(),
                handle: Some(handle),
                stale: Vec::new(),
            });
        }
        Ok(Self {
            ctx: Ctx {
                rt,
                book,
                model,
                root_options,
                workers,
            },
            backing,
            faults,
            _listening: listening,
            roots: made,
            background: Vec::new(),
            active: Vec::new(),
            paged_out: 0,
        })
    }

    pub(crate) fn root_ids(&self) -> Vec<SessionId> {
        self.roots.iter().map(|root| root.id).collect()
    }

    /// The node `pick` names (roots first, then children): its id, and for a child its
    /// parent and depth.
    fn node(&self, pick: Pick) -> Option<(SessionId, Option<SessionId>, u8)> {
        let children = self.ctx.book.lock().children.clone();
        let index = pick.among(self.roots.len() + children.len())?;
        Some(match index.checked_sub(self.roots.len()) {
            None => (self.roots[index].id, None, 0),
            Some(child) => {
                let child = children[child];
                (child.id, Some(child.parent), child.depth)
            }
        })
    }

    /// The child `pick` names.
    fn child(&self, pick: Pick) -> Option<crate::check::book::Child> {
        let children = self.ctx.book.lock().children.clone();
        pick.among(children.len()).map(|index| children[index])
    }

    /// The live agent of session `id`: a root's current incarnation, or a resident child.
    async fn live(&self, id: SessionId) -> Option<AgentRef> {
        match self.roots.iter().find(|root| root.id == id) {
            Some(root) => root.handle.as_ref().map(|handle| handle.agent().clone()),
            None => self.ctx.rt.agents().get(id).await,
        }
    }

    /// The live agent of the node `pick` names and its depth, when a child may be started
    /// below it.
    async fn delegating(&self, pick: Pick) -> Option<(AgentRef, u8)> {
        let (id, _, depth) = self.node(pick)?;
        let agent = self.live(id).await.filter(|_| depth < MAX_DEPTH)?;
        Some((agent, depth))
    }

    /// The root above session `id`.
    fn root_of(&self, mut id: SessionId) -> Option<SessionId> {
        let children = self.ctx.book.lock().children.clone();
        for _ in 0..=MAX_DEPTH {
            if self.roots.iter().any(|root| root.id == id) {
                return Some(id);
            }
            id = children.iter().find(|child| child.id == id)?.parent;
        }
        None
    }

    /// Whether `id` lies strictly below `ancestor`.
    fn descends(&self, mut id: SessionId, ancestor: SessionId) -> bool {
        let children = self.ctx.book.lock().children.clone();
        while let Some(child) = children.iter().find(|child| child.id == id) {
            if child.parent == ancestor {
                return true;
            }
            id = child.parent;
        }
        false
    }

    /// Whether a store operation is held now.
    fn holding(&self) -> bool {
        self.active.iter().any(|fault| fault.hold)
    }

    /// Runs `future` now (within the deadline) or, in the background, on its own.
    async fn run(
        &mut self,
        background: bool,
        what: &str,
        future: impl Future<Output = ()> + Send + 'static,
    ) {
        // While a store operation is held, anything may wait for it: nothing blocks the driver.
        if background || self.holding() {
            self.background.push(tokio::spawn(future));
        } else if tokio::time::timeout(DEADLINE, future).await.is_err() {
            self.ctx
                .book
                .lock()
                .anomaly("hang", format!("{what} did not answer within {DEADLINE:?}"));
        }
    }

    /// Carries out one operation.
    pub(crate) async fn apply(&mut self, op: &Op) -> Result<()> {
        tracing::debug!(target: "subagents::check", %op, "operation");
        if matches!(
            op,
            Op::Drain { .. } | Op::DisposeRoot { .. } | Op::ResumeRoot { .. } | Op::Reopen { .. }
        ) {
            // The driver awaits these: a held store operation would wait for the driver itself.
            self.lift_holds();
        }
        match *op {
            Op::Start {
                parent,
                fork,
                hold,
                budget,
                let_go,
                background,
            } => {
                let Some((agent, depth)) = self.delegating(parent).await else {
                    return Ok(());
                };
                let started = self.ctx.clone().start(
                    agent,
                    depth + 1,
                    fork,
                    self.ctx.prompt("work", hold),
                    budget,
                    let_go,
                );
                self.run(background, "a start", started).await;
            }
            Op::OneShot {
                parent,
                fork,
                hold,
                let_go,
                background,
            } => {
                let Some((agent, _)) = self.delegating(parent).await else {
                    return Ok(());
                };
                let prompt = self.ctx.prompt("work", hold);
                let run = self.ctx.clone().one_shot(agent, fork, prompt, let_go);
                // A held turn's result waits for a `release`: the driver does not.
                self.run(background || hold, "a one-shot run", run).await;
            }
            Op::Followup {
                child,
                burst,
                hold,
                raise,
                sender,
                let_go,
                background,
            } => {
                let Some(child) = self.child(child) else {
                    return Ok(());
                };
                let (agent, entitled) = match sender {
                    Sender::Parent => (self.live(child.parent).await, true),
                    Sender::StaleParent => (
                        self.roots
                            .iter()
                            .find(|root| root.id == child.parent)
                            .and_then(|root| root.stale.last().cloned()),
                        false,
                    ),
                    Sender::Stranger => (self.stranger_to(child.id), false),
                };
                let Some(agent) = agent else {
                    return Ok(());
                };
                // While a store operation is held, the driver waits for nothing (see `run`).
                let background = background || self.holding();
                let prompts = (0..burst)
                    .map(|index| self.ctx.prompt("more", hold && index == 0))
                    .collect();
                let sent = self.ctx.clone().followups(
                    agent,
                    child.id,
                    prompts,
                    raise,
                    let_go,
                    entitled,
                    !background,
                );
                self.run(background, "a follow-up", sent).await;
            }
            Op::Interrupt { child, authority } => self.interrupt(child, authority).await,
            Op::Report { child, quiet } => {
                let Some(child) = self.child(child) else {
                    return Ok(());
                };
                let Some(agent) = self.ctx.rt.agents().get(child.id).await else {
                    return Ok(());
                };
                let delivery = if quiet {
                    ReportDelivery::Quiet
                } else {
                    ReportDelivery::Wakeup
                };
                let ctx = self.ctx.clone();
                let reported = async move {
                    let report = ctx.rt.subagents().report_from(
                        &agent,
                        text("progress".to_owned()),
                        ReportOptions::new(delivery),
                    );
                    if let Err(error) = report.await {
                        ctx.refused("a report", &error);
                    }
                };
                self.run(false, "a report", reported).await;
            }
            Op::Release { gate } => {
                if let Some(gate) = gate.among(self.ctx.model.gate_count()) {
                    self.ctx.model.release(gate);
                }
            }
            Op::Drain { node } => self.drain(node).await,
            Op::DisposeRoot { root } => {
                let Some(index) = root.among(self.roots.len()) else {
                    return Ok(());
                };
                if let Some(handle) = self.roots[index].handle.take() {
                    self.paged_out += handle.agent().log().first_resident();
                    let agent = handle.agent().clone();
                    match tokio::time::timeout(DEADLINE, handle.dispose()).await {
                        Err(_) => self
                            .ctx
                            .book
                            .lock()
                            .anomaly("hang", "a root's disposal did not finish"),
                        Ok(Err(error)) => self.ctx.refused("a root's disposal", &error),
                        Ok(Ok(())) => {}
                    }
                    self.roots[index].stale.push(agent);
                }
            }
            Op::ResumeRoot { root, racers } => self.resume_root(root, racers).await,
            Op::Fault {
                operation,
                hold,
                ops,
            } => {
                self.ctx.book.lock().faults_seen = true;
                if hold {
                    self.faults.hold(operation);
                } else {
                    self.faults.arm(operation);
                }
                self.active.push(ActiveFault {
                    operation,
                    hold,
                    ops_left: ops,
                });
                return Ok(());
            }
            Op::Pause { yields: count } => {
                yields(count).await;
                if count > 30 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Op::Reopen { abrupt } => self.reopen(abrupt).await?,
        }
        self.tick_faults();
        Ok(())
    }

    /// A live root other than `child`'s own.
    fn stranger_to(&self, child: SessionId) -> Option<AgentRef> {
        let own = self.root_of(child);
        self.roots
            .iter()
            .filter(|root| Some(root.id) != own)
            .find_map(|root| root.handle.as_ref().map(|handle| handle.agent().clone()))
    }

    async fn interrupt(&mut self, child: Pick, authority: Authority) {
        let Some(child) = self.child(child) else {
            return;
        };
        let (asked, entitled) = match authority {
            Authority::Parent => (
                InterruptAuthority::User {
                    parent_session_id: child.parent,
                },
                true,
            ),
            Authority::WrongParent => (
                InterruptAuthority::User {
                    parent_session_id: SessionId::new(),
                },
                false,
            ),
            Authority::Ancestor => {
                let root = self.root_of(child.id);
                let Some(agent) = self
                    .roots
                    .iter()
                    .find(|candidate| Some(candidate.id) == root)
                    .and_then(|root| root.handle.as_ref())
                    .map(|handle| handle.agent().clone())
                else {
                    return;
                };
                (InterruptAuthority::Ancestor(agent), true)
            }
            Authority::Stranger => {
                let Some(agent) = self.stranger_to(child.id) else {
                    return;
                };
                (InterruptAuthority::Ancestor(agent), false)
            }
        };
        let ctx = self.ctx.clone();
        let id = child.id;
        let interrupted = async move {
            match ctx.rt.subagents().interrupt(id, asked).await {
                Ok(()) if !entitled => ctx.book.lock().anomaly(
                    "authority",
                    format!("an interrupt of {id} without its authority was accepted"),
                ),
                Ok(()) => {}
                Err(error) if entitled => ctx.refused("an authorized interrupt", &error),
                Err(error) if error.code() == ErrorCode::Unauthorized => {}
                Err(error) => ctx.refused("an unauthorized interrupt", &error),
            }
        };
        self.run(false, "an interrupt", interrupted).await;
    }

    async fn drain(&mut self, node: Pick) {
        let Some((id, _, _)) = self.node(node) else {
            return;
        };
        let Some(agent) = self.live(id).await else {
            return;
        };
        let drain = self
            .ctx
            .rt
            .subagents()
            .drain_continuable_descendants(std::slice::from_ref(&agent));
        match tokio::time::timeout(DEADLINE, drain).await {
            Err(_) => {
                self.ctx
                    .book
                    .lock()
                    .anomaly("hang", format!("a drain below {id} did not finish"));
                return;
            }
            Ok(Err(error)) => self.ctx.refused("a drain", &error),
            Ok(Ok(())) => {}
        }
        // Nothing below the drained node is live: its cutoff stands while the node lives. A
        // node gone by then (a child settling while the drain was asked) closed nothing: a drain
        // of a parent that is no longer live is no drain (CONT-40), and what was on its way
        // below it (a follow-up admitted before it went, resuming its child) is refused at its
        // install and disposed; the end of the schedule checks that nothing is left.
        if !agent.is_alive() {
            return;
        }
        let children = self.ctx.book.lock().children.clone();
        for child in children {
            if self.descends(child.id, id) && self.ctx.rt.agents().get(child.id).await.is_some() {
                self.ctx.book.lock().anomaly(
                    "live-after-drain",
                    format!("{} is live after the drain below {id}", child.id),
                );
            }
        }
    }

    async fn resume_root(&mut self, root: Pick, racers: u8) {
        let Some(index) = root.among(self.roots.len()) else {
            return;
        };
        if self.roots[index].handle.is_some() {
            return;
        }
        let id = self.roots[index].id;
        let resumes = (0..racers.max(1)).map(|_| {
            self.ctx
                .rt
                .agents()
                .resume(ResumeAgent::new(id).options(self.ctx.root_options.clone()))
        });
        let outcomes = match tokio::time::timeout(DEADLINE, join_all(resumes)).await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                self.ctx
                    .book
                    .lock()
                    .anomaly("hang", format!("resuming root {id} did not finish"));
                return;
            }
        };
        let mut winners = Vec::new();
        for outcome in outcomes {
            match outcome {
                Ok(handle) => winners.push(handle),
                Err(error) => self.ctx.refused("a racing resume", &error),
            }
        }
        if winners.len() > 1 {
            self.ctx.book.lock().anomaly(
                "resume-race",
                format!("{} concurrent resumes of {id} all won", winners.len()),
            );
        }
        let faults = self.ctx.book.lock().faults_seen;
        if winners.is_empty() && !faults {
            self.ctx
                .book
                .lock()
                .anomaly("resume-race", format!("no resume of {id} won"));
        }
        self.roots[index].handle = winners.into_iter().next();
    }

    /// Counts one operation against every fault in force, lifting those that are over.
    fn tick_faults(&mut self) {
        for fault in &mut self.active {
            fault.ops_left = fault.ops_left.saturating_sub(1);
        }
        let faults = Arc::clone(&self.faults);
        self.active.retain(|fault| {
            let over = fault.ops_left == 0;
            if over {
                lift(&faults, fault);
            }
            !over
        });
    }

    /// Ends every hold in force (faults that fail stay).
    fn lift_holds(&mut self) {
        let faults = Arc::clone(&self.faults);
        self.active.retain(|fault| {
            if fault.hold {
                lift(&faults, fault);
            }
            !fault.hold
        });
    }

    /// Lifts every fault, releases every held turn, waits for the background operations, and
    /// checks that nothing they made is left behind.
    pub(crate) async fn settle(&mut self) {
        for fault in std::mem::take(&mut self.active) {
            lift(&self.faults, &fault);
        }
        self.ctx.model.release_all();
        for task in std::mem::take(&mut self.background) {
            if tokio::time::timeout(DEADLINE, task).await.is_err() {
                self.ctx
                    .book
                    .lock()
                    .anomaly("hang", "a background operation never answered");
            }
        }
        self.nothing_left_behind().await;
    }

    /// Once every operation is over, the live agents are the live roots and the resident
    /// continuable children: no one-shot run, answered, refused or let go of, keeps its
    /// child, and no refused start leaves one. A disposal may run on after the call that
    /// asked for it and announces nothing, so what is left is looked at again until the
    /// deadline.
    async fn nothing_left_behind(&self) {
        let began = std::time::Instant::now();
        loop {
            let left = self.left_behind().await;
            if left.is_empty() {
                return;
            }
            if began.elapsed() > DEADLINE {
                let one_shots = {
                    let book = self.ctx.book.lock();
                    left.iter().filter(|id| book.one_shots.contains(id)).count()
                };
                self.ctx.book.lock().anomaly(
                    "left-behind",
                    format!(
                        "{} agents ({one_shots} of them answered one-shot children) are neither a live root nor a resident continuable child: {left:?}",
                        left.len()
                    ),
                );
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The live agents that are neither a live root nor a resident continuable child.
    async fn left_behind(&self) -> Vec<SessionId> {
        let resident: std::collections::BTreeSet<SessionId> = self
            .ctx
            .rt
            .subagents()
            .resident_ids()
            .await
            .into_iter()
            .collect();
        self.ctx
            .rt
            .agents()
            .list()
            .await
            .iter()
            .map(AgentRef::id)
            .filter(|id| {
                !resident.contains(id)
                    && !self
                        .roots
                        .iter()
                        .any(|root| root.id == *id && root.handle.is_some())
            })
            .collect()
    }

    /// Settles the schedule, then shuts the runtime down (within the deadline) and checks
    /// that nothing is left live.
    pub(crate) async fn shut_down(&mut self) {
        self.settle().await;
        self.stop().await;
    }

    /// Shuts the runtime down with the schedule's operations in flight and its turns held
    /// (only a held store operation is let go: a shutdown waits for the store), checks that
    /// nothing is left live, then that every operation in flight answered within the deadline.
    async fn shut_down_abruptly(&mut self) {
        for fault in std::mem::take(&mut self.active) {
            lift(&self.faults, &fault);
        }
        self.stop().await;
        self.settle().await;
    }

    /// Shuts the runtime down (within the deadline) and checks that nothing is left live.
    async fn stop(&mut self) {
        match tokio::time::timeout(DEADLINE, self.ctx.rt.shutdown()).await {
            Err(_) => self
                .ctx
                .book
                .lock()
                .anomaly("hang", "shutdown did not finish"),
            Ok(Err(error)) => self.ctx.refused("shutdown", &error),
            Ok(Ok(())) => {}
        }
        let live = self.ctx.rt.agents().list().await.len();
        let resident = crate::testing::resident_count(self.ctx.rt.subagents()).await;
        let nodes = crate::testing::owner_node_count(self.ctx.rt.subagents()).await;
        if live + resident + nodes > 0 {
            self.ctx.book.lock().anomaly(
                "live-after-shutdown",
                format!("{live} agents, {resident} Activations and {nodes} ownership nodes after shutdown"),
            );
        }
        for root in &mut self.roots {
            if let Some(handle) = root.handle.take() {
                self.paged_out += handle.agent().log().first_resident();
                root.stale.push(handle.agent().clone());
            }
        }
    }

    /// Shuts down (`abrupt`: with operations in flight), opens a new runtime on the same store,
    /// and resumes the roots that were live.
    async fn reopen(&mut self, abrupt: bool) -> Result<()> {
        let live: Vec<bool> = self
            .roots
            .iter()
            .map(|root| root.handle.is_some())
            .collect();
        if abrupt {
            self.shut_down_abruptly().await;
        } else {
            self.shut_down().await;
        }
        // Nothing of the old runtime may keep its store open: its references, its fault
        // injector and the runtime itself go before the store is opened again.
        for root in &mut self.roots {
            root.stale.clear();
        }
        self.faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
        drop(std::mem::replace(
            &mut self.ctx.rt,
            Runtime::builder().build()?,
        ));
        let (store, released) = self.backing.open().await?;
        if !released {
            self.ctx.book.lock().anomaly(
                "left-behind",
                "the store was still held a deadline after the runtime was shut down and dropped",
            );
        }
        let (rt, faults) = open_runtime(store, &self.ctx.model, self.ctx.workers).await?;
        self._listening = self.ctx.book.listen(&rt);
        self.ctx.rt = rt;
        self.faults = faults;
        for (root, was_live) in self.roots.iter_mut().zip(live) {
            if was_live {
                root.handle = Some(
                    self.ctx
                        .rt
                        .agents()
                        .resume(ResumeAgent::new(root.id).options(self.ctx.root_options.clone()))
                        .await?,
                );
            }
        }
        Ok(())
    }

    /// Closes the world: its runtime is shut down and dropped, so the store can be opened
    /// again to read. Answers the store's backing and the events the roots paged out.
    pub(crate) async fn close(mut self) -> (Backing, u64) {
        self.shut_down().await;
        self.roots.clear();
        (self.backing, self.paged_out)
    }
}

fn lift(faults: &FaultInjectingStore, fault: &ActiveFault) {
    if fault.hold {
        faults.release(fault.operation);
    } else {
        faults.disarm(fault.operation);
    }
}

/// Reads back `backing` with a fresh runtime (no faults), for the checks; `false` when the
/// closed runtime still held the store a deadline after it was dropped.
pub(crate) async fn reader(backing: &mut Backing) -> Result<(Runtime, SharedStore, bool)> {
    let (store, released) = backing.open().await?;
    let rt = Runtime::builder()
        .shared_store(Arc::clone(&store))
        .build()?;
    Ok((rt, store, released))
}

/// Whether `store` holds session `id`.
pub(crate) async fn stored(store: &SharedStore, id: SessionId) -> Result<bool> {
    match store.header(id).await {
        Ok(_) => Ok(true),
        Err(error) if error.code() == ErrorCode::SessionNotFound => Ok(false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::book::SharedBook;

    // An agent that is neither a live root nor a resident continuable child is left behind
    // (a one-shot child its run never disposed, say); once disposed, it is not.
    #[actix_rt::test]
    async fn an_agent_outside_the_forest_is_left_behind() {
        let world = World::open(
            Backing::Memory(Arc::new(MemoryStore::new())),
            CheckModel::new(1, Duration::ZERO),
            SharedBook::default(),
            (2, 1),
            AgentOptions::default(),
        )
        .await
        .unwrap();
        assert!(world.left_behind().await.is_empty(), "the roots alone");
        let stray = world
            .ctx
            .rt
            .agents()
            .create(CreateAgent::new())
            .await
            .unwrap();
        assert_eq!(world.left_behind().await, [stray.agent().id()]);
        stray.dispose().await.unwrap();
        assert!(world.left_behind().await.is_empty());
        let (_, _) = world.close().await;
    }
}
