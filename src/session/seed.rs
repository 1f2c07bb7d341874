//! Provides the seed rules: [`validate_seed`] and the lossless-JSON check.
//!
//! A seed handed to agent creation must start at seq 0 with no gaps, hold only lossless JSON,
//! pass every log invariant, and be balanced (no open turn or step, no dangling tool call).
//! The TypeScript runtime checks only the first three; the balance rule is ours, because an unbalanced seed
//! would make the child's first `turn/start` break invariant 1.

use std::sync::Arc;

use serde_json::Value;

use crate::content::{Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::event::{EventKind, SessionEvent};
use crate::session::event_list::EventList;
use crate::session::header::SeedReference;
use crate::session::history::History;
use crate::session::invariants::LogShape;
use crate::session::SessionLog;

/// How many references a reader may follow to resolve a seed: a fork of a fork of … deeper
/// than this stores its seed inline instead, so no read chains further.
pub const MAX_SEED_LINKS: u32 = 8;

/// The events a new session inherits: its seed.
///
/// A seed made from events ([`Seed::from`]) is checked by [`validate_seed`] when the session is
/// created and stored inline, as the session's first events. A fork's seed
/// ([`Seed::completed_turns_of`]) shares its parent's events instead of copying them, is
/// balanced by construction, and is stored **by reference** ([`SeedReference`]): the child's
/// stored log starts after it, and readers of the store resolve it from the parent's log.
#[derive(Debug, Clone, Default)]
pub struct Seed {
    events: EventList,
    /// Set for a fork of a stored parent: where its prefix lies in the store. The seed is
    /// stored by that reference unless the chain of forks is too long to follow
    /// ([`Seed::reference`]); a child placed on another node reads it there either way.
    prefix: Option<SeedReference>,
    /// The parent's log, whose prefix must be written before the child's creation is.
    source: Option<SessionLog>,
    /// The log shape after the seed, when known without checking it (a completed-turn prefix).
    shape: Option<LogShape>,
    /// The model history of the seed, when the parent's log still holds it (a fork of a live
    /// parent): the child shares it instead of folding the inherited events again.
    history: Option<History>,
}

impl Seed {
    /// The balanced prefix of `log` a fork child inherits: every event through the last
    /// `turn/end` (the in-flight turn is left out), or nothing before the first completed
    /// turn. The events, and the model history they make, are shared with `log`, not copied:
    /// O(log n) in the parent's length.
    pub fn completed_turns_of(log: &SessionLog) -> Self {
        let (events, history, parent, turn) =
            log.with_completed_turns(|header, events, history| {
                let parent = header.seed_reference.as_deref().copied();
                // By seq, not position: a paged-out log holds only its newest events.
                let Some((last, turn)) = events.iter().rev().find_map(|event| match event.kind {
                    EventKind::TurnEnd { turn, .. } => Some((event.seq, turn)),
                    _ => None,
                }) else {
                    return (EventList::default(), None, parent, 0);
                };
                let len = usize::try_from(last).map_or(usize::MAX, |last| last + 1);
                (events.prefix(len), history, parent, turn)
            });
        let Some(tail) = events.last() else {
            return Self::default();
        };
        let links = parent.map_or(1, |reference| reference.links.saturating_add(1));
        // A parent whose own creation has not committed may yet be rolled back, leaving nothing
        // to reference: its child keeps a copy (only a turn that ended before any step allows it).
        let prefix = log.is_committed().then(|| SeedReference {
            session: log.id(),
            length: u64::try_from(events.len()).unwrap_or(u64::MAX),
            tail: SeedReference::digest(tail),
            links,
        });
        Self {
            events,
            prefix,
            source: Some(log.clone()),
            shape: Some(LogShape::after_turn(turn)),
            history,
        }
    }

    /// The seed a child placed on this node inherits from its parent on another: the prefix
    /// `reference` names, as read from the shared store (`events`, seq 0 first). It is stored
    /// by reference again, unless the chain of forks grew past [`MAX_SEED_LINKS`].
    ///
    /// # Errors
    /// `STORE_CORRUPT` when `events` are not the whole prefix the reference names, or it does
    /// not end a turn (a fork's prefix always does).
    pub(crate) fn resolved(
        reference: SeedReference,
        events: Vec<Arc<SessionEvent>>,
    ) -> Result<Self> {
        let whole = u64::try_from(events.len()).ok() == Some(reference.length);
        let turn = match events.last() {
            Some(tail) if whole && SeedReference::digest(tail) == reference.tail => match tail.kind
            {
                EventKind::TurnEnd { turn, .. } => Some(turn),
                _ => None,
            },
            _ => None,
        };
        let turn = turn.ok_or_else(|| {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!(
                    "the seed a placed child inherits, the first {} events of session {}, is \
                     missing or changed",
                    reference.length, reference.session
                ),
            )
        })?;
        Ok(Self {
            events: events.into(),
            prefix: Some(reference),
            source: None,
            shape: Some(LogShape::after_turn(turn)),
            history: None,
        })
    }

    /// The inherited events, seq 0 first.
    pub fn events(&self) -> &EventList {
        &self.events
    }

    /// The number of inherited events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the seed inherits nothing.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Where the store finds the seed, when it is stored by reference: unless the chain of
    /// forks grew past [`MAX_SEED_LINKS`] and the seed is stored inline instead, which it can be
    /// only while every event of it is in memory (a fork of an agent that paged out its log
    /// keeps its reference, however long the chain).
    pub fn reference(&self) -> Option<&SeedReference> {
        self.prefix
            .as_ref()
            .filter(|prefix| prefix.links <= MAX_SEED_LINKS || self.events.first_resident() > 0)
    }

    /// Where a child placed on another node reads this seed from the shared store: the
    /// parent's stored prefix (`None` for a seed of events, or of a parent not yet stored).
    pub(crate) fn placement(&self) -> Option<SeedReference> {
        self.prefix
    }

    /// Waits until the log this seed comes from has flushed the prefix: before a child on
    /// another node reads it from the shared store.
    ///
    /// # Errors
    /// The source log's fault.
    pub(crate) async fn flush_source(&self) -> Result<()> {
        match (&self.source, self.prefix) {
            (Some(source), Some(prefix)) => source.flushed_through(prefix.length).await,
            _ => Ok(()),
        }
    }

    /// Takes the log a seed stored by reference comes from: the child's creation must wait
    /// until that log has written the referenced prefix.
    pub(crate) fn take_source(&mut self) -> Option<SessionLog> {
        let by_reference = self.reference().is_some();
        self.source.take().filter(|_| by_reference)
    }

    /// The seed's parts, for the log that takes it: its events, reference, shape (checked
    /// here when not known) and model history (when known without folding the events).
    ///
    /// # Errors
    /// `INVALID_SEED` for a seed made from events that breaks a seed rule.
    pub(crate) fn into_parts(
        self,
    ) -> Result<(EventList, Option<SeedReference>, LogShape, Option<History>)> {
        let reference = self.reference().copied();
        let shape = match self.shape {
            Some(shape) => shape,
            None => validated_shape(self.events.iter().map(|event| &**event))?,
        };
        Ok((self.events, reference, shape, self.history))
    }
}

