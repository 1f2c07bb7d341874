//! Provides [`SubagentCapabilities`]: the start-time features a provider advertises.

use serde::{Deserialize, Serialize};

/// Which start-time features a provider supports on the one-shot `start` path. The service
/// checks them before the provider is called: a request that needs a missing feature is refused
/// with `UNSUPPORTED_CAPABILITY`, never accepted and then ignored. Each flag matches one request
/// option: `output_schema`, `depth_limit` (`max_depth`), `tool_filter`, `persona`.
///
/// Continuable children are gated only by [`crate::seam::SubagentProvider::continuable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentCapabilities {
    /// Structured output against an object-rooted schema.
    pub output_schema: bool,
    /// An absolute delegation-depth cap.
    pub depth_limit: bool,
    /// Child tool scoping.
    pub tool_filter: bool,
    /// A per-child persona.
    pub persona: bool,
}

impl SubagentCapabilities {
    /// Every capability.
    pub const ALL: Self = Self {
        output_schema: true,
        depth_limit: true,
        tool_filter: true,
        persona: true,
    };

    /// No capability.
    pub const NONE: Self = Self {
        output_schema: false,
        depth_limit: false,
        tool_filter: false,
        persona: false,
    };
}
