//! Provides [`RecentLogs`]: the sessions a store created most recently, their headers, heads
//! and whole own logs kept decoded beside what it wrote, so that reading one back (a cold
//! resume of a child released moments ago, a listing's inspection) and checking an append
//! against its head cost no row reads and no decoding.
//!
//! # Why
//! On sled a continuable child's cold resume read its log back and decoded it: about 110 K
//! instructions a child, more than the rest of the resume, for events the process itself had
//! encoded moments before. The events are shared (`Arc`), so keeping them costs only the slots.
//!
//! # Coherence
//! A store keeps one `RecentLogs` for all its clones and updates it under its writer lock,
//! after the write it mirrors committed: a log is entered whole when its session is created,
//! extended by each append, and its head's lease epoch moves with each grant. Only a session
//! this store created is held (its own log from the first stored seq, so any read of it is
//! answered whole), and only while nothing else can write it: sled's directory lock keeps
//! other processes out. What is held is bounded by the bytes of the logs' JSON (what they took
//! to store before compression, so the bound follows their decoded size); the least recently
//! created go first, and a disposed one-shot child at once.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::ids::{FastHashMap, SessionId};
use crate::session::{SessionEvent, SessionHeader};

/// The JSON bytes of logs kept decoded by default: a few thousand children's logs.
pub(super) const RECENT_LOG_BYTES: usize = 8 << 20;

/// The recently created sessions of one store, bounded by their logs' JSON bytes.
#[derive(Debug)]
pub(super) struct RecentLogs {
    logs: FastHashMap<SessionId, RecentLog>,
    /// Creation order, oldest first, for eviction; an entry whose generation no longer matches
    /// its session's was forgotten or replaced and is skipped.
    order: VecDeque<(SessionId, u64)>,
    bytes: usize,
    capacity: usize,
    generation: u64,
}

/// One session as it is stored.
#[derive(Debug)]
struct RecentLog {
    header: SessionHeader,
    /// The seq of `events[0]`: the session's first stored seq.
    first: u64,
    events: Vec<Arc<SessionEvent>>,
    /// The durable lease epoch of the session's head.
    lease: u64,
    bytes: usize,
    generation: u64,
}

