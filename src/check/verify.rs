//! Provides the checks of one schedule's history: what the book recorded, read against every
//! log the store holds once the runtime is gone.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use tokio_util::sync::CancellationToken;

use super::book::{Book, Entry};
use super::driver::stored;
use crate::content::MessageSource;
use crate::error::{ErrorCode, Result};
use crate::ids::{MessageId, SessionId};
use crate::projection::SubagentListEntry;
use crate::runtime::Runtime;
use crate::seam::{DelegationMode, SubagentDescriptor};
use crate::session::{EventKind, InboxTarget, SessionEvent};
use crate::store::SharedStore;

/// A stored log, read as the checks need it: its inbox journal.
#[derive(Debug, Default)]
struct Journal {
    /// Messages inserted, with their source, in order.
    inserted: Vec<(MessageId, MessageSource)>,
    /// The log is a one-shot child's (its recorded delegation mode).
    one_shot: bool,
}

impl Journal {
    fn read<E: Borrow<SessionEvent>>(events: &[E]) -> Self {
        let mut journal = Self {
            one_shot: SubagentDescriptor::fold(events).is_ok_and(|descriptor| {
                descriptor.is_some_and(|descriptor| descriptor.mode == DelegationMode::OneShot)
            }),
            ..Self::default()
        };
        for event in events {
            if let EventKind::InboxSpliced { inserted, .. } = &event.borrow().kind {
                journal.inserted.extend(
                    inserted
                        .iter()
                        .map(|message| (message.id, message.source.clone())),
                );
            }
        }
        journal
    }

    fn count(&self, message: MessageId) -> usize {
        self.inserted
            .iter()
            .filter(|(id, _)| *id == message)
            .count()
    }

