//! The projection checkpoint cache: each delegated child's unit states, stored beside its log
//! as rows `{ver, seq, val, createdAt}`, so a listing can name a cold child without reading it.
//!
//! The cache is an accelerator only. Rows are written fail-soft at the end of a child's turns
//! and at its disposal, always after the log events they cover reached the store, so a row is
//! never ahead of the log. A row is read back only for the same session lifecycle (its
//! `createdAt`), of the unit's current state version; anything else — no row, a row that does
//! not decode, a store that fails — is no answer, and the listing refolds the log.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{CheckpointRow, ProjectionRegistry};
use crate::host::AgentEnv;
use crate::session::{SessionHeader, SessionLog, SessionOrigin};
use crate::store::SharedStore;

fn encode(row: &CheckpointRow, created_at: u64) -> Value {
    json!({
        "ver": row.version,
        "seq": row.seq,
        "val": row.state,
        "createdAt": created_at,
    })
}

fn decode(key: &str, value: &Value, created_at: u64) -> Option<CheckpointRow> {
    if value.get("createdAt")?.as_u64()? != created_at {
        return None;
    }
    Some(CheckpointRow {
        key: key.to_owned(),
        version: u32::try_from(value.get("ver")?.as_u64()?).ok()?,
        seq: value.get("seq")?.as_u64()?,
        state: value.get("val")?.clone(),
    })
}

/// The cached row of unit `key` for the session `header` describes; `None` for no usable row.
pub(crate) async fn cached_row(
    store: &SharedStore,
    key: &str,
    header: &SessionHeader,
) -> Option<CheckpointRow> {
    match store.cache_get(key, header.id).await {
        Ok(Some(value)) => decode(key, &value, header.created_at),
        Ok(None) => None,
        Err(error) => {
            tracing::debug!(session_id = %header.id, unit = key, %error, "projection cache read failed; refolding");
            None
        }
    }
}

/// Writes `log`'s checkpoint rows, fail-soft: a failed write is logged and the cache is left
/// as it was (a later listing refolds).
pub(crate) async fn write_rows(
    registry: &ProjectionRegistry,
    store: &SharedStore,
    log: &SessionLog,
    rows: Vec<CheckpointRow>,
) {
    let header = log.header();
    for row in rows {
        if !registry.is_latest_checkpoint(log, row.seq) {
            return;
        }
        if let Err(error) = store
            .cache_put(&row.key, header.id, encode(&row, header.created_at))
            .await
        {
            tracing::warn!(session_id = %header.id, unit = row.key, %error, "projection checkpoint write failed");
        }
    }
}

/// The registry and store that keep `log`'s checkpoint, when it has one: only delegated
/// children are listed, so only they are checkpointed.
pub(crate) fn checkpointing(
    env: &AgentEnv,
    log: &SessionLog,
) -> Option<(Arc<ProjectionRegistry>, SharedStore)> {
    let registry = env.projections.clone()?;
    let store = env.store.clone()?;
    (log.header().origin == Some(SessionOrigin::Subagent)).then_some((registry, store))
}

/// Checkpoints a closed child's log at its disposal (its events are all in the store), unless
/// the turn end before it already wrote the same rows.
pub(crate) async fn checkpoint_at_disposal(env: &AgentEnv, log: &SessionLog) {
    if let Some((registry, store)) = checkpointing(env, log) {
        let rows = registry.fresh_checkpoint(log);
        if !rows.is_empty() {
            write_rows(&registry, &store, log, rows).await;
        }
    }
}

/// Checkpoints a live child's log at the end of a turn: once the events reached the store, its
/// fresh rows are written. Runs on its own task; nothing waits for it.
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
