//! Provides [`AgentRegistry`] (the actor that knows every live agent by session id, with exact
//! identity), the [`Agents`] handle that runs the create and resume transactions, and
//! [`AgentHandle`], whose idempotent `dispose` releases an agent.
//!
//! # The creation transaction
//! 1. Check the creation-abort token; build and validate the header and seed; stage the log.
//! 2. Run the setup step on a fresh scope (it may append setup events).
//! 3. Check the token again, reserve the id in the registry (`DUPLICATE_AGENT` if live), store
//!    the session (`SESSION_EXISTS` if stored).
//! 4. Run the setup's commit, start the actor, attach write-behind, emit `agent/created`.
//!
//! A failure or a fired token at any step before 4 rolls everything back: no actor runs, the
//! registry and the store hold nothing, and no event fires. Resume is the same transaction over
//! a log loaded (and crash-repaired) by [`crate::SessionPersistence::prepare`].
//!
//! # Disposal order
//! `dispose` = one `Retire` message (refuse new sends, cancel a running turn with cause
//! `disposed` and wait for it to close, discard pending work, unwind the scope, stop the actor)
//! → drain the log into the store and detach it → unregister (`agent/disposed`). The drain comes before the unregistration
//! (upstream drains after it) so that the id stays reserved until the store holds the whole
//! log: a resume can never load a store that lacks this log's tail.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::{AgentActor, AgentRef, Retire};
use crate::agent::{
    AgentEnv, AgentEvent, AgentEventKind, AgentOptions, AgentScope, AgentSetup, Inbox,
};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader, SessionLog, SessionOrigin};

/// One id's entry: reserved by a creation in progress, or held by a live agent.
enum Slot {
    Reserved(u64),
    Live(AgentRef),
}

/// The registry of live agents.
pub struct AgentRegistry {
    slots: HashMap<SessionId, Slot>,
    /// Set by shutdown: new reservations are refused.
    closing: bool,
    /// Shutdown waits here until no creation is in progress.
    settled: Vec<tokio::sync::oneshot::Sender<()>>,
    events: Arc<EventBus<AgentEvent>>,
}

impl Actor for AgentRegistry {
    type Context = Context<Self>;
}

impl AgentRegistry {
    fn new(events: Arc<EventBus<AgentEvent>>) -> Self {
        Self {
            slots: HashMap::new(),
            closing: false,
            settled: Vec::new(),
            events,
        }
    }

    fn reserved(&self) -> usize {
        self.slots
            .values()
            .filter(|slot| matches!(slot, Slot::Reserved(_)))
            .count()
    }

    fn notify_if_settled(&mut self) {
        if self.reserved() == 0 {
            for waiter in self.settled.drain(..) {
                // A waiter that stopped listening needs no answer.
                let _ = waiter.send(());
            }
        }
    }

    fn reserve(&mut self, id: SessionId, incarnation: u64) -> Result<()> {
        if self.closing {
            return Err(SubagentError::new(
                ErrorCode::Draining,
                "the runtime is shutting down: no agent can be created",
            ));
        }
        if self.slots.contains_key(&id) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateAgent,
                format!("agent {id} is already live"),
            ));
        }
        self.slots.insert(id, Slot::Reserved(incarnation));
        Ok(())
    }

    fn publish(&mut self, agent: AgentRef) {
        if let Some(slot) = self.slots.get_mut(&agent.id()) {
            if matches!(slot, Slot::Reserved(incarnation) if *incarnation == agent.incarnation()) {
                *slot = Slot::Live(agent);
            }
        }
        self.notify_if_settled();
    }

    /// Frees the id if its entry is exactly this incarnation (reserved or live).
    fn release(&mut self, id: SessionId, incarnation: u64) -> bool {
        let exact = match self.slots.get(&id) {
            Some(Slot::Reserved(reserved)) => *reserved == incarnation,
            Some(Slot::Live(agent)) => agent.incarnation() == incarnation,
            None => false,
        };
        if exact {
            // `agent/disposed` goes out here, in registry order, so it always precedes the
            // `agent/created` of a later incarnation of the same id.
            if let Some(Slot::Live(_)) = self.slots.remove(&id) {
                self.events.emit(&AgentEvent {
                    agent: id,
                    kind: AgentEventKind::Disposed,
                });
            }
            self.notify_if_settled();
        }
        exact
    }

    fn live(&self, id: SessionId) -> Option<AgentRef> {
        match self.slots.get(&id) {
            Some(Slot::Live(agent)) => Some(agent.clone()),
            _ => None,
        }
    }
}