    /// The settled notices of `child` inserted here (pending or since claimed).
    fn notices_of(&self, child: SessionId) -> Vec<MessageId> {
        self.inserted
            .iter()
            .filter(|(_, source)| matches!(source,
                MessageSource::SubagentSettledNotice { sender_session_id, .. } if *sender_session_id == child))
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Runs every check of `book` against the store read by `rt`; appends what breaks.
pub(crate) async fn verify(
    book: &mut Book,
    rt: &Runtime,
    store: &SharedStore,
    roots: &[SessionId],
) -> Result<()> {
    lifecycle(book);
    let inbox = inbox_events(book);
    exactly_once(book, &inbox);
    fifo(book);
    fenced(book);
    // Every session the schedule touched, read back.
    let mut sessions: BTreeSet<SessionId> = roots.iter().copied().collect();
    sessions.extend(book.children.iter().map(|child| child.id));
    let started: BTreeSet<SessionId> = book
        .entries
        .iter()
        .filter_map(|entry| match entry {
            Entry::Start { child, .. } => Some(*child),
            _ => None,
        })
        .collect();
    sessions.extend(started.iter().copied());
    let journals = read_back(book, store, &sessions).await;
    durable_answers(book, &journals);
    notices(book, &journals);
    ghosts(book, &journals, &started);
    listing(book, rt, store, &sessions).await?;
    Ok(())
}

/// The journal of every stored session of `sessions`. A log that does not read back is a broken
/// promise of the schedule (`readable`), so the schedule is reported and shrunk, not the check
/// stopped.
async fn read_back(
    book: &mut Book,
    store: &SharedStore,
    sessions: &BTreeSet<SessionId>,
) -> BTreeMap<SessionId, Journal> {
    let mut journals = BTreeMap::new();
    for id in sessions {
        let read = match stored(store, *id).await {
            Ok(false) => continue,
            Ok(true) => store.read_from(*id, 0).await,
            Err(error) => Err(error),
        };
        match read {
            Ok(events) => {
                journals.insert(*id, Journal::read(&events));
            }
            Err(error) => book.anomaly(
                "readable",
                format!("session {id} does not read back: {error}"),
            ),
        }
    }
    journals
}

/// One Activation at a time: each child's starts and ends alternate, and each epoch closes.
fn lifecycle(book: &mut Book) {
    let mut open: BTreeSet<SessionId> = BTreeSet::new();
    let mut broken = Vec::new();
    for entry in &book.entries {
        match entry {
            Entry::Start { child, .. } if !open.insert(*child) => {
                broken.push(format!("{child} has two resident Activations"));
            }
            Entry::End { child } if !open.remove(child) => {
                broken.push(format!("{child} ended an epoch it had not started"));
            }
            _ => {}
        }
    }
    for child in open {
        broken.push(format!("{child} has an epoch with no subagent/end"));
    }
    for detail in broken {
        book.anomaly("one-activation", detail);
    }
}

/// Per (agent, message): how often it was inserted, claimed and discarded.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    inserted: usize,
    claimed: usize,
    discarded: usize,
}

fn inbox_events(book: &Book) -> BTreeMap<(SessionId, MessageId), Seen> {
    let mut seen: BTreeMap<(SessionId, MessageId), Seen> = BTreeMap::new();
    for entry in &book.entries {
        match *entry {
            Entry::Inserted { agent, message, .. } => {
                seen.entry((agent, message)).or_default().inserted += 1;
            }
            Entry::Claimed { agent, message } => {
                seen.entry((agent, message)).or_default().claimed += 1;
            }
            Entry::Discarded { agent, message } => {
                seen.entry((agent, message)).or_default().discarded += 1;
            }
            _ => {}
        }
    }
    seen
}

/// Every accepted message is inserted once and then claimed once or discarded once (a
/// discard is its recorded reason); no message, accepted or not, is inserted, claimed or
/// discarded twice. A session whose durable write failed is the exception its fault reports:
/// what it did after the failed write is not in the store, so a later resume from the stored
/// prefix may settle a message again (once more in the durable record), or never.
fn exactly_once(book: &mut Book, seen: &BTreeMap<(SessionId, MessageId), Seen>) {
    let mut broken = Vec::new();
    for ((agent, message), counts) in seen {
        if book.faulted.contains(agent) {
            continue;
        }
        if counts.inserted > 1 || counts.claimed + counts.discarded > 1 {
            broken.push(format!(
                "{message} in {agent}: inserted {}, claimed {}, discarded {}",
                counts.inserted, counts.claimed, counts.discarded
            ));
        }
    }
    for (message, accepted) in &book.accepted {
        let counts = seen
            .get(&(accepted.child, *message))
            .copied()
            .unwrap_or_default();
        let settled = counts.claimed + counts.discarded;
        let excused = book.faulted.contains(&accepted.child);
        if counts.inserted != 1 || (settled != 1 && !excused) {
            broken.push(format!(
                "accepted {message} in {}: inserted {}, claimed {}, discarded {}",
                accepted.child, counts.inserted, counts.claimed, counts.discarded
            ));
        }
    }
    for detail in broken {
        book.anomaly("exactly-once", detail);
    }
}

/// Per agent, turns claim next-turn messages in the order they were accepted; a parent's
/// sequential follow-ups are accepted in the order they were sent.
fn fifo(book: &mut Book) {
    let mut inserted: BTreeMap<SessionId, Vec<MessageId>> = BTreeMap::new();
    let mut claimed: BTreeMap<SessionId, Vec<MessageId>> = BTreeMap::new();
    for entry in &book.entries {
        match *entry {
            Entry::Inserted {
                agent,
                message,
                target: InboxTarget::NextTurn,
            } => inserted.entry(agent).or_default().push(message),
            Entry::Claimed { agent, message } => claimed.entry(agent).or_default().push(message),
            _ => {}
        }
    }
    let mut broken = Vec::new();
    // A faulted session may settle again, after a resume, what it settled before its failed
    // write (see `exactly_once`): its order is the stored prefix's, not checked here.
    for (agent, order) in inserted
        .iter()
        .filter(|(agent, _)| !book.faulted.contains(*agent))
    {
        let claims: Vec<MessageId> = claimed
            .get(agent)
            .map(|claims| {
                claims
                    .iter()
                    .filter(|id| order.contains(id))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        if !is_subsequence(&claims, order) {
            broken.push(format!(
                "{agent} claimed {claims:?} out of acceptance order {order:?}"
            ));
        }
    }
    for (child, sent) in &book.sequential {
        let order = inserted.get(child).cloned().unwrap_or_default();
        let accepted: Vec<MessageId> = order
            .iter()
            .filter(|id| sent.contains(id))
            .copied()
            .collect();
        if &accepted != sent {
            broken.push(format!(
                "{child} accepted sequential follow-ups as {accepted:?}, sent as {sent:?}"
            ));
        }
    }
    for detail in broken {
        book.anomaly("fifo", detail);
    }
}

/// Whether `part` appears in `whole` in the same order.
fn is_subsequence(part: &[MessageId], whole: &[MessageId]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|wanted| rest.any(|id| id == wanted))
}

/// No live session is ever fenced: a single runtime never loses a lease it holds.
fn fenced(book: &mut Book) {
    let fenced: Vec<SessionId> = book
        .entries
        .iter()
        .filter_map(|entry| match entry {
            Entry::Faulted {
                agent,
                code: ErrorCode::LeaseLost,
            } => Some(*agent),
            _ => None,
        })
        .collect();
    for agent in fenced {
        book.anomaly(
            "fenced",
            format!("{agent} lost its lease while it was live"),
        );
    }
}

/// No failed durable write is answered `Ok`: every child whose start was answered is stored
/// with its prompt, and every accepted follow-up is in its child's stored log (unless a failed
/// write faulted the child, which then refused everything after it).
fn durable_answers(book: &mut Book, journals: &BTreeMap<SessionId, Journal>) {
    let mut broken = Vec::new();
    for child in &book.children {
        if !journals.contains_key(&child.id) {
            broken.push(format!("child {} was answered but is not stored", child.id));
        }
    }
    for (message, accepted) in &book.accepted {
        if book.faulted.contains(&accepted.child) {
            continue;
        }
        let count = journals
            .get(&accepted.child)
            .map_or(0, |journal| journal.count(*message));
        if count != 1 {
            broken.push(format!(
                "accepted {message} is stored {count} times in {}",
                accepted.child
            ));
        }
    }
    for detail in broken {
        book.anomaly("durable-answer", detail);
    }
}

/// Each announced epoch of a child (one whose inbox accepted a message from its parent: one
/// answered `Ok`, or one whose caller let go of it but that the child's stored log shows it
/// accepted) makes its parent session hear exactly one settled notice; a rolled-back epoch,
/// none; a one-shot child, none (its result goes to its caller).
fn notices(book: &mut Book, journals: &BTreeMap<SessionId, Journal>) {
    let mut accepted: BTreeSet<MessageId> = book.accepted.keys().copied().collect();
    accepted.extend(journals.values().flat_map(|journal| {
        journal
            .inserted
            .iter()
            .filter(|(_, source)| *source == MessageSource::User)
            .map(|(id, _)| *id)
    }));
    // Per child: its announced epochs, from the order of lifecycle and inbox events.
    let mut open: BTreeMap<SessionId, bool> = BTreeMap::new();
    let mut announced: BTreeMap<SessionId, usize> = BTreeMap::new();
    let mut parents: BTreeMap<SessionId, SessionId> = BTreeMap::new();
    for entry in &book.entries {
        match *entry {
            Entry::Start { child, parent } => {
                open.insert(child, false);
                parents.insert(child, parent);
            }
            Entry::Inserted { agent, message, .. } if accepted.contains(&message) => {
                if let Some(epoch) = open.get_mut(&agent) {
                    *epoch = true;
                }
            }
            Entry::End { child } if open.remove(&child) == Some(true) => {
                *announced.entry(child).or_default() += 1;
            }
            _ => {}
        }
    }
    let mut broken = Vec::new();
    // A one-shot child's result goes to its caller, not to its parent's inbox.
    let one_shot = |child: &SessionId| {
        book.one_shots.contains(child)
            || journals.get(child).is_some_and(|journal| journal.one_shot)
    };
    for (child, parent) in &parents {
        let expected = match one_shot(child) {
            true => 0,
            false => announced.get(child).copied().unwrap_or(0),
        };
        let heard = journals
            .get(parent)
            .map(|journal| journal.notices_of(*child))
            .unwrap_or_default();
        let distinct: BTreeSet<MessageId> = heard.iter().copied().collect();
        // Lost writes explain a notice missing, and a child that faulted one whose epoch the
        // book cannot see (its accepted message never reached the store).
        let excused = book.faulted.contains(parent) || book.faults_seen;
        let unseen = book.faulted.contains(child);
        if distinct.len() != heard.len()
            || (heard.len() > expected && !unseen)
            || (heard.len() < expected && !excused)
        {
            broken.push(format!(
                "parent {parent} heard {} settled notices of {child} ({} distinct) for {expected} announced epochs",
                heard.len(),
                distinct.len()
            ));
        }
    }
    for detail in broken {
        book.anomaly("notices", detail);
    }
}

/// A start that was refused or cancelled leaves nothing stored: a child that began an epoch
/// but was never answered is stored only if a start whose answer the caller dropped can
/// explain it.
fn ghosts(book: &mut Book, journals: &BTreeMap<SessionId, Journal>, started: &BTreeSet<SessionId>) {
    let answered = answered(book);
    let mut unexplained: BTreeMap<SessionId, Vec<SessionId>> = BTreeMap::new();
    for entry in &book.entries {
        if let Entry::Start { child, parent } = *entry {
            if started.contains(&child)
                && !answered.contains(&child)
                && journals.contains_key(&child)
            {
                let stored = unexplained.entry(parent).or_default();
                if !stored.contains(&child) {
                    stored.push(child);
                }
            }
        }
    }
    let mut broken = Vec::new();
    for (parent, stored) in unexplained {
        let allowed = book.unknown_starts.get(&parent).copied().unwrap_or(0);
        if stored.len() > allowed {
            broken.push(format!(
                "refused starts under {parent} left {} stored children {stored:?} ({allowed} dropped starts could explain)",
                stored.len()
            ));
        }
    }
    for detail in broken {
        book.anomaly("ghost", detail);
    }
}

/// The children whose start was answered, continuable or one-shot.
fn answered(book: &Book) -> BTreeSet<SessionId> {
    book.children
        .iter()
        .map(|child| child.id)
        .chain(book.one_shots.iter().copied())
        .collect()
}

/// Listing every session's children shows no diagnostic (an interrupted creation is never a
/// damaged child), and only children a start could have made.
async fn listing(
    book: &mut Book,
    rt: &Runtime,
    store: &SharedStore,
    sessions: &BTreeSet<SessionId>,
) -> Result<()> {
    let answered = answered(book);
    let dropped: usize = book.unknown_starts.values().sum();
    let mut broken = Vec::new();
    let mut unexplained = 0;
    for session in sessions {
        if !stored(store, *session).await? {
            continue;
        }
        let listed = rt
            .subagents()
            .list_children(*session, CancellationToken::new())
            .await?;
        for entry in listed {
            match entry {
                SubagentListEntry::Diagnostic { id, reason } => {
                    broken.push(format!(
                        "{id}, a child of {session}, is listed as {reason:?}"
                    ));
                }
                SubagentListEntry::Child { id, .. } if !answered.contains(&id) => {
                    unexplained += 1;
                }
                SubagentListEntry::Child { .. } => {}
            }
        }
    }
    if unexplained > dropped {
        broken.push(format!(
            "{unexplained} listed children were never answered ({dropped} dropped starts could explain)"
        ));
    }
    for detail in broken {
        book.anomaly("listing", detail);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::book::Child;

    fn properties(book: &Book) -> Vec<&'static str> {
        book.anomalies
            .iter()
            .map(|anomaly| anomaly.property)
            .collect()
    }

    #[test]
    fn a_log_that_does_not_read_back_is_an_anomaly_not_a_failed_check() {
        use std::sync::Arc;

        use crate::store::SessionPersistence;
        use crate::testing::{FaultInjectingStore, StoreOperation};
        let faults = FaultInjectingStore::new(Arc::new(crate::store::MemoryStore::new()));
        let (readable, broken) = (SessionId::new(), SessionId::new());
        for id in [readable, broken] {
            futures::executor::block_on(
                faults.create(crate::session::SessionHeader::new(id), Vec::new()),
            )
            .unwrap();
        }
        faults.arm_for(StoreOperation::Read, broken);
        let store: SharedStore = Arc::new(faults);
        let mut book = Book::default();
        let journals = futures::executor::block_on(read_back(
            &mut book,
            &store,
            &BTreeSet::from([readable, broken]),
        ));
        assert_eq!(journals.keys().collect::<Vec<_>>(), [&readable]);
        assert_eq!(properties(&book), ["readable"]);
    }

    #[test]
    fn two_activations_of_one_child_break_the_lifecycle() {
        let (parent, child) = (SessionId::new(), SessionId::new());
        let mut book = Book {
            entries: vec![
                Entry::Start { child, parent },
                Entry::Start { child, parent },
                Entry::End { child },
                Entry::End { child },
                Entry::Start { child, parent },
            ],
            ..Book::default()
        };
        lifecycle(&mut book);
        assert_eq!(
            properties(&book),
            ["one-activation", "one-activation", "one-activation"],
            "a second start, an end with none open, an epoch never ended"
        );
    }

    #[test]
    fn a_message_claimed_twice_or_never_breaks_exactly_once() {
        let child = SessionId::new();
        let [twice, never] = [MessageId::new(), MessageId::new()];
        let mut book = Book::default();
        book.accept(twice, child, false);
        book.accept(never, child, false);
        for message in [twice, never] {
            book.entries.push(Entry::Inserted {
                agent: child,
                message,
                target: InboxTarget::NextTurn,
            });
        }
        book.entries.push(Entry::Claimed {
            agent: child,
            message: twice,
        });
        book.entries.push(Entry::Discarded {
            agent: child,
            message: twice,
        });
        let seen = inbox_events(&book);
        exactly_once(&mut book, &seen);
        assert_eq!(
            properties(&book),
            ["exactly-once", "exactly-once", "exactly-once"],
            "settled twice (as any message, and as an accepted one), and one never settled"
        );
        // A session whose durable write failed may settle again after a resume.
        let mut excused = Book {
            entries: book.entries.clone(),
            accepted: book.accepted.clone(),
            ..Book::default()
        };
        excused.faulted.insert(child);
        let seen = inbox_events(&excused);
        exactly_once(&mut excused, &seen);
        assert!(excused.anomalies.is_empty());
    }

    #[test]
    fn a_claim_out_of_acceptance_order_breaks_fifo() {
        let child = SessionId::new();
        let [first, second] = [MessageId::new(), MessageId::new()];
        let mut book = Book::default();
        book.accept(first, child, true);
        book.accept(second, child, true);
        for message in [second, first] {
            book.entries.push(Entry::Inserted {
                agent: child,
                message,
                target: InboxTarget::NextTurn,
            });
        }
        for message in [first, second] {
            book.entries.push(Entry::Claimed {
                agent: child,
                message,
            });
        }
        fifo(&mut book);
        assert_eq!(properties(&book), ["fifo", "fifo"], "claims and acceptance");
    }

    #[test]
    fn a_live_session_fenced_out_is_an_anomaly() {
        let mut book = Book::default();
        book.entries.push(Entry::Faulted {
            agent: SessionId::new(),
            code: ErrorCode::LeaseLost,
        });
        book.entries.push(Entry::Faulted {
            agent: SessionId::new(),
            code: ErrorCode::StoreIo,
        });
        fenced(&mut book);
        assert_eq!(properties(&book), ["fenced"]);
    }

    fn journal(notices_of: SessionId, count: usize, also: &[MessageId]) -> Journal {
        let mut journal = Journal::default();
        for _ in 0..count {
            journal.inserted.push((
                MessageId::new(),
                MessageSource::SubagentSettledNotice {
                    summary: String::new(),
                    sender_session_id: notices_of,
                },
            ));
        }
        journal
            .inserted
            .extend(also.iter().map(|id| (*id, MessageSource::User)));
        journal
    }

    /// An epoch of `child` under `parent` that accepted `prompt`.
    fn announced_epoch(child: SessionId, parent: SessionId, prompt: MessageId) -> Vec<Entry> {
        vec![
            Entry::Start { child, parent },
            Entry::Inserted {
                agent: child,
                message: prompt,
                target: InboxTarget::NextTurn,
            },
            Entry::End { child },
        ]
    }

    #[test]
    fn an_announced_epoch_with_no_notice_or_two_breaks_the_notices() {
        let (parent, child) = (SessionId::new(), SessionId::new());
        let prompt = MessageId::new();
        let mut book = Book::default();
        book.accept(prompt, child, true);
        book.entries = announced_epoch(child, parent, prompt);
        // A rolled-back epoch: nothing accepted, no notice owed.
        book.entries
            .extend([Entry::Start { child, parent }, Entry::End { child }]);
        for (heard, broken) in [(1, false), (0, true), (2, true)] {
            let mut checked = Book {
                entries: book.entries.clone(),
                accepted: book.accepted.clone(),
                ..Book::default()
            };
            let journals = BTreeMap::from([(parent, journal(child, heard, &[]))]);
            notices(&mut checked, &journals);
            assert_eq!(
                !checked.anomalies.is_empty(),
                broken,
                "{heard} notices heard"
            );
        }
    }

    #[test]
    fn a_settled_notice_of_a_one_shot_child_breaks_the_notices() {
        let (parent, child) = (SessionId::new(), SessionId::new());
        let prompt = MessageId::new();
        let entries = announced_epoch(child, parent, prompt);
        for (heard, broken) in [(0, false), (1, true)] {
            let mut book = Book {
                entries: entries.clone(),
                ..Book::default()
            };
            book.accept(prompt, child, true);
            book.one_shots.insert(child);
            let journals = BTreeMap::from([(parent, journal(child, heard, &[]))]);
            notices(&mut book, &journals);
            assert_eq!(!book.anomalies.is_empty(), broken, "{heard} notices heard");
        }
    }

    #[test]
    fn a_refused_start_that_left_a_stored_child_is_a_ghost() {
        let (parent, ghost, answered) = (SessionId::new(), SessionId::new(), SessionId::new());
        let mut book = Book::default();
        book.children.push(Child {
            id: answered,
            parent,
            depth: 1,
        });
        book.entries = vec![
            Entry::Start {
                child: answered,
                parent,
            },
            Entry::Start {
                child: ghost,
                parent,
            },
        ];
        let started = BTreeSet::from([answered, ghost]);
        let journals =
            BTreeMap::from([(answered, Journal::default()), (ghost, Journal::default())]);
        ghosts(&mut book, &journals, &started);
        assert_eq!(properties(&book), ["ghost"]);
        // A start whose caller let go of it may explain one such child.
        let mut explained = Book {
            entries: book.entries.clone(),
            children: book.children.clone(),
            ..Book::default()
        };
        explained.unknown_starts.insert(parent, 1);
        ghosts(&mut explained, &journals, &started);
        assert!(explained.anomalies.is_empty());
    }

    #[test]
    fn an_answered_child_missing_from_the_store_is_an_unfaithful_answer() {
        let (parent, child) = (SessionId::new(), SessionId::new());
        let prompt = MessageId::new();
        let mut book = Book::default();
        book.children.push(Child {
            id: child,
            parent,
            depth: 1,
        });
        book.accept(prompt, child, true);
        durable_answers(&mut book, &BTreeMap::new());
        assert_eq!(properties(&book), ["durable-answer", "durable-answer"]);
        let mut stored = Book {
            children: book.children.clone(),
            accepted: book.accepted.clone(),
            ..Book::default()
        };
        durable_answers(
            &mut stored,
            &BTreeMap::from([(child, journal(child, 0, &[prompt]))]),
        );
        assert!(stored.anomalies.is_empty());
    }

    #[test]
    fn a_subsequence_keeps_its_order() {
        let [a, b, c] = [MessageId::new(), MessageId::new(), MessageId::new()];
        assert!(is_subsequence(&[a, c], &[a, b, c]));
        assert!(is_subsequence(&[], &[a]));
        assert!(!is_subsequence(&[c, a], &[a, b, c]));
        assert!(!is_subsequence(&[b], &[a, c]));
    }
}
