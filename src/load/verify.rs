//! The checks after every load run. A run whose checks fail is reported as failed (the CLI
//! exits non-zero): every `subagent/start` paired with one `subagent/end`; each root's durable
//! descendants exactly the children created; every accepted follow-up claimed or discarded
//! exactly once; nothing live after the drain; and the store, reopened, lists the same forest.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::report::{LatencyRecorder, LatencySummary};
use crate::content::MessageSource;
use crate::error::Result;
use crate::host::inbox::{message_fates, MessageFate};
use crate::ids::{MessageId, RunId, SessionId};
use crate::projection::listing::Listing;
use crate::projection::{SubagentDescendantListEntry, SubagentListEntry};
use crate::seam::DelegationMode;
use crate::session::{EventKind, SessionEvent};
use crate::store::SledStore;
use crate::Runtime;

/// A child the run created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Created {
    pub(crate) id: SessionId,
    pub(crate) parent: SessionId,
    pub(crate) root: SessionId,
    pub(crate) mode: DelegationMode,
}

/// One verification check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// What was found.
    pub detail: String,
}

fn check(name: &str, passed: bool, detail: String) -> Check {
    Check {
        name: name.to_owned(),
        passed,
        detail,
    }
}

/// Each root's durable descendants, as `list_descendants` serves them.
pub(crate) type Forest = Vec<(SessionId, Vec<SubagentDescendantListEntry>)>;

/// Lists every root's descendants, from one read of the corpus.
pub(crate) async fn list_forest(rt: &Runtime, roots: &[SessionId]) -> Result<Forest> {
    let listing = Listing::open(rt.agents(), CancellationToken::new()).await?;
    let mut forest = Vec::with_capacity(roots.len());
    for root in roots {
        forest.push((*root, listing.descendants(*root).await?));
    }
    Ok(forest)
}

/// The (id, parent) pairs of a forest's child entries, and how many diagnostics it holds.
pub(crate) type Shape = (HashSet<(SessionId, SessionId)>, usize);

/// A forest's [`Shape`].
pub(crate) fn shape(forest: &Forest) -> Shape {
    let mut pairs = HashSet::new();
    let mut diagnostics = 0;
    for (_, entries) in forest {
        for entry in entries {
            match entry.entry {
                SubagentListEntry::Child { id, .. } => {
                    pairs.insert((id, entry.parent_id));
                }
                SubagentListEntry::Diagnostic { .. } => diagnostics += 1,
            }
        }
    }
    (pairs, diagnostics)
}

/// What the children's logs hold in the store after the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Persisted {
    /// Events the children's logs stored: each child's own events, and a seed it stores
    /// inline. A fork's seed stored by reference is stored once, in its parent's log, and not
    /// counted again here.
    pub events: u64,
    /// The store's size on disk, when it has one.
    pub bytes_on_disk: Option<u64>,
}

/// What the verification found besides its checks.
pub(crate) struct Verified {
    pub(crate) checks: Vec<Check>,
    pub(crate) persisted: Persisted,
    /// A follow-up, from its sending to the turn that claimed it, read from the child's log
    /// (millisecond resolution).
    pub(crate) followup_to_turn_start: LatencySummary,
    /// The forest's child–parent pairs, kept for the reopening of a sled store once the run
    /// closed it ([`reopened_sled`]).
    pub(crate) listed: Option<HashSet<(SessionId, SessionId)>>,
}

/// The events of a root's log the verification reads at once.
const ROOT_PAGE: u64 = 65_536;

/// The accepted follow-ups, counted by their fates in the children's logs.
#[derive(Default)]
struct FollowupTally {
    /// Claimed or discarded exactly once.
    settled: u64,
    /// Every other, described.
    wrong: Vec<String>,
    /// From each claimed follow-up's acceptance to the turn that claimed it.
    turn_start: LatencyRecorder,
}

impl FollowupTally {
    /// Counts the follow-up `id` sent to `child` at `accepted_at` (epoch milliseconds) by its
    /// `fate`.
    fn account(&mut self, child: SessionId, id: MessageId, accepted_at: u64, fate: MessageFate) {
        if fate.claimed + fate.discarded == 1 {
            self.settled += 1;
        } else {
            self.wrong.push(format!("{id} of {child}: {fate:?}"));
        }
        if let Some(claimed_at) = fate.claimed_at {
            self.turn_start
                .record_micros(claimed_at.saturating_sub(accepted_at).saturating_mul(1000));
        }
    }
}

