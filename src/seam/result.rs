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
    /// A provider's safe account of why a run failed (beside the three fields every
    /// result has: it never changes `stop_reason` or `output`). At most
    /// [`SubagentResult::DIAGNOSTIC_LIMIT`] bytes; see [`SubagentResult::with_diagnostic`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
}

impl SubagentResult {
    /// The most UTF-8 bytes a diagnostic keeps.
    pub const DIAGNOSTIC_LIMIT: usize = 4096;

    /// A result with no output and no structured value.
    pub fn empty(stop_reason: StopReason) -> Self {
        Self {
            output: Vec::new(),
            structured: None,
            stop_reason,
            diagnostic: None,
        }
    }

    /// A result with `output` (no structured value, no diagnostic).
    pub fn with_output(stop_reason: StopReason, output: Vec<ContentBlock>) -> Self {
        Self {
            output,
            ..Self::empty(stop_reason)
        }
    }

    /// Attaches `diagnostic`, cut to [`SubagentResult::DIAGNOSTIC_LIMIT`] bytes: a longer one is
    /// cut at a character boundary and ends with `\n[diagnostic truncated]`, the whole within
    /// the limit.
    #[must_use]
    pub fn with_diagnostic(mut self, diagnostic: impl Into<String>) -> Self {
        self.diagnostic = Some(bounded_diagnostic(diagnostic.into()));
        self
    }
}

/// Cuts `text` to the diagnostic limit, marking the cut.
fn bounded_diagnostic(mut text: String) -> String {
    const MARK: &str = "\n[diagnostic truncated]";
    if text.len() <= SubagentResult::DIAGNOSTIC_LIMIT {
        return text;
    }
    truncate_at_char(&mut text, SubagentResult::DIAGNOSTIC_LIMIT - MARK.len());
    text.push_str(MARK);
    text
}

/// Cuts `text` to at most `limit` bytes, at a character boundary.
pub(crate) fn truncate_at_char(text: &mut String, limit: usize) {
    if text.len() <= limit {
        return;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}
