//! Provides the task check of the product providers: a one-shot task is text and not blank.

use crate::content::ContentBlock;
use crate::error::{ErrorCode, Result, SubagentError};

/// The task's text blocks: a non-empty list of text blocks, not all blank.
///
/// # Errors
/// `"<prefix>: the one-shot task must contain only text blocks"` (also for no block), or
/// `"<prefix>: the one-shot task must not be empty"` (`INVALID_ARGS`).
pub fn task_texts<'a>(prefix: &str, prompt: &'a [ContentBlock]) -> Result<Vec<&'a str>> {
    let texts: Option<Vec<&str>> = prompt.iter().map(ContentBlock::as_text).collect();
    let texts = texts.filter(|texts| !texts.is_empty()).ok_or_else(|| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("{prefix}: the one-shot task must contain only text blocks"),
        )
    })?;
    if texts.iter().all(|text| text.trim().is_empty()) {
        return Err(SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("{prefix}: the one-shot task must not be empty"),
        ));
    }
    Ok(texts)
}