/// Reserves an id for a creation in progress; replies `DUPLICATE_AGENT` when the id is live or
/// reserved.
#[derive(Message)]
#[rtype(result = "Result<()>")]
struct Reserve {
    id: SessionId,
    incarnation: u64,
}

impl Handler<Reserve> for AgentRegistry {
    type Result = Result<()>;

    fn handle(&mut self, msg: Reserve, _: &mut Context<Self>) -> Self::Result {
        self.reserve(msg.id, msg.incarnation)
    }
}

/// Makes a reserved id live. Sent with `do_send` right after the agent starts: a lookup sent
/// later by the same task is handled after it.
#[derive(Message)]
#[rtype(result = "()")]
struct Publish(AgentRef);

impl Handler<Publish> for AgentRegistry {
    type Result = ();

    fn handle(&mut self, msg: Publish, _: &mut Context<Self>) {
        self.publish(msg.0);
    }
}

/// Frees an id if its entry is exactly this incarnation; replies whether it did.
#[derive(Message)]
#[rtype(result = "bool")]
struct Release {
    id: SessionId,
    incarnation: u64,
}

impl Handler<Release> for AgentRegistry {
    type Result = bool;

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) -> bool {
        self.release(msg.id, msg.incarnation)
    }
}

/// Whether an id is live or reserved by a creation in progress.
#[derive(Message)]
#[rtype(result = "bool")]
struct IsTaken(SessionId);

impl Handler<IsTaken> for AgentRegistry {
    type Result = bool;

    fn handle(&mut self, msg: IsTaken, _: &mut Context<Self>) -> bool {
        self.slots.contains_key(&msg.0)
    }
}

/// Shutdown: refuses new reservations, and resolves once no creation is in progress.
#[derive(Message)]
#[rtype(result = "()")]
struct Close;

impl Handler<Close> for AgentRegistry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Close, _: &mut Context<Self>) -> Self::Result {
        self.closing = true;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.settled.push(sender);
        self.notify_if_settled();
        Box::pin(async move {
            // A dropped sender means the registry stopped: nothing is in progress any more.
            let _ = receiver.await;
        })
    }
}

/// Looks up the live agent of a session.
#[derive(Message)]
#[rtype(result = "Option<AgentRef>")]
struct Lookup(SessionId);

impl Handler<Lookup> for AgentRegistry {
    type Result = Option<AgentRef>;

    fn handle(&mut self, msg: Lookup, _: &mut Context<Self>) -> Self::Result {
        self.live(msg.0)
    }
}

/// Lists every live agent.
#[derive(Message)]
#[rtype(result = "Vec<AgentRef>")]
struct ListLive;

impl Handler<ListLive> for AgentRegistry {
    type Result = MessageResult<ListLive>;

    fn handle(&mut self, _: ListLive, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.slots
                .values()
                .filter_map(|slot| match slot {
                    Slot::Live(agent) => Some(agent.clone()),
                    Slot::Reserved(_) => None,
                })
                .collect(),
        )
    }
}

/// What to create: the session's identity and lineage, its seed, options and setup.
#[derive(Default)]
pub struct CreateAgent {
    id: Option<SessionId>,
    cwd: Option<PathBuf>,
    parent_session: Option<SessionId>,
    origin: Option<SessionOrigin>,
    delegation_depth: Option<u64>,
    seed: Vec<SessionEvent>,
    seed_length: Option<u64>,
    options: AgentOptions,
    setup: Option<Box<dyn AgentSetup>>,
    cancel: Option<CancellationToken>,
}

impl CreateAgent {
    /// A fresh root agent with default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this session id instead of a fresh one.
    #[must_use]
    pub fn id(mut self, id: SessionId) -> Self {
        self.id = Some(id);
        self
    }

    /// The working directory (absolute).
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Marks the session as delegated by `parent` at `depth`.
    #[must_use]
    pub fn delegated_by(mut self, parent: SessionId, depth: u64) -> Self {
        self.parent_session = Some(parent);
        self.origin = Some(SessionOrigin::Subagent);
        self.delegation_depth = Some(depth);
        self
    }

