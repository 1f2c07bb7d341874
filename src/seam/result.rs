//! Provides [`SubagentResult`]: the terminal outcome of a one-shot run.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::ContentBlock;
use crate::stop_reason::StopReason;

/// The terminal outcome of a run, resolved by [`crate::seam::SubagentRun::result`].
///
/// A non-`completed` stop reason means `output` may be partial: consumers map it to an error
/// rather than reporting partial output as success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentResult {
    /// The content of the child's last non-empty assistant message; failing that, its streamed
    /// text; failing that, nothing.
    pub output: Vec<ContentBlock>,
    /// The captured value, present only when a requested output schema was satisfied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Value>,
    /// Why the run ended.
    pub stop_reason: StopReason,
}

impl SubagentResult {
    /// A result with no output and no structured value.
    pub fn empty(stop_reason: StopReason) -> Self {
        Self {
            output: Vec::new(),
            structured: None,
            stop_reason,
        }
    }
}
