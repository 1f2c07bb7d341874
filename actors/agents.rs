//! Provides [`Agents`], the agents service: the create and resume transactions over the
//! `AgentRegistry` actor, and lookups by session id.
//!
//! # The creation transaction
//! 1. Check the creation-abort token; build and validate the header and seed; stage the log.
//!    (A resume first reserves the id in the registry, then takes the session's lease, then
//!    loads the log, repairing an interrupted turn durably under that lease. The reservation
//!    comes first so that a resume losing a race for the id never takes the lease: taking it
//!    would fence the winner's writer with a newer epoch.)
//! 2. Run the setup step on a fresh scope (it may append setup events).
//! 3. Check the token again; reserve the id in the registry with its owner edge
//!    (`DUPLICATE_AGENT` if taken, `AGENT_DISPOSED` if the owner is gone or retiring); store the
//!    session (`SESSION_EXISTS` if stored) and take its lease. An id this creation minted
//!    cannot be taken, so it skips the reservation: step 4 reserves and publishes it at once.
//! 4. Run the setup's commit, start the actor, attach write-behind under the lease, and publish
//!    (refused if the owner began retiring meanwhile, and for a minted id on any refusal of
//!    step 3); emit `agent/created`.
//!
//! A failure or a fired token at any step before publication rolls everything back: no actor
//! runs, the registry holds nothing, the lease is released, and no event fires (a new session's
//! initial records may stay in the store, unpublished). The transaction is drop-safe at every
//! await: a dropped future frees its reservation and lease, and an agent it already published is
//! disposed in the background.
//!
//! A delegated child's creation defers step 3's store write: the
//! child is published with nothing stored, and its writer stores the whole session (taking the
//! lease) once the creation commits — a continuable child with its first accepted message, a
//! one-shot child at its first entered step, with its descriptor. A creation refused or rolled
//! back before then, or cut short by a crash, leaves nothing in the store to be listed,
//! resumed or mistaken for a damaged child.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;

use crate::actors::agent::{AgentActor, AgentRef, Faulted, Published};
use crate::actors::registry::{
    AgentRegistry, Close, Exact, ListLive, Lookup, Publish, Purpose, Reserve, Reserved, Roots,
};
use crate::actors::workers::WorkerPool;
use crate::content::Message;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::handle::AgentHandle;
use crate::host::inbox::InboxReplay;
use crate::host::request::{CreateAgent, ResumeAgent};
use crate::host::scope::StatedContext;
use crate::host::stored_inbox::{self, AfterCheckpoint, InboxCheckpoint};
use crate::host::{
    AgentEnv, AgentEvent, AgentEventKind, AgentOptions, AgentScope, AgentSetup, Inbox,
};
use crate::ids::MessageId;
use crate::ids::SessionId;
use crate::projection::ProjectionRegistry;
use crate::session::log::{Attachment, CreationCommit, WriterIdle};
use crate::session::{EventKind, SessionHeader, SessionLog};
use crate::store::{LeaseEpoch, LeaseHolder, SessionPersistence};

mod guards;
use guards::{LeaseGuard, Reservation};

/// The agents service: creates, resumes and finds agents. Cheap to clone (one pointer: every
/// agent reference carries one, so its size is paid per resident child, several times over).
#[derive(Clone)]
pub struct Agents {
    shared: Arc<AgentsShared>,
}

struct AgentsShared {
    registry: Addr<AgentRegistry>,
    env: Arc<AgentEnv>,
    incarnations: AtomicU64,
    workers: Option<Arc<WorkerPool>>,
    holder: LeaseHolder,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents").finish_non_exhaustive()
    }
}

fn check_token(token: Option<&tokio_util::sync::CancellationToken>) -> Result<()> {
    if token.is_some_and(tokio_util::sync::CancellationToken::is_cancelled) {
        return Err(SubagentError::new(
            ErrorCode::Cancelled,
            "agent creation was cancelled before publication",
        ));
    }
    Ok(())
}

/// How a staged agent's id enters the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registration {
    /// A caller's id: reserved before the session is stored (another creation may want it).
    ReserveFirst,
    /// Minted by this creation, so no other creation can race for it: the registry is asked
    /// once, at publication, instead of reserving first.
    Minted,
    /// Already reserved under this incarnation (a resume reserves before it takes the lease).
    Reserved(u64),
}

