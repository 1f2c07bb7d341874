//! Provides [`SubagentIdentityUnit`] (`subagent`): a child's delegation identity, folded from
//! its `subagent/descriptor` events, last one wins.
//!
//! The fold has no failure channel: a malformed or unknown-version descriptor resets the
//! identity to the serializable null sentinel, and so does a log without any descriptor. Unlike
//! a resume (which reads the first descriptor of the child's own suffix), the listing lets a
//! child's own descriptor override one replayed from a fork-seeded ancestor.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::ProjectionUnit;
use crate::seam::descriptor::DESCRIPTOR_EVENT;
use crate::seam::{DelegationMode, SubagentDescriptor};
use crate::session::{EventKind, SessionEvent};

/// The key of the identity unit.
pub const IDENTITY_UNIT: &str = "subagent";

/// A child's identity as the listing serves it: mode, label, and the seq of the descriptor it
/// came from (the seq gate compares it with the header's seed length).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentIdentity {
    /// How the child was delegated.
    pub mode: DelegationMode,
    /// The delegation's label, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The seq of the descriptor this identity came from.
    pub seq: u64,
}

impl SubagentIdentity {
    /// Reads a unit view: `None` for the null sentinel or anything that is not an identity.
    pub fn from_view(view: &Value) -> Option<Self> {
        serde_json::from_value(view.clone()).ok()
    }
}

/// Folds `subagent/descriptor` events into a [`SubagentIdentity`] or `null`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SubagentIdentityUnit;

impl ProjectionUnit for SubagentIdentityUnit {
    fn key(&self) -> &str {
        IDENTITY_UNIT
    }

    fn state_version(&self) -> u32 {
        2
    }

    fn init(&self) -> Value {
        Value::Null
    }

    fn apply(&self, _state: &Value, event: &SessionEvent) -> Option<Value> {
        identity_after(event)
            .map(|identity| identity.map_or(Value::Null, |identity| json!(identity)))
    }
}

/// The identity after `event`: `None` when `event` is no descriptor (the identity stays), the
/// null sentinel (`Some(None)`) for a malformed or unknown-version one.
pub(super) fn identity_after(event: &SessionEvent) -> Option<Option<SubagentIdentity>> {
    let EventKind::Extension { event_type, data } = &event.kind else {
        return None;
    };
    if event_type != DESCRIPTOR_EVENT {
        return None;
    }
    let identity = match SubagentDescriptor::from_json(data) {
        Ok(Some(descriptor)) => Some(SubagentIdentity {
            mode: descriptor.mode,
            label: descriptor.label,
            seq: event.seq,
        }),
        // Malformed and unknown-version descriptors are deliberately undistinguished.
        Ok(None) | Err(_) => None,
    };
    Some(identity)
}
