//! Provides [`StopReason`], why a subagent run or epoch ended: an open set.
//!
//! The known reasons are the seed's five, `completed`, `aborted`, `error`, `max-tokens` and
//! `refusal`, and this runtime's `budget-exhausted` (a continuable child spent its budget). A
//! backend may add more; they arrive as [`StopReason::Other`], and consumers must treat any
//! reason they do not know as a failure ([`StopReason::is_success`] is true for `completed`
//! only).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The child finished its work.
    Completed,
    /// The child was cancelled.
    Aborted,
    /// The child (or its model) failed.
    Error,
    /// The model hit its token limit; output may be partial.
    MaxTokens,
    /// The model or a hook refused.
    Refusal,
    /// The child's budget (turns, tokens or wall time) ran out; output may be partial.
    BudgetExhausted,
    /// A reason added by a backend; consumers treat it as a failure.
    Other(String),
}

impl StopReason {
    /// The wire string.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Error => "error",
            Self::MaxTokens => "max-tokens",
            Self::Refusal => "refusal",
            Self::BudgetExhausted => "budget-exhausted",
            Self::Other(other) => other,
        }
    }

    /// Parses a wire string; unknown strings become [`StopReason::Other`].
    pub fn parse(value: &str) -> Self {
        match value {
            "completed" => Self::Completed,
            "aborted" => Self::Aborted,
            "error" => Self::Error,
            "max-tokens" => Self::MaxTokens,
            "refusal" => Self::Refusal,
            "budget-exhausted" => Self::BudgetExhausted,
            other => Self::Other(other.to_owned()),
        }
    }

    /// True only for [`StopReason::Completed`]; every other reason, known or not, is a failure.
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Completed)
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StopReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        Ok(Self::parse(&value))
    }
}
