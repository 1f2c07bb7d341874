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
}