    /// Seeds the log; `inherited` is how many of the events count as inherited lineage
    /// (`seedLength`). A non-empty seed gets a `session/end-seed` marker.
    #[must_use]
    pub fn seed(mut self, seed: Vec<SessionEvent>, inherited: u64) -> Self {
        self.seed = seed;
        self.seed_length = (inherited > 0).then_some(inherited);
        self
    }

    /// The agent's model options.
    #[must_use]
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// The setup step (see [`AgentSetup`]).
    #[must_use]
    pub fn setup(mut self, setup: impl AgentSetup) -> Self {
        self.setup = Some(Box::new(setup));
        self
    }

    /// The creation-abort token: if it fires before publication, nothing is published.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
}

/// What to resume: a stored session, its options and setup.
pub struct ResumeAgent {
    id: SessionId,
    options: AgentOptions,
    setup: Option<Box<dyn AgentSetup>>,
    cancel: Option<CancellationToken>,
}

impl ResumeAgent {
    /// Resumes session `id` with default options.
    pub fn new(id: SessionId) -> Self {
        Self {
            id,
            options: AgentOptions::default(),
            setup: None,
            cancel: None,
        }
    }

    /// The agent's model options.
    #[must_use]
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// The setup step.
    #[must_use]
    pub fn setup(mut self, setup: impl AgentSetup) -> Self {
        self.setup = Some(Box::new(setup));
        self
    }

    /// The creation-abort token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
}

/// The agents service: creates, resumes and finds agents. Cheap to clone.
#[derive(Clone)]
pub struct Agents {
    registry: Addr<AgentRegistry>,
    env: Arc<AgentEnv>,
    incarnations: Arc<AtomicU64>,
    workers: Option<Arc<WorkerPool>>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents").finish_non_exhaustive()
    }
}

fn check_token(token: Option<&CancellationToken>) -> Result<()> {
    if token.is_some_and(CancellationToken::is_cancelled) {
        return Err(SubagentError::new(
            ErrorCode::Cancelled,
            "agent creation was cancelled before publication",
        ));
    }
    Ok(())
}

/// A staged agent: everything built, nothing published.
struct Staged {
    log: SessionLog,
    scope: AgentScope,
    options: AgentOptions,
    setup: Option<Box<dyn AgentSetup>>,
    cancel: Option<CancellationToken>,
    /// Events already in the store (a resumed log); `None` for a new session.
    stored_len: Option<u64>,
}

impl Agents {
    pub(crate) fn start(env: Arc<AgentEnv>, workers: Option<Arc<WorkerPool>>) -> Self {
        Self {
            registry: AgentRegistry::new(Arc::clone(&env.events)).start(),
            env,
            incarnations: Arc::new(AtomicU64::new(1)),
            workers,
        }
    }

    /// The environment every agent shares.
    pub fn env(&self) -> &Arc<AgentEnv> {
        &self.env
    }

    /// Creates and publishes a new agent.
    ///
    /// # Errors
    /// `CANCELLED` (token fired before publication), `INVALID_HEADER`, `INVALID_SEED`,
    /// `DUPLICATE_AGENT`, `SESSION_EXISTS`, the setup's own error, or a store error. On any
    /// error nothing was published.
    ///
    /// # Cancel safety
    /// Not cancel safe after the store write: drop the future only through the token.
    pub async fn create(&self, request: CreateAgent) -> Result<AgentHandle> {
        check_token(request.cancel.as_ref())?;
        let mut header = SessionHeader::new(request.id.unwrap_or_default());
        header.cwd = request.cwd;
        header.parent_session = request.parent_session;
        header.origin = request.origin;
        header.delegation_depth = request.delegation_depth;
        header.seed_length = request.seed_length;
        let log = SessionLog::new(header, request.seed)?;
        self.publish(Staged {
            log,
            scope: AgentScope::new(Arc::clone(&self.env.tools)),
            options: request.options,
            setup: request.setup,
            cancel: request.cancel,
            stored_len: None,
        })
        .await
    }