/// How many report relays were inserted into a log's inbox.
fn reports_in(events: &[Arc<SessionEvent>]) -> u64 {
    let count = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::InboxSpliced { inserted, .. } => Some(
                inserted
                    .iter()
                    .filter(|message| {
                        matches!(message.source, MessageSource::SubagentReportRelay { .. })
                    })
                    .count(),
            ),
            _ => None,
        })
        .sum::<usize>();
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// Runs every check (see the module docs), and counts what was persisted.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn verify(
    rt: &Runtime,
    peers: &[Runtime],
    runs: &crate::ids::FastHashMap<RunId, (u32, u32)>,
    created: &[Created],
    accepted: &[(SessionId, MessageId, u64)],
    roots: &[SessionId],
    // `None` for an interrupted run, whose size is not the scenario's.
    expected_total: Option<u64>,
    reports: u64,
    listed: Shape,
    shutdown: Result<()>,
    reopen: Option<&super::store::Reopen>,
) -> Verified {
    let mut checks = Vec::new();
    let mut persisted = Persisted::default();
    let unpaired = runs.values().filter(|counts| **counts != (1, 1)).count();
    checks.push(check(
        "every subagent/start has one subagent/end",
        unpaired == 0,
        format!("{} runs, {unpaired} unpaired", runs.len()),
    ));

    let made = u64::try_from(created.len()).unwrap_or(u64::MAX);
    // An interrupted run (no expected size) grew what it grew; the other checks hold for it.
    if let Some(expected) = expected_total {
        checks.push(check(
            "the forest has the scenario's size",
            expected == made,
            format!("{made} created, {expected} expected"),
        ));
    }

    let expected: HashSet<(SessionId, SessionId)> = created
        .iter()
        .map(|created| (created.id, created.parent))
        .collect();
    let (pairs, diagnostics) = listed;
    checks.push(check(
        "each root's descendants are exactly the children created",
        pairs == expected && diagnostics == 0,
        format!(
            "{} created, {} listed, {diagnostics} diagnostics",
            expected.len(),
            pairs.len()
        ),
    ));

    let mut tally = FollowupTally::default();
    // The follow-ups accepted, by child: each child's log is read once, its inbox fates taken
    // for these and dropped, so a million children's fates are never held at once.
    let mut followups: HashMap<SessionId, Vec<(MessageId, u64)>> = HashMap::new();
    for (child, id, accepted_at) in accepted {
        followups
            .entry(*child)
            .or_default()
            .push((*id, *accepted_at));
    }
    let mut read = 0u64;
    let mut unreadable = Vec::new();
    if let Some(store) = rt.store() {
        // A fork's seed is its parent's log, read on its own; here it is only checked
        // (`read_own`).
        for created in created {
            let own = match store.read_own(created.id).await {
                Ok(own) => own,
                Err(error) => {
                    unreadable.push(format!("{}: {error}", created.id));
                    continue;
                }
            };
            read += 1;
            let own_len = u64::try_from(own.events.len()).unwrap_or(u64::MAX);
            let inline_seed = own
                .header
                .seed_len()
                .saturating_sub(own.header.first_stored_seq());
            persisted.events += inline_seed.saturating_add(own_len);
            let Some(sent) = followups.remove(&created.id) else {
                continue;
            };
            let fates = message_fates(&own.events);
            for (id, accepted_at) in sent {
                let fate = fates.get(&id).copied().unwrap_or_default();
                tally.account(created.id, id, accepted_at, fate);
            }
        }
        persisted.bytes_on_disk = store.size_on_disk();
        // A follow-up to a child the run did not create, or whose log could not be read, has
        // no fate.
        for (child, sent) in followups {
            for (id, accepted_at) in sent {
                tally.account(child, id, accepted_at, MessageFate::default());
            }
        }
    }
    checks.push(check(
        "every child's log reads back from the store",
        unreadable.is_empty(),
        format!(
            "{} logs, {} events{}",
            read,
            persisted.events,
            unreadable
                .first()
                .map(|first| format!("; first unreadable: {first}"))
                .unwrap_or_default()
        ),
    ));
    checks.push(check(
        "every accepted follow-up was claimed or discarded exactly once",
        tally.wrong.is_empty(),
        format!(
            "{} accepted, {} accounted for{}",
            accepted.len(),
            tally.settled,
            tally
                .wrong
                .first()
                .map(|first| format!("; first wrong: {first}"))
                .unwrap_or_default()
        ),
    ));

    // Every report sent reached its parent's log once (roots are in the store after the drain).
    // A root that heard a million settled notices has millions of events: they are read a
    // page at a time, not held at once. (A root has no seed to resolve.)
    let mut delivered = 0u64;
    if let Some(store) = rt.store() {
        for root in roots {
            let mut from = 0;
            while let Ok(page) = store
                .read_stored(*root, from, from.saturating_add(ROOT_PAGE))
                .await
            {
                if page.is_empty() {
                    break;
                }
                delivered += reports_in(&page);
                from = from.saturating_add(u64::try_from(page.len()).unwrap_or(u64::MAX));
            }
        }
    }
    checks.push(check(
        "every report reached its parent once",
        delivered == reports,
        format!("{reports} sent, {delivered} in the roots' logs"),
    ));

    let (mut live, mut resident) = (0, 0);
    for node in std::iter::once(rt).chain(peers) {
        live += node.agents().list().await.len();
        resident += node.subagents().resident_count().await;
    }
    checks.push(check(
        "nothing is live after the drain",
        shutdown.is_ok() && live == 0 && resident == 0,
        match &shutdown {
            Ok(()) => format!("{live} agents, {resident} Activations"),
            Err(error) => format!("the drain failed: {error}"),
        },
    ));

    // A sled directory is reopened only once the run has closed it (see `reopened_sled`).
    let mut listed = None;
    match reopen {
        Some(super::store::Reopen::Postgres(url)) => {
            checks.push(same_forest_reopened(reopened(rt, url, roots).await, &pairs));
        }
        Some(super::store::Reopen::Sled(_)) => listed = Some(pairs),
        None => {}
    }
    Verified {
        checks,
        persisted,
        followup_to_turn_start: tally.turn_start.summary(),
        listed,
    }
}

