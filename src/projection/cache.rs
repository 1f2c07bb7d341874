//! The projection checkpoint cache: each delegated child's unit states, stored beside its log
//! as one record `{identity: {createdAt, cwd}, rows: {unit: {ver, seq, val}}}`, so a listing can
//! name a cold child without reading its log.
//!
//! The cache is an accelerator only. The record is written fail-soft at the end of a child's
//! turns, every so many events within a long turn, and at its disposal, always after the log
//! events it covers reached the store, so it is never ahead of the log. A record is read back
//! only for the same session lifecycle (`createdAt` and `cwd`), and a row only at its unit's
//! current state version; anything else — no record, a row that does not decode, a store that
//! fails — is no answer, and the listing refolds the log.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::native::FoldState;
use super::registry::{StateRow, StoredRow};
use super::{CheckpointRow, ProjectionRegistry};
use crate::host::AgentEnv;
use crate::seam::descriptor::DESCRIPTOR_EVENT;
use crate::session::{EventKind, SessionHeader, SessionLog, SessionOrigin};
use crate::store::{EncodedRow, SharedStore};

/// The store key under which a session's checkpoint record lives (one record per session).
pub const CHECKPOINT_RECORD: &str = "checkpoint";

/// The record: the session lifecycle it belongs to, and one row per unit, encoded as the
/// store keeps it. Written straight from the rows: building the record as a JSON value first
/// cost more than the rest of a child's last checkpoint.
fn encode(header: &SessionHeader, rows: &[StateRow]) -> crate::Result<EncodedRow> {
    #[derive(Serialize)]
    struct Record<'a> {
        identity: Lifecycle<'a>,
        rows: Rows<'a>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Lifecycle<'a> {
        created_at: u64,
        cwd: &'a Option<std::path::PathBuf>,
    }
    struct Rows<'a>(&'a [StateRow]);
    impl Serialize for Rows<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            #[derive(Serialize)]
            struct Row<'a> {
                ver: u32,
                seq: u64,
                val: &'a FoldState,
            }
            serializer.collect_map(self.0.iter().map(|row| {
                let fields = Row {
                    ver: row.version,
                    seq: row.seq,
                    val: &row.state,
                };
                (&row.key, fields)
            }))
        }
    }
    let record = Record {
        identity: Lifecycle {
            created_at: header.created_at,
            cwd: &header.cwd,
        },
        rows: Rows(rows),
    };
    EncodedRow::encode(&record).map_err(|error| {
        crate::SubagentError::new(
            crate::ErrorCode::InvalidProjection,
            format!(
                "session {}, its checkpoint record: {}",
                header.id,
                error.message()
            ),
        )
    })
}

/// The session lifecycle a record belongs to, as its `identity` holds it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lifecycle {
    created_at: u64,
    cwd: Option<std::path::PathBuf>,
}

impl Lifecycle {
    /// Whether this is the lifecycle of the session `header` describes.
    fn is_of(&self, header: &SessionHeader) -> bool {
        self.created_at == header.created_at && self.cwd == header.cwd
    }
}

/// The rows of a record, when it belongs to `header`'s lifecycle; a row that does not decode
/// is left out.
fn decode(value: &Value, header: &SessionHeader) -> Option<Vec<CheckpointRow>> {
    if !Lifecycle::deserialize(value.get("identity")?)
        .ok()?
        .is_of(header)
    {
        return None;
    }
    let rows = value.get("rows")?.as_object()?;
    Some(
        rows.iter()
            .filter_map(|(key, row)| {
                Some(CheckpointRow {
                    key: key.clone(),
                    version: u32::try_from(row.get("ver")?.as_u64()?).ok()?,
                    seq: row.get("seq")?.as_u64()?,
                    state: row.get("val")?.clone(),
                })
            })
            .collect(),
    )
}

/// The cached rows of the session `header` describes; `None` for no usable record (none, of
/// another lifecycle, undecodable, or a store that failed).
pub(crate) async fn cached_rows(
    store: &SharedStore,
    header: &SessionHeader,
) -> Option<Vec<CheckpointRow>> {
    match store.cache_get(CHECKPOINT_RECORD, header.id).await {
        Ok(Some(value)) => decode(&value, header),
        Ok(None) => None,
        Err(error) => {
            tracing::debug!(session_id = %header.id, %error, "projection cache read failed; refolding");
            None
        }
    }
}