    /// Loads a stored session (repairing an interrupted turn durably), replays its inbox and
    /// publishes it as a live agent. Turn numbering continues; pending work waits for a waking
    /// send.
    ///
    /// # Errors
    /// `PERSISTENCE_UNAVAILABLE`, `DUPLICATE_AGENT`, `SESSION_NOT_FOUND`, `STORE_CORRUPT`,
    /// `CANCELLED`, the setup's error. On any error nothing was published.
    ///
    /// # Cancel safety
    /// As [`Agents::create`].
    pub async fn resume(&self, request: ResumeAgent) -> Result<AgentHandle> {
        check_token(request.cancel.as_ref())?;
        let store = self.env.store.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "resume requires session persistence",
            )
        })?;
        if self
            .registry
            .send(IsTaken(request.id))
            .await
            .unwrap_or(false)
        {
            return Err(SubagentError::new(
                ErrorCode::DuplicateAgent,
                format!("agent {} is already live", request.id),
            ));
        }
        let stored = store.prepare(request.id).await?;
        let stored_len =
            u64::try_from(stored.events.len()).map_err(|_| SubagentError::bug("log too long"))?;
        let log = SessionLog::from_stored(stored.header, stored.events)?;
        self.publish(Staged {
            log,
            scope: AgentScope::new(Arc::clone(&self.env.tools)),
            options: request.options,
            setup: request.setup,
            cancel: request.cancel,
            stored_len: Some(stored_len),
        })
        .await
    }

    async fn publish(&self, staged: Staged) -> Result<AgentHandle> {
        let Staged {
            log,
            mut scope,
            options,
            setup,
            cancel,
            stored_len,
        } = staged;
        let outcome = async {
            let commit = match setup {
                Some(setup) => setup.run(&mut scope, &log).await?,
                None => None,
            };
            check_token(cancel.as_ref())?;
            let incarnation = self.incarnations.fetch_add(1, Ordering::Relaxed);
            // The token owns the creation until here; from the reservation on, creation
            // completes or fails on its own (and a dropped future releases the reservation).
            let id = log.id();
            self.registry.send(Reserve { id, incarnation }).await??;
            let reservation = Reservation {
                registry: self.registry.clone(),
                slot: Some((id, incarnation)),
            };
            if let Some(store) = &self.env.store {
                let next_seq = match stored_len {
                    Some(len) => len,
                    None => {
                        let initial = log.events();
                        let count = u64::try_from(initial.len())
                            .map_err(|_| SubagentError::bug("initial log too long"))?;
                        store.create(log.header(), initial).await?;
                        count
                    }
                };
                log.attach(Arc::clone(store), next_seq);
            }
            Ok((commit, incarnation, reservation))
        }
        .await;
        let (commit, incarnation, reservation) = match outcome {
            Ok(published) => published,
            // Dropping the unpublished scope unwinds what the setup registered on it.
            Err(error) => return Err(error),
        };
        if let Some(commit) = commit {
            commit();
        }
        let header = log.header();
        let id = header.id;
        let inbox = log.with_events(|events| {
            let own = usize::try_from(header.seed_len())
                .unwrap_or(usize::MAX)
                .min(events.len());
            Inbox::replay(&events[own..])
        });
        let disposers = scope.take_disposers();
        let actor = AgentActor::new(
            log.clone(),
            inbox,
            Arc::clone(&self.env),
            Arc::new(scope),
            options.clone(),
            disposers,
        );
        let addr = match &self.workers {
            Some(workers) => AgentActor::start_in_arbiter(&workers.next(), move |_| actor),
            None => actor.start(),
        };
        if !addr.connected() {
            // The worker arbiter has stopped (the system is shutting down): the actor never ran.
            log.detach();
            return Err(SubagentError::new(
                ErrorCode::AgentDisposed,
                format!("agent {id} could not start: its worker has stopped"),
            ));
        }
        let agent = AgentRef::new(id, incarnation, addr, log, Arc::new(options), self.clone());
        self.registry.do_send(Publish(agent.clone()));
        reservation.keep();
        tracing::debug!(session_id = %id, incarnation, "agent published");
        self.env.events.emit(&AgentEvent {
            agent: id,
            kind: AgentEventKind::Created,
        });
        Ok(AgentHandle {
            agent,
            shared: Arc::new(HandleShared {
                registry: self.registry.clone(),
                disposed: OnceCell::new(),
            }),
        })
    }

    /// Refuses new creations (`DRAINING`) and waits until none is in progress, so a following
    /// [`Agents::list`] sees every agent that will ever be live.
    pub(crate) async fn close(&self) {
        let _ = self.registry.send(Close).await;
    }

    /// Stops the worker threads (after every agent on them was released).
    pub(crate) fn stop_workers(&self) {
        if let Some(workers) = &self.workers {
            for arbiter in &workers.arbiters {
                arbiter.stop();
            }
        }
    }

    /// The live agent of session `id`, if any.
    pub async fn get(&self, id: SessionId) -> Option<AgentRef> {
        self.registry.send(Lookup(id)).await.ok().flatten()
    }

    /// Whether `agent` is exactly the live agent of its session (same incarnation).
    pub async fn is_live(&self, agent: &AgentRef) -> bool {
        self.get(agent.id()).await.as_ref() == Some(agent)
    }

    /// Every live agent.
    pub async fn list(&self) -> Vec<AgentRef> {
        self.registry.send(ListLive).await.unwrap_or_default()
    }
}