impl RecentLog {
    /// One past the last stored seq: the head's next seq.
    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

impl RecentLogs {
    /// An empty set holding logs of at most `capacity` JSON bytes in all.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            logs: FastHashMap::default(),
            order: VecDeque::new(),
            bytes: 0,
            capacity,
            generation: 0,
        }
    }

    /// Enters a session just created with `events` (from its first stored seq), `bytes` of
    /// JSON with its header, its head at lease epoch `lease`.
    pub(super) fn created(
        &mut self,
        header: &SessionHeader,
        events: &[Arc<SessionEvent>],
        bytes: usize,
        lease: u64,
    ) {
        if bytes > self.capacity {
            return;
        }
        self.forget(header.id);
        self.generation += 1;
        self.bytes += bytes;
        self.order.push_back((header.id, self.generation));
        self.logs.insert(
            header.id,
            RecentLog {
                header: header.clone(),
                first: header.first_stored_seq(),
                events: events.to_vec(),
                lease,
                bytes,
                generation: self.generation,
            },
        );
        self.evict();
    }

    /// Extends a held log by an append of `events` at `first_seq`, `bytes` of JSON. An append
    /// that does not continue the held log (which cannot happen while every write passes
    /// here) forgets it instead.
    pub(super) fn appended(
        &mut self,
        id: SessionId,
        first_seq: u64,
        events: &[Arc<SessionEvent>],
        bytes: usize,
    ) {
        let Some(log) = self.logs.get_mut(&id) else {
            return;
        };
        if log.end() != first_seq {
            self.forget(id);
            return;
        }
        log.events.extend_from_slice(events);
        log.bytes += bytes;
        self.bytes += bytes;
        self.evict();
    }

    /// Moves a held head's durable lease epoch.
    pub(super) fn leased(&mut self, id: SessionId, lease: u64) {
        if let Some(log) = self.logs.get_mut(&id) {
            log.lease = lease;
        }
    }

    /// Stops holding `id`.
    pub(super) fn forget(&mut self, id: SessionId) {
        if let Some(log) = self.logs.remove(&id) {
            self.bytes -= log.bytes;
        }
        // Skipped entries pile up only while nothing is evicted; keep them in proportion.
        if self.order.len() > 2 * self.logs.len() + 64 {
            let logs = &self.logs;
            self.order.retain(|(id, generation)| {
                logs.get(id)
                    .is_some_and(|log| log.generation == *generation)
            });
        }
    }

    /// The held session's header.
    pub(super) fn header(&self, id: SessionId) -> Option<SessionHeader> {
        self.logs.get(&id).map(|log| log.header.clone())
    }

    /// The held session's head: its next seq and lease epoch.
    pub(super) fn head(&self, id: SessionId) -> Option<(u64, u64)> {
        self.logs.get(&id).map(|log| (log.end(), log.lease))
    }

    /// The held session's own stored events from `from_seq` on and before `before_seq`, as
    /// the store would read them (none before its first stored seq).
    pub(super) fn read(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> Option<Vec<Arc<SessionEvent>>> {
        let log = self.logs.get(&id)?;
        let start = from_seq.max(log.first);
        let end = before_seq.min(log.end());
        if start >= end {
            return Some(Vec::new());
        }
        let index = |seq: u64| usize::try_from(seq - log.first).unwrap_or(usize::MAX);
        log.events.get(index(start)..index(end)).map(<[_]>::to_vec)
    }

    /// Drops the least recently created logs until the rest fit.
    fn evict(&mut self) {
        while self.bytes > self.capacity {
            let Some((id, generation)) = self.order.pop_front() else {
                return;
            };
            if self
                .logs
                .get(&id)
                .is_some_and(|log| log.generation == generation)
            {
                if let Some(log) = self.logs.remove(&id) {
                    self.bytes -= log.bytes;
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::session::EventKind;

    /// Turn starts at seqs `from..from + count`: events the store takes without reading them.
    pub(in crate::store) fn events(from: u64, count: u64) -> Vec<Arc<SessionEvent>> {
        (from..from + count)
            .map(|seq| {
                Arc::new(SessionEvent::new(
                    seq,
                    EventKind::TurnStart { turn: seq + 1 },
                ))
            })
            .collect()
    }

    fn seqs(events: &[Arc<SessionEvent>]) -> Vec<u64> {
        events.iter().map(|event| event.seq).collect()
    }

    #[test]
    fn a_held_log_answers_every_range_and_follows_its_appends() {
        let header = SessionHeader::new(SessionId::new());
        let mut recent = RecentLogs::new(1_000);
        recent.created(&header, &events(0, 3), 30, 1);
        recent.appended(header.id, 3, &events(3, 2), 20);
        assert_eq!(recent.head(header.id), Some((5, 1)));
        assert_eq!(
            seqs(&recent.read(header.id, 0, u64::MAX).unwrap()),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(seqs(&recent.read(header.id, 2, 4).unwrap()), [2, 3]);
        assert!(recent.read(header.id, 5, u64::MAX).unwrap().is_empty());
        recent.leased(header.id, 2);
        assert_eq!(recent.head(header.id), Some((5, 2)));
        // An append that does not continue the log forgets it: the store reads it instead.
        recent.appended(header.id, 9, &events(9, 1), 10);
        assert!(recent.read(header.id, 0, u64::MAX).is_none());
        assert!(recent.head(header.id).is_none());
    }

    #[test]
    fn the_least_recently_created_logs_go_first_and_a_forgotten_one_at_once() {
        let (a, b, c) = (
            SessionHeader::new(SessionId::new()),
            SessionHeader::new(SessionId::new()),
            SessionHeader::new(SessionId::new()),
        );
        let mut recent = RecentLogs::new(100);
        recent.created(&a, &events(0, 1), 40, 0);
        recent.created(&b, &events(0, 1), 40, 0);
        recent.forget(b.id);
        assert!(recent.header(b.id).is_none());
        recent.created(&c, &events(0, 1), 40, 0);
        recent.appended(c.id, 1, &events(1, 1), 40);
        // 120 bytes: the oldest, `a`, goes; `c` stays whole.
        assert!(recent.header(a.id).is_none());
        assert_eq!(recent.head(c.id), Some((2, 0)));
        assert_eq!(recent.bytes, 80);
        // A log larger than the whole capacity is not held at all.
        let d = SessionHeader::new(SessionId::new());
        recent.created(&d, &events(0, 1), 101, 0);
        assert!(recent.header(d.id).is_none());
    }

    #[test]
    fn forgotten_entries_do_not_pile_up() {
        let mut recent = RecentLogs::new(usize::MAX);
        for _ in 0..1_000 {
            let header = SessionHeader::new(SessionId::new());
            recent.created(&header, &events(0, 1), 10, 0);
            recent.forget(header.id);
        }
        assert!(recent.order.len() <= 64 + 1);
        assert_eq!(recent.bytes, 0);
    }
}
