//! Durable discovery: `list_children` and `list_descendants` enumerate a session's delegated
//! children from stored headers and live sessions, without loading or resuming any of them.
//!
//! # The corpus
//! Every persisted header (when the runtime has a store) overlaid by every live session: a live
//! record wins its id wholesale. Candidates are the sessions whose header says `origin:
//! subagent`; the marker only classifies — identity comes from the projection fold.
//!
//! # The identity ladder (per candidate)
//! Every rung serves an identity only when it passes the seq gate (`seq >= seed_length`: it
//! came from the child's own descriptor, not one replayed from a fork-seeded ancestor), as a
//! cold resume reads it.
//!
//! 1. **Live**: the registry's watermark snapshot (no store read). A child whose creation has
//!    not committed yet (it may still be refused) is left out. A failing unit makes the child
//!    `corrupt`; no own identity yet means it is inside its creation window, and it is left
//!    out; otherwise it is `running`.
//! 2. **Checkpoint cache** (cold): the cached identity row, when it passes the seq gate.
//!    Anything else falls through silently.
//! 3. **Inspection**: one `inspect` of the stored log (at most [`COLD_READS`] at once), checked
//!    against the enumerated header and folded through every unit. A failed read is
//!    `unavailable` (retried by the next listing); a mismatched header, a failing unit or no
//!    own identity is `corrupt`. One damaged sibling never hides a healthy one. A child whose
//!    creation never committed was never stored, so an interrupted creation is never listed.
//!
//! Cancellation is checked before any read, between reads and after the last one: a listing
//! that observed its token fire is `CANCELLED`, never a partial or diagnosed result.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::cache::cached_rows;
use super::identity::{SubagentIdentity, IDENTITY_UNIT};
use super::ProjectionRegistry;
use crate::actors::agent::AgentRef;
use crate::actors::agents::Agents;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::{FastHashMap, FastHashSet, SessionId};
use crate::seam::DelegationMode;
use crate::session::{SessionHeader, SessionOrigin};
use crate::store::{ListedSession, SharedStore};

/// How many cold children one listing inspects at once.
pub const COLD_READS: usize = 4;

/// Whether a listed child's session is live in this runtime now (not its outcome, and not
/// whether it can be resumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubagentActivity {
    /// Live in this runtime.
    Running,
    /// Only in the store.
    Inactive,
}

/// Why a candidate could not be listed as a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubagentDiagnosticReason {
    /// No identity could be folded: a missing, malformed or unknown-version descriptor (not
    /// distinguished), a failing projection unit, or a stored header of another lifecycle.
    Corrupt,
    /// Kept for the TypeScript runtime's listing type; never produced here.
    Unsupported,
    /// The stored log could not be read; the next listing tries again.
    Unavailable,
}

impl SubagentDiagnosticReason {
    /// The wire string: `corrupt`, `unsupported` or `unavailable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Corrupt => "corrupt",
            Self::Unsupported => "unsupported",
            Self::Unavailable => "unavailable",
        }
    }
}

/// One row of a listing: a delegated child, or a diagnostic for one that cannot be named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SubagentListEntry {
    /// A child with a served identity.
    #[serde(rename_all = "camelCase")]
    Child {
        /// The child's session id.
        id: SessionId,
        /// How it was delegated.
        mode: DelegationMode,
        /// Its label (always present for continuable children; for one-shot children only
        /// when the start gave one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        /// Whether it is live now.
        activity: SubagentActivity,
        /// Whether a session with `origin: subagent` names it as its parent.
        has_children: bool,
    },
    /// A candidate whose identity could not be served.
    Diagnostic {
        /// The candidate's session id.
        id: SessionId,
        /// Why.
        reason: SubagentDiagnosticReason,
    },
}

impl SubagentListEntry {
    /// The listed session's id.
    pub fn id(&self) -> SessionId {
        match self {
            Self::Child { id, .. } | Self::Diagnostic { id, .. } => *id,
        }
    }
}

/// One row of a descendant listing: the entry plus its place in the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentDescendantListEntry {
    /// The interpreted entry.
    #[serde(flatten)]
    pub entry: SubagentListEntry,
    /// The durable direct parent, from the enumerated header.
    pub parent_id: SessionId,
    /// Edges from the requested root (its direct children are 1).
    pub depth: u64,
}