/// Writes `log`'s checkpoint record, fail-soft: a failed write is logged and the cache is left
/// as it was (a later listing refolds). A write overtaken by a newer checkpoint is dropped.
async fn write_rows(
    registry: &ProjectionRegistry,
    store: &SharedStore,
    log: &SessionLog,
    rows: Vec<StateRow>,
) {
    let Some(seq) = rows.first().map(|row| row.seq) else {
        return;
    };
    if !registry.is_latest_checkpoint(log, seq) {
        return;
    }
    // Fenced by the lease the log was written under: a runtime that lost the session never
    // overwrites the row of the one that holds it now. A log with no lease was never stored
    // (a creation rolled back before it committed): it has no checkpoint to keep.
    let Some(lease) = log.lease_epoch() else {
        return;
    };
    let header = log.header();
    let written = match encode(&header, &rows) {
        Ok(record) => {
            store
                .cache_put_encoded(CHECKPOINT_RECORD, header.id, record, Some(lease))
                .await
        }
        Err(error) => Err(error),
    };
    match written {
        Ok(()) => registry.checkpoint_landed(log, seq),
        Err(error) => {
            tracing::warn!(session_id = %header.id, %error, "projection checkpoint write failed");
        }
    }
}

/// Whether `log` is a one-shot child's: its descriptor, the first among its own events (as
/// [`crate::seam::SubagentDescriptor::fold`] reads it), says so. One-shot children are the
/// delegation hot path and are never resumed, so they are not checkpointed: a listing names a
/// cold one from one inspection of its log. (Checkpointing them cost a third of a one-shot
/// run on the memory store.) The descriptor opens a child's own events, so this reads a few of
/// them, not the whole log from its end.
fn is_one_shot(log: &SessionLog) -> bool {
    log.with_own_events(|own| {
        for event in own {
            if let EventKind::Extension { event_type, data } = &event.kind {
                if event_type == DESCRIPTOR_EVENT {
                    return data.get("mode").and_then(Value::as_str) == Some("one-shot");
                }
            }
        }
        false
    })
}

/// The registry and store that keep `log`'s checkpoint, when it has one: only delegated
/// children are listed, so only they are checkpointed, and one-shot children never (see
/// [`is_one_shot`]), so theirs keep no throttle state either.
pub(crate) fn checkpointing(
    env: &AgentEnv,
    log: &SessionLog,
) -> Option<(Arc<ProjectionRegistry>, SharedStore)> {
    let registry = env.projections.as_ref()?;
    let store = env.store.as_ref()?;
    (env.projection_cache && log.origin() == Some(SessionOrigin::Subagent) && !is_one_shot(log))
        .then(|| (Arc::clone(registry), Arc::clone(store)))
}

/// How long a stored log is before a resume starts its projection cells from the checkpoint
/// record rather than folding the log: reading and decoding the record costs about what
/// folding a few dozen events does.
const SEED_FROM_CHECKPOINT_AT: u64 = 64;

/// Starts a resumed child's projection cells from its checkpoint record (see
/// [`ProjectionRegistry::seed`]) when its log is long enough for that to be the cheaper way,
/// so the checkpoints of its new epoch fold that epoch only. Fail-soft, as every read of the
/// cache: no usable record leaves the cells to the fold of the log.
pub(crate) async fn seed_at_resume(env: &AgentEnv, log: &SessionLog) {
    if log.len() < SEED_FROM_CHECKPOINT_AT {
        return;
    }
    let Some((registry, store)) = checkpointing(env, log) else {
        return;
    };
    let id = log.id();
    match store.cache_get_encoded(CHECKPOINT_RECORD, id).await {
        Ok(Some(record)) => seed_from_record(&registry, log, record.as_bytes()),
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(session_id = %id, %error, "projection cache read failed; refolding");
        }
    }
}

