//! Paging out: a long-lived agent's settled events leave memory once the store has them.
//!
//! # Why
//! A root that has settled a million children held every event of its log and every message
//! of its history, about 2.2 KB a child, although its next step reads only the newest
//! messages and the store holds them all. An agent whose [`crate::AgentOptions`] set
//! `resident_events` drops its older events, and the history entries they carry, at the end of
//! each turn ([`SessionLog::page_out`]).
//!
//! # What stays in memory
//! - every event not yet written to the store (the write-behind reads them from the log);
//! - the events from the last `turn/end` on: the open turn, and the end of what a fork
//!   inherits;
//! - every event a projection memo has not folded yet;
//! - the newest `resident_events` events.
//!
//! The log pages out in steps of `resident_events` events, so copying what stays costs O(1) an
//! appended event. Readers of the events held see the paged-out ones as absent
//! ([`crate::EventList::first_resident`]); the store has them, and a model call that needs the
//! whole history reads them back ([`SessionLog::complete_history`]).

use std::sync::Arc;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::event::{EventKind, SessionEvent};
use crate::session::history::{History, Projection};
use crate::session::invariants::LogShape;
use crate::session::log::{lock_state, stored_invariant_broken, LogState};
use crate::session::repair::{after_last_turn_end, interrupted_turn_closers_after};
use crate::session::SessionLog;
use crate::store::SessionPersistence;

impl SessionLog {
    /// Drops from memory the settled events below the newest `keep` that the store already
    /// has, once at least `2 × keep` events are held, with the history entries they carry (and
    /// those a read-back history holds again: see [`SessionLog::complete_history`]). See the
    /// module docs for what stays.
    pub(crate) fn page_out(&self, keep: usize) {
        self.page_out_stored(keep, false);
    }

    /// [`SessionLog::page_out`] for a log being loaded from the store, before its writer is
    /// attached: everything it holds is stored.
    pub(crate) fn page_out_loaded(&self, keep: usize) {
        self.page_out_stored(keep, true);
    }

    fn page_out_stored(&self, keep: usize, loaded: bool) {
        let mut state = lock_state(&self.inner);
        if let Some(below) = paging_point(&state, keep, loaded) {
            let id = state.header.id;
            state.events.page_out(below, id);
            tracing::trace!(session_id = %id, below, "paged out the settled events below");
        }
        let first_resident = state.events.first_resident();
        state
            .history
            .page_out(u64::try_from(first_resident).unwrap_or(u64::MAX));
    }

    /// Appends stored events read after the ones the log holds (a log loaded a part at a
    /// time: see [`SessionLog::page_out_loaded`]), each checked as a stored log's are.
    ///
    /// # Errors
    /// `STORE_CORRUPT` when an event is out of sequence or breaks a log invariant.
    pub(crate) fn extend_stored(&self, events: Vec<Arc<SessionEvent>>) -> Result<()> {
        let mut state = lock_state(&self.inner);
        let id = state.header.id;
        for event in events {
            let next = state.events.len();
            if usize::try_from(event.seq).ok() != Some(next) {
                return Err(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!(
                        "session {id}: stored event {} read where {next} was due",
                        event.seq
                    ),
                ));
            }
            state
                .shape
                .admit(&event)
                .map_err(|e| stored_invariant_broken(id, &e))?;
            state.history.push(&event);
            state.events.push(event);
        }
        Ok(())
    }

    /// The events that close an interrupted last turn, numbered after the log's last event;
    /// none for a log that ends between turns. Every event after the last `turn/end` is held
    /// (a page-out never passes it).
    pub(crate) fn interrupted_turn_closers(&self) -> Vec<Arc<SessionEvent>> {
        let state = lock_state(&self.inner);
        let (shape, open_from) =
            after_last_turn_end(state.events.iter()).unwrap_or((LogShape::default(), 0));
        let open = state
            .events
            .iter_from(usize::try_from(open_from).unwrap_or(usize::MAX));
        let next = u64::try_from(state.events.len()).unwrap_or(u64::MAX);
        interrupted_turn_closers_after(shape, open)
            .into_iter()
            .zip(next..)
            .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
            .collect()
    }

    /// The whole model history: the one held, or, when it lost entries to paging out, the
    /// history folded again from the store's copy of the paged-out events and the events
    /// held. The log keeps that one until its next page-out, so the later steps of a turn
    /// (and a fork child, which never pages out, all its steps) read nothing again.
    ///
    /// # Errors
    /// The store's, reading the paged-out events; `STORE_CORRUPT` when it no longer holds them
    /// all.
    pub(crate) async fn complete_history(&self, store: &dyn SessionPersistence) -> Result<History> {
        loop {
            let (paged, history) = {
                let state = lock_state(&self.inner);
                (state.events.paged(), state.history.snapshot())
            };
            let Some(paged) = paged.filter(|_| !history.is_complete()) else {
                return Ok(history);
            };
            let before = u64::try_from(paged.len).unwrap_or(u64::MAX);
            let prefix: Vec<Arc<SessionEvent>> =
                store.read_between(paged.session, 0, before).await?;
            if prefix.len() != paged.len {
                return Err(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!(
                        "session {}: the store holds {} of the {} events its log paged out",
                        paged.session,
                        prefix.len(),
                        paged.len
                    ),
                ));
            }
            // Folded before the lock is taken: appends wait only for the events held.
            let mut whole = Projection::of(&prefix);
            let mut state = lock_state(&self.inner);
            if state.events.paged() != Some(paged) {
                // Paged out further meanwhile: read what is missing now.
                continue;
            }
            for event in state.events.iter() {
                whole.push(event);
            }
            let history = whole.snapshot();
            state.history = whole;
            return Ok(history);
        }
    }
}

/// Where the log held in `state` may page out to, keeping its newest `keep` events: `None`
/// while fewer than `2 × keep` are held, or when nothing may leave (see the module docs). A
/// log being `loaded` from the store has every event it holds stored.
fn paging_point(state: &LogState, keep: usize, loaded: bool) -> Option<usize> {
    let first = state.events.first_resident();
    let len = state.events.len();
    let written = match &state.write_behind {
        _ if loaded => len,
        Some(write_behind) if !write_behind.uncommitted() && state.fault.is_none() => {
            usize::try_from(write_behind.written).unwrap_or(usize::MAX)
        }
        // Not in the store (or no longer written to it): nothing can be read back.
        _ => return None,
    };
    if len - first < keep.max(1).saturating_mul(2) {
        return None;
    }
    let turn_end = state
        .events
        .iter()
        .rev()
        .find(|event| matches!(event.kind, EventKind::TurnEnd { .. }))
        .and_then(|event| usize::try_from(event.seq).ok())?;
    let folded = state
        .memo
        .as_ref()
        .map_or(usize::MAX, |memo| memo.read_through(first));
    Some((len - keep).min(written).min(turn_end).min(folded))
}