/// One tree of the durable forest: a root session and its delegated descendants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentForestTree {
    /// A session with no parent, or whose parent is not in the store.
    pub root: SessionId,
    /// The root's descendants in pre-order, as [`crate::Subagents::list_descendants`] lists
    /// them.
    pub descendants: Vec<SubagentDescendantListEntry>,
}

/// One entry of the durable forest as it streams ([`crate::Subagents::stream_forest`]): a
/// descendant and the root whose tree it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentForestEntry {
    /// The root of the entry's tree (see [`SubagentForestTree::root`]).
    pub root: SessionId,
    /// The descendant, with its parent and depth under `root`.
    pub entry: SubagentDescendantListEntry,
}

/// One session of the corpus.
struct Record {
    header: SessionHeader,
    live: Option<AgentRef>,
}

impl Record {
    fn is_candidate(&self) -> bool {
        self.header.origin == Some(SessionOrigin::Subagent)
    }
}

/// What the ladder served for one candidate.
enum Served {
    Entry(SubagentListEntry),
    /// A live child inside its creation window.
    Omitted,
}

/// How many of a one-shot child's first own events hold its descriptor: its creation batch is
/// the inbox's splice, the turn's start, the prompt taken from the inbox, then the descriptor
/// (whose append commits the creation); a seeded child's opens with the seed's end marker.
const ONE_SHOT_CREATION_EVENTS: u64 = 4;

fn cancelled() -> SubagentError {
    SubagentError::new(ErrorCode::Cancelled, "the listing was cancelled")
}

fn check(cancel: &CancellationToken) -> Result<()> {
    if cancel.is_cancelled() {
        Err(cancelled())
    } else {
        Ok(())
    }
}

/// One listing over one corpus.
pub(crate) struct Listing {
    registry: Arc<ProjectionRegistry>,
    store: Option<SharedStore>,
    cache: bool,
    cancel: CancellationToken,
    records: FastHashMap<SessionId, Record>,
    /// Each session's children (any origin), in (created-at, id) order.
    index: FastHashMap<SessionId, Vec<SessionId>>,
    /// Ids that some `origin: subagent` session names as its parent.
    parents: FastHashSet<SessionId>,
}