/// Seeds `log`'s cells from its encoded checkpoint `record` when the record is of `log`'s
/// lifecycle and decodes; anything else is no answer. Decoded as a value, the record cost more
/// than the fold it saves: only the lifecycle and each row's frame are decoded here, and a
/// row's state only for a unit that takes it.
fn seed_from_record(registry: &ProjectionRegistry, log: &SessionLog, record: &[u8]) {
    #[derive(serde::Deserialize)]
    struct Stored<'a> {
        identity: Lifecycle,
        #[serde(borrow)]
        rows: BTreeMap<Cow<'a, str>, StoredRow<'a>>,
    }
    let Ok(stored) = serde_json::from_slice::<Stored<'_>>(record) else {
        return;
    };
    if stored.identity.is_of(&log.header()) {
        registry.seed(
            log,
            stored.rows.iter().map(|(key, row)| (key.as_ref(), row)),
        );
    }
}

/// Within a long turn, a checkpoint is due after this many events...
const CHECKPOINT_EVERY_EVENTS: u64 = 256;
/// ...or this long after the last one.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// Checkpoints a live child's log at a step end when the throttle says it is due, so a long
/// turn's timing and identity reach the cache before the turn ends.
pub(crate) fn checkpoint_if_due(env: &AgentEnv, log: &SessionLog) {
    let Some((registry, _)) = checkpointing(env, log) else {
        return;
    };
    if registry.checkpoint_due(log, CHECKPOINT_EVERY_EVENTS, CHECKPOINT_INTERVAL) {
        checkpoint_after_turn(env, log);
    }
}

/// Checkpoints a closed child's log at its disposal (its events are all in the store), unless
/// the store already took a checkpoint of the whole log. Written even when the turn end before
/// it handed out the same rows, if that write has not landed: it runs on its own task, and a
/// released child should be served from the cache.
pub(crate) async fn checkpoint_at_disposal(env: &AgentEnv, log: &SessionLog) {
    if let Some((registry, store)) = checkpointing(env, log) {
        let rows = registry.final_checkpoint(log);
        write_rows(&registry, &store, log, rows).await;
    }
}

