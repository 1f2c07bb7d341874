//! Provides [`SubagentDescriptor`]: the durable, log-only record of how a child was delegated
//! (`subagent/descriptor`), its snapshot and its strict fold.
//!
//! A one-shot descriptor holds exactly `{version, mode, provider, label?}`; a continuable one
//! holds `{version, mode, provider, label, agentProvider?, agentModel?, persona?, toolFilter?}`.
//! Depth, output schema and token caps are never recorded. The model never sees a descriptor.
//!
//! Version 2 is the format the TypeScript runtime writes and is what a descriptor without a
//! budget is written as, so every reader of that format still reads it. A continuable child started with a budget
//! is written as version 3, which adds `budget: {turns?, tokens?, wallTimeMs?}`: a reader that
//! knows only version 2 classifies it as unknown, not corrupt.
//!
//! Folding reads the **first** descriptor of a child's own events. A payload of another version
//! is unclassifiable (no descriptor), not an error; a malformed payload of a known version is an
//! `INVALID_DESCRIPTOR` error naming the first broken field.
use std::borrow::Borrow;
use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::Budget;
use crate::json::field;
use crate::seam::budget;
use crate::session::{EventKind, SessionEvent};
use crate::tools::ToolFilter;

/// The descriptor format version the TypeScript runtime writes: written for every descriptor
/// without a budget.
pub const SUBAGENT_DESCRIPTOR_VERSION: u64 = 2;

/// The descriptor format version written for a continuable child with a budget.
pub const BUDGETED_DESCRIPTOR_VERSION: u64 = 3;

/// The event type of a descriptor.
pub const DESCRIPTOR_EVENT: &str = "subagent/descriptor";

/// The fields a one-shot descriptor may carry.
const ONE_SHOT_FIELDS: &[&str] = &["version", "mode", "provider", "label"];

/// The fields a version-3 continuable descriptor may carry; version 2 has all but `budget`.
const CONTINUABLE_FIELDS: &[&str] = &[
    "version",
    "mode",
    "provider",
    "label",
    "agentProvider",
    "agentModel",
    "persona",
    "toolFilter",
    "budget",
];

/// How a child was delegated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelegationMode {
    /// One delegation, one result, always disposed.
    OneShot,
    /// A durable child that takes follow-ups.
    Continuable,
}

impl DelegationMode {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OneShot => "one-shot",
            Self::Continuable => "continuable",
        }
    }
}

/// The durable descriptor of a delegated child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentDescriptor {
    /// One-shot or continuable.
    pub mode: DelegationMode,
    /// The subagent provider's name.
    pub provider: String,
    /// The delegation's label (required for continuable children).
    pub label: Option<String>,
    /// The child's model provider route (continuable only).
    pub agent_provider: Option<String>,
    /// The child's model (continuable only).
    pub agent_model: Option<String>,
    /// The child's persona (continuable only).
    pub persona: Option<String>,
    /// The child's tool filter (continuable only).
    pub tool_filter: Option<ToolFilter>,
    /// The child's budget as set at start (continuable only; version 3).
    pub budget: Option<Budget>,
}

impl SubagentDescriptor {
    /// A one-shot descriptor.
    pub fn one_shot(provider: impl Into<String>, label: Option<String>) -> Self {
        Self {
            mode: DelegationMode::OneShot,
            provider: provider.into(),
            label,
            agent_provider: None,
            agent_model: None,
            persona: None,
            tool_filter: None,
            budget: None,
        }
    }