/// The check that the store, reopened, lists `pairs` (a forest's child–parent pairs).
fn same_forest_reopened(forest: Result<Forest>, pairs: &HashSet<(SessionId, SessionId)>) -> Check {
    match forest {
        Ok(forest) => {
            let (reopened_pairs, reopened_diagnostics) = shape(&forest);
            check(
                "the store reopens and lists the same forest",
                reopened_pairs == *pairs && reopened_diagnostics == 0,
                format!("{} listed after reopening", reopened_pairs.len()),
            )
        }
        Err(error) => check(
            "the store reopens and lists the same forest",
            false,
            with_causes(&error),
        ),
    }
}

/// An error with its causes, for a person reading the check (`STORE_IO: opening the store:
/// No space left on device`).
fn with_causes(error: &crate::SubagentError) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The page cache of the store reopened to list the forest.
const LISTING_CACHE_BYTES: u64 = 64 << 20;

/// How long a closed sled store may take to let go of its directory: its background flusher
/// stops, and the run's actors drop their handles, after the last of them is released.
const CLOSE_WITHIN: Duration = Duration::from_secs(30);

/// The forest a fresh runtime lists from a second connection to the database.
async fn reopened(rt: &Runtime, url: &str, roots: &[SessionId]) -> Result<Forest> {
    if let (Some(store), Some(root)) = (rt.store(), roots.first()) {
        store.flush(*root).await?;
    }
    let store = std::sync::Arc::new(crate::store::PostgresStore::connect(url).await?);
    list_reopened(store, roots).await
}

/// The check that the sled store in `dir`, closed by the run (every handle dropped, so sled
/// flushed it and unlocked the directory), opens again and lists `pairs`: the store itself,
/// not a copy taken while sled could still be writing it.
pub(crate) async fn reopened_sled(
    dir: &Path,
    roots: &[SessionId],
    pairs: &HashSet<(SessionId, SessionId)>,
) -> Check {
    let forest = async {
        let path = dir.to_path_buf();
        // Opening blocks its thread while sled waits for the directory's lock.
        let store = tokio::task::spawn_blocking(move || {
            SledStore::open_with_cache(path, LISTING_CACHE_BYTES, CLOSE_WITHIN)
        })
        .await
        .map_err(|_| crate::SubagentError::bug("opening the store panicked"))??;
        list_reopened(std::sync::Arc::new(store), roots).await
    };
    same_forest_reopened(forest.await, pairs)
}

/// The forest a fresh runtime lists from `store`.
async fn list_reopened(store: crate::store::SharedStore, roots: &[SessionId]) -> Result<Forest> {
    let reopened = Runtime::builder().shared_store(store).build()?;
    let forest = list_forest(&reopened, roots).await;
    reopened.shutdown().await?;
    forest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follow_up_is_settled_only_when_claimed_or_discarded_exactly_once() {
        let child = SessionId::new();
        let mut tally = FollowupTally::default();
        let fate = |claimed, discarded, claimed_at| MessageFate {
            claimed,
            discarded,
            claimed_at,
        };
        tally.account(child, MessageId::new(), 1_000, fate(1, 0, Some(1_004)));
        tally.account(child, MessageId::new(), 1_000, fate(0, 1, None));
        let twice = MessageId::new();
        tally.account(child, twice, 1_000, fate(2, 0, Some(1_002)));
        let lost = MessageId::new();
        tally.account(child, lost, 1_000, MessageFate::default());
        assert_eq!(tally.settled, 2);
        assert_eq!(tally.wrong.len(), 2);
        assert!(tally.wrong[0].starts_with(&format!("{twice} of {child}")));
        assert!(tally.wrong[1].starts_with(&format!("{lost} of {child}")));
        // Each claim's delay: 4 ms and 2 ms (the recorder keeps three significant digits).
        let delays = tally.turn_start.summary();
        assert_eq!(delays.count, 2);
        assert!((1_990..=2_010).contains(&delays.p50_us), "{delays:?}");
        assert!((3_990..=4_010).contains(&delays.max_us), "{delays:?}");
    }
}