/// Releases a registry reservation unless the publication completed.
struct Reservation {
    registry: Addr<AgentRegistry>,
    slot: Option<(SessionId, u64)>,
}

impl Reservation {
    fn keep(mut self) {
        self.slot = None;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((id, incarnation)) = self.slot.take() {
            // The registry outlives every creation; a stopped registry has nothing to release.
            self.registry.do_send(Release { id, incarnation });
        }
    }
}

/// Arbiters agents are spread over, round-robin (see [`crate::RuntimeBuilder::workers`]).
pub(crate) struct WorkerPool {
    arbiters: Vec<actix::Arbiter>,
    next: std::sync::atomic::AtomicUsize,
}

impl WorkerPool {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            arbiters: (0..count).map(|_| actix::Arbiter::new()).collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn next(&self) -> actix::ArbiterHandle {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len().max(1);
        self.arbiters[index].handle()
    }
}

struct HandleShared {
    registry: Addr<AgentRegistry>,
    disposed: OnceCell<Result<()>>,
}

/// Owns a published agent. Clones share one disposal.
#[derive(Clone)]
pub struct AgentHandle {
    agent: AgentRef,
    shared: Arc<HandleShared>,
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("agent", &self.agent)
            .finish()
    }
}

impl AgentHandle {
    /// A handle for a live agent found in the registry (used by shutdown).
    pub(crate) fn adopt(agents: &Agents, agent: AgentRef) -> Self {
        Self {
            agent,
            shared: Arc::new(HandleShared {
                registry: agents.registry.clone(),
                disposed: OnceCell::new(),
            }),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &AgentRef {
        &self.agent
    }

    /// Releases the agent: cancel (cause `disposed`, pending work discarded) → idle → scope
    /// unwound and actor stopped → log drained into the store and detached → unregistered
    /// (`agent/disposed`). The drain hands every event to the store but does not force it to
    /// disk: a caller that needs durability calls [`crate::SessionLog::flush`] first.
    /// Idempotent: every call, concurrent or later, returns the first call's outcome.
    ///
    /// # Errors
    /// A store error from the final drain; the agent is released all the same.
    ///
    /// # Cancel safety
    /// A dropped call does not stop the disposal that another caller awaits; if no caller
    /// remains, the disposal stops at its next step and a later call resumes it.
    pub async fn dispose(&self) -> Result<()> {
        self.shared
            .disposed
            .get_or_init(|| self.release())
            .await
            .clone()
    }

    async fn release(&self) -> Result<()> {
        let agent = &self.agent;
        // One message does the first three steps: `Retire` refuses new work, cancels a running
        // turn (cause `disposed`) and waits for it to close, discards what is pending, unwinds
        // the scope and stops the actor. A stopped actor has nothing left to unwind.
        let _ = agent.addr().send(Retire).await;
        // Drain and detach before unregistering: until the id is free, no resume can load a
        // store that is missing this log's tail.
        let flushed = agent.log().drain().await;
        agent.log().detach();
        // The registry emits `agent/disposed` as it frees the id.
        let _ = self
            .shared
            .registry
            .send(Release {
                id: agent.id(),
                incarnation: agent.incarnation(),
            })
            .await;
        flushed
    }
}