impl Listing {
    /// Reads the corpus.
    ///
    /// # Errors
    /// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE` before any read when the runtime has no
    /// projection registry; `CANCELLED`; the store's error when its listing fails.
    pub(crate) async fn open(agents: &Agents, cancel: CancellationToken) -> Result<Self> {
        let env = agents.env();
        let registry = env.projections.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::SubagentControlProjectionsUnavailable,
                "the session projection registry is not mounted: listing needs it",
            )
        })?;
        check(&cancel)?;
        let mut records = FastHashMap::default();
        if let Some(store) = &env.store {
            let listed = tokio::select! {
                () = cancel.cancelled() => return Err(cancelled()),
                listed = store.list() => listed,
            };
            let listed = listed.map_err(|error| {
                if cancel.is_cancelled() {
                    cancelled()
                } else {
                    error
                }
            })?;
            for row in listed {
                match row {
                    ListedSession::Header(header) => {
                        records.insert(header.id, Record { header, live: None });
                    }
                    ListedSession::Corrupt { id, error } => {
                        // Without a readable header it has no place in any tree.
                        tracing::warn!(session_id = ?id, %error, "a stored session header is unreadable; not listed");
                    }
                }
            }
        }
        check(&cancel)?;
        for agent in agents.list().await {
            let header = agent.header();
            records.insert(
                header.id,
                Record {
                    header,
                    live: Some(agent),
                },
            );
        }
        check(&cancel)?;
        let parents = records
            .values()
            .filter(|record| record.is_candidate())
            .filter_map(|record| record.header.parent_session)
            .collect();
        let mut index: FastHashMap<SessionId, Vec<SessionId>> = FastHashMap::default();
        for record in records.values() {
            if let Some(parent) = record.header.parent_session {
                index.entry(parent).or_default().push(record.header.id);
            }
        }
        for children in index.values_mut() {
            children.sort_by_cached_key(|id| (records.get(id).map(|r| r.header.created_at), *id));
        }
        Ok(Self {
            registry,
            store: env.store.clone(),
            cache: env.projection_cache,
            cancel,
            records,
            index,
            parents,
        })
    }

    /// The corpus sessions whose header names `parent`, in (created-at, id) order.
    fn children_of(&self, parent: SessionId) -> impl DoubleEndedIterator<Item = &Record> {
        self.index
            .get(&parent)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(|id| self.records.get(id))
    }

    /// The entries of `parent`'s direct delegated children.
    pub(crate) async fn children(&self, parent: SessionId) -> Result<Vec<SubagentListEntry>> {
        let candidates: Vec<&Record> = self
            .children_of(parent)
            .filter(|record| record.is_candidate())
            .collect();
        let served = self.serve(&candidates).await?;
        Ok(served
            .into_iter()
            .filter_map(|served| match served {
                Served::Entry(entry) => Some(entry),
                Served::Omitted => None,
            })
            .collect())
    }

    /// The candidates of `root`'s whole descendant tree in pre-order, each with its parent
    /// and depth.
    fn preorder(&self, root: SessionId) -> Vec<(&Record, SessionId, u64)> {
        // Iterative, with a visited set: a corrupt parent cycle or a very deep chain of
        // ordinary sessions can neither loop nor exhaust the stack.
        let mut order: Vec<(&Record, SessionId, u64)> = Vec::new();
        let mut visited: FastHashSet<SessionId> = FastHashSet::from_iter([root]);
        let mut stack: Vec<(SessionId, u64)> = vec![(root, 0)];
        while let Some((node, depth)) = stack.pop() {
            for child in self.children_of(node).rev() {
                if visited.insert(child.header.id) {
                    stack.push((child.header.id, depth + 1));
                }
            }
            if node != root {
                if let Some(record) = self.records.get(&node) {
                    if record.is_candidate() {
                        let parent = record.header.parent_session.unwrap_or(root);
                        order.push((record, parent, depth));
                    }
                }
            }
        }
        order
    }

    /// The entries of `root`'s whole descendant tree, in pre-order.
    pub(crate) async fn descendants(
        &self,
        root: SessionId,
    ) -> Result<Vec<SubagentDescendantListEntry>> {
        let order = self.preorder(root);
        let candidates: Vec<&Record> = order.iter().map(|(record, _, _)| *record).collect();
        let served = self.serve(&candidates).await?;
        Ok(served
            .into_iter()
            .zip(order)
            .filter_map(|(served, (_, parent_id, depth))| match served {
                Served::Entry(entry) => Some(SubagentDescendantListEntry {
                    entry,
                    parent_id,
                    depth,
                }),
                Served::Omitted => None,
            })
            .collect())
    }

    /// The roots of the corpus's forest with at least one delegated descendant: sessions with
    /// no parent, or whose parent is not in the corpus, oldest first (by their own creation,
    /// or, for a parent the store does not hold, its oldest child's), then by id.
    pub(crate) fn roots(&self) -> Vec<SessionId> {
        let mut roots: FastHashMap<SessionId, u64> = FastHashMap::default();
        for record in self.records.values() {
            let header = &record.header;
            let root = match header.parent_session {
                None if self.index.contains_key(&header.id) => header.id,
                Some(parent) if !self.records.contains_key(&parent) => parent,
                _ => continue,
            };
            let since = roots.entry(root).or_insert(header.created_at);
            *since = (*since).min(header.created_at);
        }
        let mut roots: Vec<(u64, SessionId)> =
            roots.into_iter().map(|(id, since)| (since, id)).collect();
        roots.sort_unstable();
        roots.into_iter().map(|(_, id)| id).collect()
    }

    /// Every entry of the corpus's forest, root by root (see [`Listing::roots`]) and in
    /// pre-order within a root, as each is identified: at most [`COLD_READS`] store reads at
    /// once, and nothing of an entry kept once it is yielded.
    pub(crate) fn forest(
        self: Arc<Self>,
    ) -> impl futures::Stream<Item = Result<SubagentForestEntry>> + Send + 'static {
        // Ids, not records: the stream owns the listing, and each read borrows it anew.
        let order: Vec<(SessionId, SessionId, SessionId, u64)> = self
            .roots()
            .into_iter()
            .flat_map(|root| {
                self.preorder(root)
                    .into_iter()
                    .map(move |(record, parent, depth)| (root, record.header.id, parent, depth))
                    .collect::<Vec<_>>()
            })
            .collect();
        stream::iter(order)
            .map(move |(root, id, parent_id, depth)| {
                let listing = Arc::clone(&self);
                let entry: BoxFuture<'static, Result<Option<SubagentForestEntry>>> =
                    Box::pin(async move {
                        check(&listing.cancel)?;
                        let Some(record) = listing.records.get(&id) else {
                            return Ok(None);
                        };
                        Ok(match listing.identify(record).await? {
                            Served::Entry(entry) => Some(SubagentForestEntry {
                                root,
                                entry: SubagentDescendantListEntry {
                                    entry,
                                    parent_id,
                                    depth,
                                },
                            }),
                            Served::Omitted => None,
                        })
                    });
                entry
            })
            .buffered(COLD_READS)
            .try_filter_map(|entry| std::future::ready(Ok(entry)))
    }

    /// Serves every candidate, in order, at most [`COLD_READS`] store reads at once.
    async fn serve(&self, candidates: &[&Record]) -> Result<Vec<Served>> {
        // Collected before the first await so no closure is held across it: otherwise the
        // listing future is not provably `Send` to a caller that needs it (a tool body, a
        // spawned task), a known limit of the compiler's higher-ranked lifetime inference.
        let reads: Vec<BoxFuture<'_, Result<Served>>> = candidates
            .iter()
            .map(|record| -> BoxFuture<'_, Result<Served>> { Box::pin(self.identify(record)) })
            .collect();
        let served: Vec<Served> = stream::iter(reads)
            .buffered(COLD_READS)
            .try_collect()
            .await?;
        check(&self.cancel)?;
        Ok(served)
    }

    fn child(
        &self,
        header: &SessionHeader,
        identity: SubagentIdentity,
        activity: SubagentActivity,
    ) -> Served {
        Served::Entry(SubagentListEntry::Child {
            id: header.id,
            mode: identity.mode,
            label: identity.label,
            activity,
            has_children: self.parents.contains(&header.id),
        })
    }

    fn diagnostic(header: &SessionHeader, reason: SubagentDiagnosticReason) -> Served {
        Served::Entry(SubagentListEntry::Diagnostic {
            id: header.id,
            reason,
        })
    }

    /// The identity ladder for one candidate (see the module docs).
    async fn identify(&self, record: &Record) -> Result<Served> {
        let header = &record.header;
        if let Some(agent) = &record.live {
            if !agent.log().inner().is_committed() {
                // Its creation may still be refused: a child is listed once it exists.
                return Ok(Served::Omitted);
            }
            if let Some(store) = &self.store {
                if let Err(error) = self.registry.catch_up(agent.log(), store.as_ref()).await {
                    tracing::debug!(session_id = %header.id, %error, "a live child's paged-out prefix could not be read");
                    return Ok(Self::diagnostic(
                        header,
                        SubagentDiagnosticReason::Unavailable,
                    ));
                }
            }
            return Ok(match self.registry.snapshot(agent.log()) {
                Err(error) => {
                    tracing::debug!(session_id = %header.id, %error, "a live child's projection failed");
                    Self::diagnostic(header, SubagentDiagnosticReason::Corrupt)
                }
                Ok(snapshot) => match snapshot
                    .values
                    .get(IDENTITY_UNIT)
                    .and_then(SubagentIdentity::from_view)
                    .filter(|identity| names_the_child(identity, header))
                {
                    Some(identity) => self.child(header, identity, SubagentActivity::Running),
                    None => Served::Omitted,
                },
            });
        }
        let Some(store) = &self.store else {
            // A cold record only comes from the store.
            return Ok(Self::diagnostic(
                header,
                SubagentDiagnosticReason::Unavailable,
            ));
        };
        if let Some(identity) = self.cached_identity(store, header).await {
            return Ok(self.child(header, identity, SubagentActivity::Inactive));
        }
        check(&self.cancel)?;
        if let Some(identity) = self.one_shot_identity(store, header).await {
            return Ok(self.child(header, identity, SubagentActivity::Inactive));
        }
        check(&self.cancel)?;
        // Only the child's own events: its identity is its own descriptor's (see
        // `names_the_child`), so a fork's seed is checked, not read and folded again.
        let inspected = tokio::select! {
            () = self.cancel.cancelled() => return Err(cancelled()),
            inspected = store.inspect_own(header.id) => inspected,
        };
        check(&self.cancel)?;
        let stored = match inspected {
            Ok(stored) => stored,
            Err(error) => {
                tracing::debug!(session_id = %header.id, %error, "a cold child could not be inspected");
                return Ok(Self::diagnostic(
                    header,
                    SubagentDiagnosticReason::Unavailable,
                ));
            }
        };
        if !stored.header.same_lifecycle(header) {
            return Ok(Self::diagnostic(header, SubagentDiagnosticReason::Corrupt));
        }
        Ok(match self.registry.fold(&stored.events) {
            Ok(snapshot) => match snapshot
                .values
                .get(IDENTITY_UNIT)
                .and_then(SubagentIdentity::from_view)
                .filter(|identity| names_the_child(identity, header))
            {
                Some(identity) => self.child(header, identity, SubagentActivity::Inactive),
                None => Self::diagnostic(header, SubagentDiagnosticReason::Corrupt),
            },
            Err(error) => {
                tracing::debug!(session_id = %header.id, %error, "a cold child's projection failed");
                Self::diagnostic(header, SubagentDiagnosticReason::Corrupt)
            }
        })
    }

    /// The identity of a cold one-shot child, from its creation batch alone: a one-shot child
    /// is never resumed, so the descriptor its creation stored is its only one, and the rest of
    /// its log (its whole turn, most of what a listing would otherwise decode) is not read.
    /// `None` for anything else (another mode, a creation batch not shaped so, a read that
    /// fails), which the inspection then reads whole.
    async fn one_shot_identity(
        &self,
        store: &SharedStore,
        header: &SessionHeader,
    ) -> Option<SubagentIdentity> {
        let from = header.seed_len();
        // A seeded child's own log opens with the seed's end marker.
        let before = from.saturating_add(ONE_SHOT_CREATION_EVENTS + u64::from(from > 0));
        let creation = tokio::select! {
            () = self.cancel.cancelled() => return None,
            read = store.read_between(header.id, from, before) => read,
        };
        let snapshot = self.registry.fold(&creation.ok()?).ok()?;
        snapshot
            .values
            .get(IDENTITY_UNIT)
            .and_then(SubagentIdentity::from_view)
            .filter(|identity| {
                identity.mode == DelegationMode::OneShot && names_the_child(identity, header)
            })
    }

    /// The cached identity of a cold child: served only from a record of its lifecycle whose
    /// every usable row renders (a failing unit sends the child to the inspection, where it is
    /// diagnosed), and only when it passes the seq gate.
    async fn cached_identity(
        &self,
        store: &SharedStore,
        header: &SessionHeader,
    ) -> Option<SubagentIdentity> {
        if !self.cache {
            return None;
        }
        let mut identity = None;
        for row in cached_rows(store, header).await? {
            let view = match self.registry.view_row(&row) {
                // A row of another version, or of a unit no longer registered.
                None => continue,
                Some(Err(_)) => return None,
                Some(Ok(view)) => view,
            };
            if row.key == IDENTITY_UNIT {
                identity = SubagentIdentity::from_view(&view);
            }
        }
        identity.filter(|identity| names_the_child(identity, header))
    }
}

/// Whether `identity` came from the child's own descriptor: one replayed from a fork-seeded
/// ancestor (`seq < seed_length`) names the ancestor, not the child. The same rule on every
/// rung (live, cached, inspected), and the one a cold resume applies: a child is listed under
/// the identity a follow-up to it would resume.
fn names_the_child(identity: &SubagentIdentity, header: &SessionHeader) -> bool {
    identity.seq >= header.seed_len()
}