/// The ancestors an agent of `log` is published with: what its creator or resumer knew of
/// them, else its owner and the owner's own, else its header's parent. A resumed root or a
/// host's delegated child whose parent left knows no further than the header.
fn ancestors_of(
    log: &SessionLog,
    owner: Option<&AgentRef>,
    known: Option<Box<[SessionId]>>,
) -> Box<[SessionId]> {
    if let Some(known) = known {
        return known;
    }
    match owner {
        Some(owner) => std::iter::once(owner.id())
            .chain(owner.ancestors().iter().copied())
            .collect(),
        None => log.parent_session().into_iter().collect(),
    }
}

/// How many times a reservation waits out a transient holder of its id before giving up.
const RESERVE_ATTEMPTS: usize = 64;

/// A staged agent: everything built, nothing published.
struct Staged {
    log: SessionLog,
    scope: AgentScope,
    options: AgentOptions,
    setup: Option<Box<dyn AgentSetup>>,
    cancel: Option<tokio_util::sync::CancellationToken>,
    owner: Option<AgentRef>,
    /// What its creator or resumer knows of its ancestors (see [`AgentRef::ancestors`]).
    ancestors: Option<Box<[SessionId]>>,
    /// A resumed session: its stored length and the lease taken before loading it.
    resumed: Option<(u64, LeaseGuard)>,
    /// Where the agent runs: `None` is the calling arbiter.
    arbiter: Option<actix::ArbiterHandle>,
    /// How the id enters the registry.
    registration: Registration,
    /// What its writer does when idle: a short-lived agent's waits as a task.
    writer_idle: WriterIdle,
    /// When a session stored only once its creation commits does (see [`CreationCommit`]).
    deferred: Option<CreationCommit>,
    /// The log whose prefix the session's seed references: written before the session is.
    seed_source: Option<SessionLog>,
    /// The inbox of a log loaded paged out (replayed as it was read); `None`: replayed from
    /// the log's own events.
    inbox: Option<Inbox>,
}

/// The events a write into the inbox of a session that is away keeps of its log: only its
/// inbox and its end are needed to append there.
const STORED_INBOX_KEEP: std::num::NonZeroU32 = std::num::NonZeroU32::MIN;

/// The session `header` heads, loaded paged out, keeping `keep` events (the resume of an agent
/// that pages, or a write into the inbox of a session that is away): read a chunk at a time
/// ([`crate::store::read_chunked`]), each chunk
/// appended to the log, folded by every projection unit of `projections` and paged out as a
/// turn's end pages out, so only the events a page-out keeps stay held; each of the session's
/// own events read (not a fork's inherited prefix) is also shown to `each`. An interrupted last
/// turn is closed durably under `lease`, as [`SessionPersistence::prepare`] closes it (its
/// `turn/end` keeping the newest trace context the log knew), and the inbox is replayed from
/// the session's own events.
async fn load_paged(
    store: &dyn SessionPersistence,
    projections: Option<&ProjectionRegistry>,
    (header, lease): (SessionHeader, Option<LeaseEpoch>),
    keep: std::num::NonZeroU32,
    mut each: impl FnMut(&crate::session::SessionEvent),
) -> Result<(SessionLog, Inbox)> {
    let id = header.id;
    let (own_from, seed_end) = (header.seed_len(), header.first_stored_seq());
    let keep = usize::try_from(keep.get()).unwrap_or(usize::MAX);
    let log = SessionLog::from_stored(header, Vec::new())?;
    let mut inbox = InboxReplay::default();
    // The newest turn end that keeps a trace context (see the repair below): held, not copied,
    // since a long log has one a turn.
    type Traced = Option<Arc<crate::session::SessionEvent>>;
    let mut traced: Traced = None;
    let mut fold = |events: Vec<Arc<crate::session::SessionEvent>>, traced: &mut Traced| {
        for event in &events {
            if event.seq >= own_from {
                each(event);
                inbox.fold(event);
                if let EventKind::TurnEnd {
                    traceparent: Some(_),
                    ..
                } = &event.kind
                {
                    *traced = Some(Arc::clone(event));
                }
            }
        }
        log.extend_stored(events)?;
        if let Some(projections) = projections {
            projections.fold_live(&log);
        }
        log.page_out_loaded(keep);
        Ok::<_, SubagentError>(())
    };
    crate::store::read_chunked(store, id, (0, seed_end), u64::MAX, |chunk| {
        fold(chunk, &mut traced)?;
        Ok(true)
    })
    .await?;
    let mut closers = log.interrupted_turn_closers();
    if !closers.is_empty() {
        tracing::info!(session_id = %id, repaired = closers.len(), "repairing an interrupted turn");
        // The repaired turn's span ended with the process that ran it: its end keeps the
        // newest context the log knew, so the next turn links back to the last epoch traced.
        // A whole log's resume finds that one by looking back; a paged one may hold it no more.
        if let Some(EventKind::TurnEnd {
            traceparent: closing @ None,
            ..
        }) = closers.last_mut().map(|end| &mut Arc::make_mut(end).kind)
        {
            *closing = traced.as_deref().and_then(|end| match &end.kind {
                EventKind::TurnEnd { traceparent, .. } => traceparent.clone(),
                _ => None,
            });
        }
        store.append(id, log.len(), closers.clone(), lease).await?;
        store.flush(id).await?;
        fold(closers, &mut traced)?;
    }
    Ok((log, inbox.finish()))
}