    /// A continuable descriptor with its required label.
    pub fn continuable(provider: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            mode: DelegationMode::Continuable,
            provider: provider.into(),
            label: Some(label.into()),
            agent_provider: None,
            agent_model: None,
            persona: None,
            tool_filter: None,
            budget: None,
        }
    }

    /// The payload, absent fields omitted.
    pub fn to_json(&self) -> Value {
        // Gathered first, so the map is allocated at its exact size: every child's log keeps
        // this payload for its whole life.
        let mut payload: Vec<(String, Value)> = Vec::with_capacity(8);
        let version = match self.budget {
            Some(_) => BUDGETED_DESCRIPTOR_VERSION,
            None => SUBAGENT_DESCRIPTOR_VERSION,
        };
        payload.push(("version".into(), json!(version)));
        payload.push(("mode".into(), json!(self.mode.as_str())));
        payload.push(("provider".into(), json!(self.provider)));
        let optional = [
            ("label", &self.label),
            ("agentProvider", &self.agent_provider),
            ("agentModel", &self.agent_model),
            ("persona", &self.persona),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                payload.push((key.into(), json!(value)));
            }
        }
        if let Some(filter) = &self.tool_filter {
            let mut object = Map::new();
            if let Some(allow) = &filter.allow {
                object.insert("allow".into(), json!(allow));
            }
            if !filter.deny.is_empty() {
                object.insert("deny".into(), json!(filter.deny));
            }
            payload.push(("toolFilter".into(), Value::Object(object)));
        }
        if let Some(limits) = &self.budget {
            payload.push(("budget".into(), Value::Object(budget::to_json(limits))));
        }
        Value::Object(payload.into_iter().collect())
    }

    /// The `subagent/descriptor` event kind carrying this descriptor.
    pub fn event(&self) -> EventKind {
        EventKind::Extension {
            event_type: DESCRIPTOR_EVENT.into(),
            data: self.to_json(),
        }
    }

    /// Reads a payload: `Ok(None)` for another version, an error for a malformed
    /// current-version payload.
    ///
    /// # Errors
    /// `INVALID_DESCRIPTOR` naming the broken field.
    pub fn from_json(payload: &Value) -> Result<Option<Self>> {
        let Value::Object(map) = payload else {
            return Err(invalid("payload must be an object"));
        };
        let version = map
            .get("version")
            .and_then(Value::as_f64)
            .ok_or_else(|| invalid("version must be a number"))?;
        let budgeted = match field(map, "version").and_then(Value::as_u64) {
            Some(SUBAGENT_DESCRIPTOR_VERSION) => false,
            Some(BUDGETED_DESCRIPTOR_VERSION) => true,
            _ => {
                tracing::debug!(version, "descriptor of another version is unclassifiable");
                return Ok(None);
            }
        };
        let mode = match field(map, "mode").and_then(Value::as_str) {
            Some("one-shot") => DelegationMode::OneShot,
            Some("continuable") => DelegationMode::Continuable,
            _ => return Err(invalid("mode must be \"one-shot\" or \"continuable\"")),
        };
        let allowed = match (mode, budgeted) {
            (DelegationMode::OneShot, _) => ONE_SHOT_FIELDS,
            (DelegationMode::Continuable, true) => CONTINUABLE_FIELDS,
            // Version 2 has every continuable field but the budget (the last one).
            (DelegationMode::Continuable, false) => {
                &CONTINUABLE_FIELDS[..CONTINUABLE_FIELDS.len() - 1]
            }
        };
        if let Some(unknown) = map.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(invalid(&format!("payload has unknown field \"{unknown}\"")));
        }
        let provider = required_string(map, "provider")?;
        let label = optional_string(map, "label")?;
        if mode == DelegationMode::Continuable && label.is_none() {
            return Err(invalid("label must be a string"));
        }
        Ok(Some(Self {
            mode,
            provider,
            label,
            agent_provider: optional_string(map, "agentProvider")?,
            agent_model: optional_string(map, "agentModel")?,
            persona: optional_string(map, "persona")?,
            tool_filter: field(map, "toolFilter")
                .map(parse_tool_filter)
                .transpose()?,
            budget: field(map, "budget").map(parse_budget).transpose()?,
        }))
    }

    /// Folds the first descriptor of `events` (a child's own events).
    ///
    /// # Errors
    /// `INVALID_DESCRIPTOR` for a malformed current-version payload.
    pub fn fold<E: Borrow<SessionEvent>>(events: &[E]) -> Result<Option<Self>> {
        let first = events.iter().find_map(|event| match &event.borrow().kind {
            EventKind::Extension { event_type, data } if event_type == DESCRIPTOR_EVENT => {
                Some(data)
            }
            _ => None,
        });
        match first {
            Some(payload) => Self::from_json(payload),
            None => Ok(None),
        }
    }
}

fn invalid(detail: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::InvalidDescriptor,
        format!("persisted subagent descriptor is invalid: {detail}"),
    )
}

fn required_string(map: &Map<String, Value>, key: &str) -> Result<String> {
    optional_string(map, key)?.ok_or_else(|| invalid(&format!("{key} must be a string")))
}

fn optional_string(map: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match field(map, key) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(invalid(&format!("{key} must be a string"))),
    }
}

fn parse_budget(value: &Value) -> Result<Budget> {
    let Value::Object(map) = value else {
        return Err(invalid("budget must be an object"));
    };
    budget::from_json(map, &[])
}

fn parse_tool_filter(value: &Value) -> Result<ToolFilter> {
    let Value::Object(map) = value else {
        return Err(invalid("toolFilter must be an object"));
    };
    if let Some(unknown) = map.keys().find(|key| *key != "allow" && *key != "deny") {
        return Err(invalid(&format!(
            "toolFilter has unknown field \"{unknown}\""
        )));
    }
    let names = |key: &str| -> Result<Option<BTreeSet<String>>> {
        match field(map, key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<BTreeSet<String>>>()
                .map(Some)
                .ok_or_else(|| invalid(&format!("toolFilter.{key} must be an array of strings"))),
            Some(_) => Err(invalid(&format!(
                "toolFilter.{key} must be an array of strings"
            ))),
        }
    };
    let allow = names("allow")?;
    let deny = names("deny")?;
    if allow.is_none() && deny.is_none() {
        return Err(invalid("toolFilter must declare allow and/or deny"));
    }
    Ok(ToolFilter {
        allow,
        deny: deny.unwrap_or_default(),
    })
}