impl From<Vec<SessionEvent>> for Seed {
    /// A seed of the given events, checked when the session is created and stored inline.
    fn from(events: Vec<SessionEvent>) -> Self {
        Self {
            events: events.into_iter().map(Arc::new).collect(),
            ..Self::default()
        }
    }
}

impl PartialEq for Seed {
    /// Two seeds are equal when they hold equal events stored the same way.
    fn eq(&self, other: &Self) -> bool {
        self.reference() == other.reference() && self.events == other.events
    }
}

/// Checks that `value` survives a JSON round trip unchanged: no `-0` (NaN and infinities cannot
/// be held by a `serde_json::Value` at all).
///
/// # Errors
/// `INVALID_EVENT` naming the path of the first lossy number.
pub fn check_lossless(value: &Value) -> Result<()> {
    fn negative_zero(number: &serde_json::Number) -> bool {
        number.is_f64()
            && number
                .as_f64()
                .is_some_and(|f| f == 0.0 && f.is_sign_negative())
    }
    fn lossless(value: &Value) -> bool {
        match value {
            Value::Number(number) => !negative_zero(number),
            Value::Array(items) => items.iter().all(lossless),
            Value::Object(map) => map.values().all(lossless),
            Value::Null | Value::Bool(_) | Value::String(_) => true,
        }
    }
    // Names the path of the first lossy number; walked only once one is known to be there.
    fn lossy_path(value: &Value, path: &mut String) -> bool {
        match value {
            Value::Number(number) => negative_zero(number),
            Value::Array(items) => items.iter().enumerate().any(|(index, item)| {
                let len = path.len();
                path.push_str(&format!("[{index}]"));
                let found = lossy_path(item, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::Object(map) => map.iter().any(|(key, item)| {
                let len = path.len();
                path.push('.');
                path.push_str(key);
                let found = lossy_path(item, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::Null | Value::Bool(_) | Value::String(_) => false,
        }
    }
    // Every appended event with free-form JSON is checked: the common case allocates nothing.
    if lossless(value) {
        return Ok(());
    }
    let mut path = String::from("$");
    lossy_path(value, &mut path);
    Err(SubagentError::new(
        ErrorCode::InvalidEvent,
        format!("not lossless JSON: {path} is -0"),
    ))
}

/// Runs `check` over the free-form JSON an event carries (extension payloads, tool metadata,
/// and the open `other` arm of message sources), stopping at the first error. Everything else
/// is typed and lossless by construction.
pub(crate) fn check_free_form_json(
    kind: &EventKind,
    mut check: impl FnMut(&Value) -> Result<()>,
) -> Result<()> {
    fn source(message: &Message) -> Option<&Value> {
        match &message.source {
            MessageSource::Other(value) => Some(value),
            _ => None,
        }
    }
    match kind {
        EventKind::Extension { data, .. } => check(data),
        EventKind::ToolResult { meta, message, .. } => meta
            .as_deref()
            .into_iter()
            .chain(source(message))
            .try_for_each(check),
        EventKind::UserMessage(message) | EventKind::AssistantMessage { message, .. } => {
            source(message).map_or(Ok(()), check)
        }
        EventKind::InboxSpliced { inserted, .. } => {
            inserted.iter().filter_map(source).try_for_each(check)
        }
        _ => Ok(()),
    }
}

/// Checks every seed rule and returns the seed's shape (for turn numbering).
///
/// # Errors
/// `INVALID_SEED` naming the first broken rule: a seq gap, lossy JSON, a broken invariant, or an
/// unbalanced end.
pub fn validate_seed<E: std::borrow::Borrow<SessionEvent>>(seed: &[E]) -> Result<LogShape> {
    validated_shape(seed.iter().map(std::borrow::Borrow::borrow))
}

/// [`validate_seed`] over the seed's events in order.
fn validated_shape<'a>(seed: impl Iterator<Item = &'a SessionEvent>) -> Result<LogShape> {
    let invalid = |why: String| SubagentError::new(ErrorCode::InvalidSeed, why);
    let mut shape = LogShape::default();
    for (index, event) in seed.enumerate() {
        let expected = u64::try_from(index).map_err(|_| invalid("seed too long".into()))?;
        if event.seq != expected {
            return Err(invalid(format!(
                "seed seq {} at position {index}: seqs must run from 0 without gaps",
                event.seq
            )));
        }
        check_free_form_json(&event.kind, check_lossless)
            .map_err(|e| invalid(format!("seed event {index}: {}", e.message())))?;
        shape
            .admit(event)
            .map_err(|e| invalid(format!("seed breaks a log invariant: {}", e.message())))?;
    }
    if !shape.is_balanced() {
        return Err(invalid(
            "seed is unbalanced: it ends inside a turn, a step or a tool call".into(),
        ));
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_lossless_value_passes_and_a_negative_zero_is_named_by_its_path() {
        assert!(check_lossless(&json!({"a": [1, 0.0, {"b": "x"}], "c": null})).is_ok());
        let error =
            check_lossless(&json!({"a": [1, {"b": -0.0}], "c": -0.0})).expect_err("-0 is lossy");
        assert_eq!(error.code(), ErrorCode::InvalidEvent);
        assert!(
            error.message().contains("$.a[1].b is -0"),
            "the first lossy path: {}",
            error.message()
        );
        let error = check_lossless(&json!(-0.0)).expect_err("-0 is lossy");
        assert!(error.message().contains("$ is -0"), "{}", error.message());
    }

    /// A parent's completed turn, as a placed fork's node reads it from the store.
    fn stored_prefix() -> (SeedReference, Vec<Arc<SessionEvent>>) {
        let events: Vec<Arc<SessionEvent>> = [
            EventKind::TurnStart { turn: 1 },
            EventKind::TurnEnd {
                turn: 1,
                reason: crate::session::TurnEndReason::Completed,
                traceparent: None,
            },
        ]
        .into_iter()
        .zip(0..)
        .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
        .collect();
        let reference = SeedReference {
            session: crate::ids::SessionId::new(),
            length: 2,
            tail: SeedReference::digest(&events[1]),
            links: 1,
        };
        (reference, events)
    }

    #[test]
    fn a_placed_forks_seed_is_the_prefix_its_reference_names_or_corrupt() {
        let (reference, events) = stored_prefix();
        let seed = Seed::resolved(reference, events.clone()).unwrap();
        assert_eq!(
            seed.reference(),
            Some(&reference),
            "stored by reference again"
        );
        assert_eq!(seed.len(), 2);
        let (_, _, shape, _) = seed.into_parts().unwrap();
        assert_eq!(shape.last_turn(), 1);

        let long = SeedReference {
            links: MAX_SEED_LINKS + 1,
            ..reference
        };
        let copied = Seed::resolved(long, events.clone()).unwrap();
        assert_eq!(
            copied.reference(),
            None,
            "a chain too long to follow is copied"
        );
        assert_eq!(copied.placement(), Some(long));

        let short = Seed::resolved(reference, events[..1].to_vec()).expect_err("one event short");
        assert_eq!(short.code(), ErrorCode::StoreCorrupt);
        let changed = SeedReference {
            tail: reference.tail ^ 1,
            ..reference
        };
        let changed = Seed::resolved(changed, events).expect_err("another tail");
        assert_eq!(changed.code(), ErrorCode::StoreCorrupt);
    }
}
