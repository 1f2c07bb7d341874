//! Provides delegation depth: a parent's durable depth, the child's depth and the `max_depth`
//! cap.
//!
//! A session's depth is the larger of its header's `delegationDepth` (durable, a floor a resume can
//! never lower) and its runtime `subagent_depth`; absence is depth 0. A child is one deeper. Depths
//! stay within the JavaScript safe-integer range so logs remain readable by the TypeScript runtime.

use serde_json::Value;

use crate::actors::agent::AgentRef;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::header::MAX_SAFE_INTEGER;

/// Checks a `max_depth` cap.
///
/// # Errors
/// `INVALID_MAX_DEPTH`: "subagent max_depth must be a non-negative safe integer".
pub fn check_max_depth(max_depth: Option<u64>) -> Result<()> {
    match max_depth {
        Some(depth) if depth > MAX_SAFE_INTEGER => Err(invalid_max_depth()),
        _ => Ok(()),
    }
}

fn invalid_max_depth() -> SubagentError {
    SubagentError::new(
        ErrorCode::InvalidMaxDepth,
        "subagent max_depth must be a non-negative safe integer",
    )
}

/// Reads a `maxDepth` given as JSON (as a model-facing tool receives it): only a non-negative
/// safe integer is accepted (`-1`, `1.5`, `-0`, strings and 2^53 are refused).
///
/// # Errors
/// `INVALID_MAX_DEPTH`.
pub fn parse_max_depth(value: &Value) -> Result<u64> {
    let depth = match value {
        Value::Number(n) if n.is_u64() => n.as_u64(),
        _ => None,
    };
    let depth = depth.ok_or_else(invalid_max_depth)?;
    check_max_depth(Some(depth))?;
    Ok(depth)
}

/// The parent's delegation depth: the larger of its header floor and its runtime depth.
///
/// # Errors
/// `INVALID_SUBAGENT_DEPTH` when the runtime depth is outside the safe-integer range.
pub fn delegation_depth_of(parent: &AgentRef) -> Result<u64> {
    let runtime = parent.options().subagent_depth;
    if runtime > MAX_SAFE_INTEGER {
        return Err(SubagentError::new(
            ErrorCode::InvalidSubagentDepth,
            "agent subagentDepth must be a non-negative safe integer",
        ));
    }
    let durable = parent.header().delegation_depth.unwrap_or(0);
    Ok(durable.max(runtime))
}

/// The depth of a child of `parent`, checked against `max_depth`.
///
/// # Errors
/// `INVALID_MAX_DEPTH`, `INVALID_SUBAGENT_DEPTH`, `DEPTH_OVERFLOW` ("subagent child depth
/// exceeds the safe-integer range"), `DEPTH_EXCEEDED` ("subagent depth A exceeds max_depth M").
pub fn resolve_child_depth(parent: &AgentRef, max_depth: Option<u64>) -> Result<u64> {
    check_max_depth(max_depth)?;
    let depth = delegation_depth_of(parent)?
        .checked_add(1)
        .filter(|depth| *depth <= MAX_SAFE_INTEGER)
        .ok_or_else(|| {
            SubagentError::new(
                ErrorCode::DepthOverflow,
                "subagent child depth exceeds the safe-integer range",
            )
        })?;
    if let Some(cap) = max_depth {
        if depth > cap {
            return Err(SubagentError::new(
                ErrorCode::DepthExceeded,
                format!("subagent depth {depth} exceeds max_depth {cap}"),
            ));
        }
    }
    Ok(depth)
}
