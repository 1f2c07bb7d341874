//! Provides the seed rules: [`validate_seed`] and the lossless-JSON check.
//!
//! A seed handed to agent creation must start at seq 0 with no gaps, hold only lossless JSON,
//! pass every log invariant, and be balanced (no open turn or step, no dangling tool call).
//! Upstream checks only the first three; the balance rule is ours, because an unbalanced seed
//! would make the child's first `turn/start` break invariant 1.

use serde_json::Value;

use crate::content::{Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::event::{EventKind, SessionEvent};
use crate::session::invariants::LogShape;

/// Checks that `value` survives a JSON round trip unchanged: no `-0` (NaN and infinities cannot
/// be held by a `serde_json::Value` at all).
///
/// # Errors
/// `INVALID_EVENT` naming the path of the first lossy number.
pub fn check_lossless(value: &Value) -> Result<()> {
    fn walk(value: &Value, path: &mut String) -> std::result::Result<(), String> {
        match value {
            Value::Number(n) => {
                if n.as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()) && n.is_f64() {
                    return Err(format!("{path} is -0"));
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    walk(item, path)?;
                    path.truncate(len);
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    let len = path.len();
                    path.push('.');
                    path.push_str(key);
                    walk(item, path)?;
                    path.truncate(len);
                }
            }
            Value::Null | Value::Bool(_) | Value::String(_) => {}
        }
        Ok(())
    }
    walk(value, &mut String::from("$")).map_err(|why| {
        SubagentError::new(ErrorCode::InvalidEvent, format!("not lossless JSON: {why}"))
    })
}

/// The free-form JSON an event carries: extension payloads, tool metadata, and the open
/// `other` arm of message sources. Everything else is typed and lossless by construction.
pub(crate) fn free_form_json(kind: &EventKind) -> Vec<&Value> {
    fn source(message: &Message) -> Option<&Value> {
        match &message.source {
            MessageSource::Other(value) => Some(value),
            _ => None,
        }
    }
    match kind {
        EventKind::Extension { data, .. } => vec![data],
        EventKind::ToolResult { meta, message, .. } => {
            meta.as_deref().into_iter().chain(source(message)).collect()
        }
        EventKind::UserMessage(message) | EventKind::AssistantMessage { message, .. } => {
            source(message).into_iter().collect()
        }
        EventKind::InboxSpliced { inserted, .. } => inserted.iter().filter_map(source).collect(),
        _ => Vec::new(),
    }
}

/// Checks every seed rule and returns the seed's shape (for turn numbering).
///
/// # Errors
/// `INVALID_SEED` naming the first broken rule: a seq gap, lossy JSON, a broken invariant, or an
/// unbalanced end.
pub fn validate_seed(seed: &[SessionEvent]) -> Result<LogShape> {
    let invalid = |why: String| SubagentError::new(ErrorCode::InvalidSeed, why);
    let mut shape = LogShape::default();
    for (index, event) in seed.iter().enumerate() {
        let expected = u64::try_from(index).map_err(|_| invalid("seed too long".into()))?;
        if event.seq != expected {
            return Err(invalid(format!(
                "seed seq {} at position {index}: seqs must run from 0 without gaps",
                event.seq
            )));
        }
        for value in free_form_json(&event.kind) {
            check_lossless(value)
                .map_err(|e| invalid(format!("seed event {index}: {}", e.message())))?;
        }
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