/// Checkpoints a live child's log (at the end of a turn, or when the throttle is due): once the
/// events reached the store, its fresh rows are written. Runs on its own task; nothing waits
/// for it.
pub(crate) fn checkpoint_after_turn(env: &AgentEnv, log: &SessionLog) {
    let Some((registry, store)) = checkpointing(env, log) else {
        return;
    };
    let rows = registry.fresh_checkpoint(log);
    if rows.is_empty() {
        return;
    }
    let log = log.clone();
    tokio::spawn(async move {
        // The rows never get ahead of the log: the store has every event they cover first.
        if log.drain().await.is_ok() {
            write_rows(&registry, &store, &log, rows).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;
    use crate::seam::SubagentDescriptor;
    use crate::session::{SessionEvent, SessionHeader};

    /// A child's log seeded with `seed` descriptors (a fork's inherited prefix), then its own.
    fn child_log(seed: &[SubagentDescriptor], own: &SubagentDescriptor) -> SessionLog {
        let seed: Vec<SessionEvent> = seed
            .iter()
            .zip(0..)
            .map(|(descriptor, seq)| SessionEvent::new(seq, descriptor.event()))
            .collect();
        let mut header = SessionHeader::new(SessionId::new());
        header.seed_length = Some(u64::try_from(seed.len()).expect("small"));
        let log = SessionLog::new(header, seed).expect("a valid seed");
        log.append(own.event()).expect("appended");
        log
    }

    /// A continuable child's events: its descriptor, then `turns` settled turns, each event
    /// 7 ms after the one before.
    fn settled_turns(label: &str, turns: u64) -> Vec<SessionEvent> {
        let descriptor = SubagentDescriptor::continuable("spawn", label).event();
        let kinds = std::iter::once(descriptor).chain((1..=turns).flat_map(|turn| {
            [
                EventKind::TurnStart { turn },
                EventKind::TurnEnd {
                    turn,
                    reason: crate::session::TurnEndReason::Completed,
                    traceparent: None,
                },
            ]
        }));
        kinds
            .zip(0..)
            .map(|(kind, seq)| {
                let mut event = SessionEvent::new(seq, kind);
                event.time = 1_000 + 7 * seq;
                event
            })
            .collect()
    }

    /// A log holding exactly `events` under `header`, as a resume loads it from the store.
    fn log_of(header: &SessionHeader, events: &[SessionEvent]) -> SessionLog {
        let events = events.iter().cloned().map(Arc::new).collect();
        SessionLog::from_stored(header.clone(), events).expect("a valid log")
    }

    /// Every unit's checkpoint state on `log`, as JSON, in the order of the unit keys (the
    /// identity unit's first).
    fn states(registry: &ProjectionRegistry, log: &SessionLog) -> Vec<(String, Value)> {
        let mut states: Vec<(String, Value)> = registry
            .final_checkpoint(log)
            .into_iter()
            .map(|row| (row.key, row.state.to_json()))
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        states
    }

    /// An edit of a stored checkpoint record.
    type Edit = fn(&mut Value);

    /// The checkpoint record `registry` writes for `log`, edited by `edit`.
    fn record_of(
        registry: &ProjectionRegistry,
        log: &SessionLog,
        edit: impl FnOnce(&mut Value),
    ) -> Vec<u8> {
        let rows = registry.final_checkpoint(log);
        let record = encode(&log.header(), &rows).expect("encodes");
        let mut value: Value = serde_json::from_slice(record.as_bytes()).expect("JSON");
        edit(&mut value);
        serde_json::to_vec(&value).expect("encodes")
    }

    /// A resumed child's cells start from its checkpoint record and fold only what follows it:
    /// a label edited in the record (the descriptor event is behind the row) shows through,
    /// and the turns after the row are folded on top. A record that cannot be trusted (of
    /// another lifecycle or state version, ahead of the log, a state that does not decode)
    /// leaves the unit to the fold of the whole log.
    #[test]
    fn a_resumed_log_folds_on_from_its_checkpoint_and_refolds_a_record_it_cannot_trust() {
        let registry = ProjectionRegistry::with_seam_units();
        let header = SessionHeader::new(SessionId::new());
        let events = settled_turns("worker", 40);
        let whole = states(&registry, &log_of(&header, &events));
        let prefix = log_of(&header, &events[..61]);
        let edited = |value: &mut Value| {
            value["rows"]["subagent"]["val"]["label"] = "edited".into();
        };

        let resumed = log_of(&header, &events);
        seed_from_record(&registry, &resumed, &record_of(&registry, &prefix, edited));
        let mut expected = whole.clone();
        expected[0].1["label"] = "edited".into();
        assert_eq!(states(&registry, &resumed), expected);

        let untrusted: [(&str, Edit); 4] = [
            ("another lifecycle", |value| {
                value["identity"]["createdAt"] = 1.into();
            }),
            ("another state version", |value| {
                value["rows"]["subagent"]["ver"] = 99.into();
            }),
            ("ahead of the log", |value| {
                value["rows"]["subagent"]["seq"] = 81.into();
            }),
            ("a state that does not decode", |value| {
                value["rows"]["subagent"]["val"] = "x".into();
            }),
        ];
        for (why, untrust) in untrusted {
            let resumed = log_of(&header, &events);
            let record = record_of(&registry, &prefix, |value| {
                edited(value);
                untrust(value);
            });
            seed_from_record(&registry, &resumed, &record);
            assert_eq!(states(&registry, &resumed)[0], whole[0], "{why}");
            assert_eq!(states(&registry, &resumed), whole, "{why}");
        }

        // Bytes that are not a record are no answer either.
        let resumed = log_of(&header, &events);
        seed_from_record(&registry, &resumed, b"not a record");
        assert_eq!(states(&registry, &resumed), whole);
    }

    #[test]
    fn a_child_is_one_shot_by_its_own_descriptor_not_its_inherited_one() {
        let one_shot = SubagentDescriptor::one_shot("fork", None);
        let continuable = SubagentDescriptor::continuable("fork", "worker");
        assert!(is_one_shot(&child_log(&[], &one_shot)));
        assert!(!is_one_shot(&child_log(&[], &continuable)));
        // A fork of a one-shot child inherits its descriptor in the seed.
        assert!(!is_one_shot(&child_log(
            std::slice::from_ref(&one_shot),
            &continuable
        )));
        assert!(is_one_shot(&child_log(
            std::slice::from_ref(&continuable),
            &one_shot
        )));
    }
}