impl Agents {
    pub(crate) fn start(
        env: Arc<AgentEnv>,
        workers: Option<Arc<WorkerPool>>,
        holder: LeaseHolder,
    ) -> Self {
        Self {
            shared: Arc::new(AgentsShared {
                registry: AgentRegistry::new(Arc::clone(&env.events)).start(),
                env,
                incarnations: AtomicU64::new(1),
                workers,
                holder,
            }),
        }
    }

    /// The environment every agent shares.
    pub fn env(&self) -> &Arc<AgentEnv> {
        &self.shared.env
    }

    /// The registry of this runtime's live agents.
    pub(crate) fn registry(&self) -> &Addr<AgentRegistry> {
        &self.shared.registry
    }

    /// This runtime's lease holder: every session it drives is leased in its name.
    pub fn lease_holder(&self) -> &LeaseHolder {
        &self.shared.holder
    }

    /// Creates and publishes a new agent.
    ///
    /// The request is checked and the agent staged when this is called; the returned future
    /// publishes it. It holds no borrow of `self`, so it can be spawned as it is.
    ///
    /// # Errors
    /// `CANCELLED` (token fired before publication), `INVALID_HEADER`, `INVALID_SEED`,
    /// `DUPLICATE_AGENT`, `AGENT_DISPOSED` (the owner is gone or being disposed),
    /// `SESSION_EXISTS`, `SESSION_LEASED`, `DRAINING`, the setup's own error, or a store error.
    /// On any error nothing was published.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call publishes nothing that stays unowned (see the module docs).
    pub fn create(
        &self,
        request: CreateAgent,
    ) -> impl std::future::Future<Output = Result<AgentHandle>> + Send + 'static {
        // Staged here rather than inside the future: an `async fn` would keep the request
        // beside the publication's own copy of it, and a creation's future is allocated and
        // moved once per child.
        match self.stage(request) {
            Ok(staged) => futures::future::Either::Left(self.clone().publish(staged)),
            Err(error) => futures::future::Either::Right(std::future::ready(Err(error))),
        }
    }

    fn stage(&self, request: CreateAgent) -> Result<Staged> {
        check_token(request.cancel.as_ref())?;
        let registration = if request.id.is_none() {
            Registration::Minted
        } else {
            Registration::ReserveFirst
        };
        let mut header = SessionHeader::new(request.id.unwrap_or_default());
        header.cwd = request.cwd;
        header.parent_session = request.parent_session;
        header.origin = request.origin;
        header.delegation_depth = request.delegation_depth;
        header.seed_length = request.seed_length;
        let mut seed = request.seed;
        let seed_source = seed.take_source();
        let log = SessionLog::seeded(header, seed)?;
        Ok(Staged {
            log,
            scope: AgentScope::new(Arc::clone(&self.shared.env.tools)),
            options: request.options,
            setup: request.setup,
            cancel: request.cancel,
            owner: request.owner,
            ancestors: request.ancestors,
            resumed: None,
            arbiter: if request.on_current_arbiter {
                None
            } else {
                self.worker()
            },
            registration,
            writer_idle: if request.short_lived {
                WriterIdle::Wait
            } else {
                WriterIdle::Park
            },
            // A deferred creation meets a taken id (`SESSION_EXISTS`) only when it commits,
            // which faults the agent: it is for ids just minted (by this creation or its
            // caller), which nothing else can want.
            deferred: request.deferred,
            seed_source,
            inbox: None,
        })
    }

    /// Takes the session's lease, loads it (repairing an interrupted turn durably under that
    /// lease), replays its inbox and publishes it as a live agent. Turn numbering continues;
    /// pending work waits for a waking send.
    ///
    /// # Errors
    /// `PERSISTENCE_UNAVAILABLE`, `DUPLICATE_AGENT`, `SESSION_LEASED` (live in another
    /// runtime), `SESSION_NOT_FOUND`, `STORE_CORRUPT`, `CANCELLED`, the setup's error. On any
    /// error nothing was published and the lease is released.
    ///
    /// # Cancel safety
    /// As [`Agents::create`].
    pub async fn resume(&self, request: ResumeAgent) -> Result<AgentHandle> {
        check_token(request.cancel.as_ref())?;
        let store = self.shared.env.store.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "resume requires session persistence",
            )
        })?;
        // The id is reserved before the lease is taken: a resume that loses the race for the
        // id must never take the lease, which would fence the winner's writer with a new epoch.
        let incarnation = self.next_incarnation();
        let reservation = Reservation {
            registry: &self.shared.registry,
            agent: Some((request.id, incarnation)),
        };
        self.reserve((request.id, incarnation), Purpose::Resume)
            .await?;
        let (lease, stored_len) =
            LeaseGuard::acquire_with_length(&store, request.id, &self.shared.holder).await?;
        let epoch = Some(lease.lease.epoch);
        // What its log last stated as runtime context, when it is loaded paged out.
        let mut stated = StatedContext::default();
        let (log, inbox) = match (request.inspected, request.options.resident_events) {
            (Some(inspected), _) => {
                let stored = store
                    .prepare_inspected(request.id, epoch, inspected, stored_len)
                    .await?;
                (SessionLog::from_stored(stored.header, stored.events)?, None)
            }
            // A long-lived agent that pages its log is loaded paged out: its working set,
            // never its whole transcript, is in memory.
            (None, Some(keep)) => {
                let projections = self.shared.env.projections.as_deref();
                let header = store.header(request.id).await?;
                let (log, inbox) =
                    load_paged(&*store, projections, (header, epoch), keep, |event| {
                        stated.fold(event);
                    })
                    .await?;
                (log, Some(inbox))
            }
            (None, None) => {
                let stored = store.prepare(request.id, epoch).await?;
                (SessionLog::from_stored(stored.header, stored.events)?, None)
            }
        };
        crate::projection::cache::seed_at_resume(&self.shared.env, &log).await;
        let stored_len = log.len();
        let mut scope = AgentScope::new(Arc::clone(&self.shared.env.tools));
        scope.count_as_sent(&stated);
        let handle = self
            .clone()
            .publish(Staged {
                log,
                scope,
                options: request.options,
                setup: request.setup,
                cancel: request.cancel,
                owner: None,
                ancestors: request.ancestors,
                resumed: Some((stored_len, lease)),
                arbiter: self.worker(),
                registration: Registration::Reserved(incarnation),
                writer_idle: WriterIdle::Park,
                deferred: None,
                seed_source: None,
                inbox,
            })
            .await?;
        reservation.keep();
        Ok(handle)
    }

    /// Puts `message` into the inbox of stored session `id` while no agent of it is live: a
    /// pending next-turn message that its next resume replays (it then waits for a waking
    /// send). A parent that is away still hears its child settle, once, when it comes back.
    /// The id is reserved in the registry and the session leased for the write, as a resume
    /// does, so the write never races a live agent of the session.
    ///
    /// # Errors
    /// `DUPLICATE_AGENT` when an agent of the session is live or being created (deliver to it
    /// instead); `PERSISTENCE_UNAVAILABLE`; `SESSION_NOT_FOUND`; `SESSION_LEASED` (live in
    /// another runtime); store errors. With `may_be_from` set (the message was handed to the
    /// session before: to an agent of it that refused it as it went away, or by a sender that
    /// did not hear the first answer), a message the session already accepted is answered with
    /// its id, not stored twice: `Some(seq)` says the log may hold it at `seq` or after (what
    /// the session had stored when the message was first handed to it), `Some(0)` anywhere.
    ///
    /// # Cost
    /// A message is written from the stored-inbox checkpoint the previous write left (see
    /// [`crate::host::stored_inbox`]): the write reads only the events after it, and one that
    /// may repeat also the events from `seq` to the checkpoint, so a parent away while its
    /// children settle costs each notice the same whatever its log's length, even a notice its
    /// parent refused as it went away. A first write, and one that may repeat anywhere
    /// (`Some(0)`: a node asking again after its peer stopped answering), read the whole log, a
    /// chunk at a time.
    ///
    /// # Cancel safety
    /// A dropped call frees its reservation and its lease; the message may or may not have
    /// been written.
    pub(crate) async fn enqueue_stored(
        &self,
        id: SessionId,
        message: Message,
        may_be_from: Option<u64>,
    ) -> Result<MessageId> {
        let store = self.shared.env.store.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "a stored inbox requires session persistence",
            )
        })?;
        let incarnation = self.next_incarnation();
        // Dropped at the end (or on any exit): frees the reservation.
        let _reservation = Reservation {
            registry: &self.shared.registry,
            agent: Some((id, incarnation)),
        };
        self.reserve((id, incarnation), Purpose::Write).await?;
        let lease = LeaseGuard::acquire(&store, id, &self.shared.holder).await?;
        let epoch = lease.lease.epoch;
        let message_id = message.id;
        let header = store.header(id).await?;
        if may_be_from != Some(0) {
            let written = stored_inbox::append_after_checkpoint(
                &*store,
                &header,
                &message,
                (epoch, may_be_from),
            )
            .await?;
            if written != AfterCheckpoint::NeedsWholeLog {
                // Released here rather than by the guard's task: a resume right after must
                // find it free.
                store.release_lease(id, lease.hand_over().epoch).await?;
                return Ok(message_id);
            }
        }
        // Loaded paged out: a long-lived parent that is away is written to without holding
        // its whole transcript, whoever resumes it later.
        let mut inserted = false;
        let (log, mut inbox) = load_paged(
            &*store,
            None,
            (header.clone(), Some(epoch)),
            STORED_INBOX_KEEP,
            |event| inserted = inserted || crate::host::inbox::inserts([event], message_id),
        )
        .await?;
        let stored_len = log.len();
        // Stored again under its id (its sender did not hear the first answer): stored once.
        if inserted {
            InboxCheckpoint::new(
                &header,
                stored_len,
                inbox.next_turn_len(),
                inbox.next_step_len(),
            )
            .store(&*store, id, epoch)
            .await;
            store.release_lease(id, lease.hand_over().epoch).await?;
            return Ok(message_id);
        }
        inbox.insert(&log, crate::session::InboxTarget::NextTurn, message)?;
        let added = log.with_events(|events| {
            events.to_vec_range(
                usize::try_from(stored_len).unwrap_or(usize::MAX),
                events.len(),
            )
        });
        store.append(id, stored_len, added, Some(epoch)).await?;
        // Durable before it is answered: its sender (perhaps another node) sends it no more.
        store.flush(id).await?;
        // The next write into this inbox starts from here.
        InboxCheckpoint::new(
            &header,
            log.len(),
            inbox.next_turn_len(),
            inbox.next_step_len(),
        )
        .store(&*store, id, epoch)
        .await;
        // Released here rather than by the guard's task: a resume right after must find it free.
        store.release_lease(id, lease.hand_over().epoch).await?;
        Ok(message_id)
    }

    /// Reserves `agent`'s id without an owner for `purpose`, waiting out a creation, resume or
    /// write that holds it for a moment.
    ///
    /// # Errors
    /// As [`Reserve`]: `DUPLICATE_AGENT` once an agent of the session is live.
    async fn reserve(&self, agent: Exact, purpose: Purpose) -> Result<()> {
        // Each wait follows another caller finishing with the id: a bound only guards against a
        // livelock of endless contenders.
        for _ in 0..RESERVE_ATTEMPTS {
            let reserved = self
                .shared
                .registry
                .send(Reserve {
                    agent,
                    owner: None,
                    purpose,
                })
                .await??;
            match reserved {
                Reserved::Done => return Ok(()),
                // A dropped sender means the registry stopped: asking again says so.
                Reserved::Busy(freed) => {
                    let _ = freed.await;
                }
            }
        }
        Err(SubagentError::new(
            ErrorCode::DuplicateAgent,
            format!("agent {} stayed busy with other creations", agent.0),
        ))
    }

    fn next_incarnation(&self) -> u64 {
        self.shared.incarnations.fetch_add(1, Ordering::Relaxed)
    }

    async fn publish(self, staged: Staged) -> Result<AgentHandle> {
        let Staged {
            log,
            mut scope,
            options,
            setup,
            cancel,
            owner,
            ancestors,
            resumed,
            arbiter,
            registration,
            writer_idle,
            deferred,
            seed_source,
            inbox,
        } = staged;
        let ancestors = ancestors_of(&log, owner.as_ref(), ancestors);
        let commit = match setup {
            Some(setup) => setup.run(&mut scope, &log).await?,
            None => None,
        };
        check_token(cancel.as_ref())?;
        let id = log.id();
        let incarnation = match registration {
            Registration::Reserved(incarnation) => incarnation,
            Registration::ReserveFirst | Registration::Minted => self.next_incarnation(),
        };
        let owner_exact = owner
            .as_ref()
            .map(|owner| (owner.id(), owner.incarnation()));
        // The guard exists before the reservation is sent: `send` queues the message at once,
        // so a drop at any later await is followed, in mailbox order, by its `Abandon`.
        let reservation = Reservation {
            registry: &self.shared.registry,
            agent: Some((id, incarnation)),
        };
        // A caller's id may be live or wanted by another creation: it is reserved before the
        // session is stored. A minted one cannot be, so it is registered once, at publication
        // (one registry round trip a creation instead of two); a refusal then (`DRAINING`, an
        // owner gone or retiring) unwinds what was built, as a refused publication does.
        if registration == Registration::ReserveFirst {
            let reserved = self
                .shared
                .registry
                .send(Reserve {
                    agent: (id, incarnation),
                    owner: owner_exact,
                    purpose: Purpose::Create,
                })
                .await??;
            if let Reserved::Busy(_) = reserved {
                // A stored session being written: its id is taken all the same.
                return Err(SubagentError::new(
                    ErrorCode::DuplicateAgent,
                    format!("agent {id} is being written"),
                ));
            }
        }
        let attachment = match (&self.shared.env.store, resumed, deferred) {
            (Some(_), Some((stored_len, lease)), _) => Some((stored_len, Some(lease))),
            // Stored by its writer once the creation commits.
            (Some(_), None, Some(_)) => Some((0, None)),
            (Some(store), None, None) => {
                if let Some(source) = &seed_source {
                    source
                        .written_through(log.header().first_stored_seq())
                        .await?;
                }
                let (count, initial) = log.stored_creation();
                let lease = store
                    .create_leased(log.header(), initial, self.shared.holder.clone())
                    .await?;
                Some((count, Some(LeaseGuard::held(store, id, lease))))
            }
            (None, _, _) => None,
        };
        // The token owns the creation until publication (a fired token publishes nothing).
        check_token(cancel.as_ref())?;
        if let Some(commit) = commit {
            commit();
        }
        let inbox = inbox.unwrap_or_else(|| {
            let own = usize::try_from(log.header().seed_len()).unwrap_or(usize::MAX);
            log.with_events(|events| Inbox::replay(events.iter_from(own)))
        });
        let disposers = scope.take_disposers();
        // One copy, shared by the actor and every reference to it.
        let published = Arc::new(Published { options, ancestors });
        let actor = AgentActor::new(
            log.clone(),
            inbox,
            Arc::clone(&self.shared.env),
            Arc::new(scope),
            Arc::clone(&published),
            disposers,
            (incarnation, self.clone()),
        );
        let addr = match &arbiter {
            Some(arbiter) => AgentActor::start_in_arbiter(arbiter, move |_| actor),
            None => actor.start(),
        };
        if !addr.connected() {
            // The worker arbiter has stopped (the system is shutting down): the actor never ran.
            return Err(SubagentError::new(
                ErrorCode::AgentDisposed,
                format!("agent {id} could not start: its worker has stopped"),
            ));
        }
        if let (Some(store), Some((next_seq, lease))) = (&self.shared.env.store, attachment) {
            let faulted = addr.downgrade();
            let events = Arc::clone(&self.shared.env.events);
            let attachment = match (lease, deferred) {
                // From here the writer owns the lease: it renews it and releases it on close.
                (Some(lease), _) => Attachment::Stored {
                    next_seq,
                    lease: Some(lease.hand_over()),
                },
                (None, Some(commit)) => Attachment::Deferred {
                    commit,
                    holder: self.shared.holder.clone(),
                    seed_source,
                },
                (None, None) => Attachment::Stored {
                    next_seq,
                    lease: None,
                },
            };
            let writing = log.attach(
                Arc::clone(store),
                attachment,
                Box::new(move |error| {
                    // Reported here, once, whatever the actor's state: a fault during the
                    // agent's release (its actor stopping or gone) is still heard.
                    events.emit(&AgentEvent {
                        agent: id,
                        kind: AgentEventKind::Faulted {
                            error: error.clone(),
                        },
                    });
                    if let Some(addr) = faulted.upgrade() {
                        addr.do_send(Faulted(error));
                    }
                }),
                writer_idle,
            );
            // Beside the agent, whose turns append and whose release closes the log: a
            // one-shot's creation already runs on its child's worker (see
            // `InProcessProvider`), a continuable child's start and cold resume on the
            // manager's arbiter, whose writers then took every child's writes on its one
            // thread. A stopped worker drops the task, which faults the log.
            match &arbiter {
                Some(arbiter) => {
                    arbiter.spawn(writing);
                }
                None => drop(tokio::spawn(writing)),
            }
        }
        let agent = AgentRef::new(id, incarnation, &addr, log, published, self.clone());
        // The handle takes the actor's one strong address (a clone would allocate a sender).
        let handle = AgentHandle::new(agent, addr, arbiter);
        let publish = Publish {
            handle: handle.clone(),
            owner: owner_exact,
            cancel: cancel.clone(),
            reserved: registration != Registration::Minted,
        };
        if registration != Registration::Minted && owner_exact.is_none() && cancel.is_none() {
            // Nothing can refuse this publication (no owner to retire, no token to fire), so
            // it needs no reply: a lookup sent after this is handled after it.
            self.shared.registry.do_send(publish);
        } else {
            let published = self
                .shared
                .registry
                .send(publish)
                .await
                .map_err(SubagentError::from)
                .and_then(|outcome| outcome);
            if let Err(error) = published {
                // The owner began retiring, the token fired, or (for a minted id) the runtime
                // began shutting down while the agent was being created: unwind the started
                // actor and its write-behind; the registry freed the reservation.
                crate::actors::agent::retire(handle.actor()).await;
                let _ = handle.agent().log().inner().close().await;
                return Err(error);
            }
        }
        reservation.keep();
        tracing::debug!(session_id = %id, incarnation, "agent published");
        self.shared.env.events.emit(&AgentEvent {
            agent: id,
            kind: AgentEventKind::Created,
        });
        Ok(handle)
    }

    /// Refuses new creations (`DRAINING`) and waits until none is in progress, so a following
    /// listing sees every agent that will ever be live.
    pub(crate) async fn close(&self) {
        let _ = self.shared.registry.send(Close).await;
    }

    /// The live agents without a live owner: the roots of the ownership forest.
    pub(crate) async fn roots(&self) -> Vec<AgentHandle> {
        self.shared.registry.send(Roots).await.unwrap_or_default()
    }

    /// The worker the next agent goes to, or `None` without a worker pool (agents then run on
    /// the arbiter that creates them).
    pub(crate) fn worker(&self) -> Option<actix::ArbiterHandle> {
        self.shared.workers.as_ref().map(|workers| workers.next())
    }

    /// Stops the worker threads (after every agent on them was released).
    pub(crate) fn stop_workers(&self) {
        if let Some(workers) = &self.shared.workers {
            workers.stop();
        }
    }

    /// The live agent of session `id`, if any.
    pub async fn get(&self, id: SessionId) -> Option<AgentRef> {
        self.handle(id).await.map(|handle| handle.agent().clone())
    }

    /// The owning handle of the live agent of session `id`, if any (it shares its disposal with
    /// every other handle of the agent).
    pub async fn handle(&self, id: SessionId) -> Option<AgentHandle> {
        self.shared.registry.send(Lookup(id)).await.ok().flatten()
    }

    /// Whether `agent` is exactly the live agent of its session (same incarnation).
    pub async fn is_live(&self, agent: &AgentRef) -> bool {
        self.get(agent.id()).await.as_ref() == Some(agent)
    }

    /// Every live agent.
    pub async fn list(&self) -> Vec<AgentRef> {
        self.shared
            .registry
            .send(ListLive)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|handle| handle.agent().clone())
            .collect()
    }
}
