//! Provides the safe words a product provider (Codex, Claude Code) reports a failure in: the
//! failure line `Product subagent failure (product: …; stage: …; category: …)` and the latest
//! unattended decision. Nothing here carries the product's own text, a command, a path or a
//! token.

use super::ExitOutcome;
use crate::error::{ErrorCode, SubagentError};

/// Where and why a product run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailureLine {
    pub(crate) product: &'static str,
    pub(crate) stage: &'static str,
    pub(crate) category: String,
    pub(crate) http_status: Option<u16>,
    /// The JSON-RPC error code the product answered with, for a protocol failure.
    pub(crate) rpc_code: Option<i64>,
    pub(crate) outcome: Option<ExitOutcome>,
}

impl FailureLine {
    pub(crate) fn new(
        product: &'static str,
        stage: &'static str,
        category: impl Into<String>,
    ) -> Self {
        Self {
            product,
            stage,
            category: category.into(),
            http_status: None,
            rpc_code: None,
            outcome: None,
        }
    }

    /// A failure the product answered with a JSON-RPC error: categorized by its code, which
    /// the line carries (the error's message and data never do).
    pub(crate) fn json_rpc(product: &'static str, stage: &'static str, code: i64) -> Self {
        let category = match code {
            -32700 => "parse-error",
            -32600 => "invalid-request",
            -32601 => "method-not-found",
            -32602 => "invalid-params",
            -32603 => "internal-error",
            -32000 => "auth-required",
            -32002 => "resource-not-found",
            _ => "json-rpc-error",
        };
        Self {
            rpc_code: Some(code),
            ..Self::new(product, stage, category)
        }
    }

    /// Adds how the process ended, when it had (an outcome already known stays).
    #[must_use]
    pub(crate) fn with_outcome(mut self, outcome: Option<ExitOutcome>) -> Self {
        self.outcome = self.outcome.or(outcome);
        self
    }

    /// `Product subagent failure (product: P; stage: S; category: C[; HTTP status: N][; exit
    /// code: N][; signal: S])`.
    pub(crate) fn line(&self) -> String {
        let mut line = format!(
            "Product subagent failure (product: {}; stage: {}; category: {}",
            self.product, self.stage, self.category
        );
        if let Some(status) = self.http_status {
            line.push_str(&format!("; HTTP status: {status}"));
        }
        if let Some(code) = self.rpc_code {
            line.push_str(&format!("; JSON-RPC code: {code}"));
        }
        let said = self
            .outcome
            .map(|outcome| outcome.to_string())
            .unwrap_or_default();
        if !said.is_empty() {
            line.push_str("; ");
            line.push_str(&said);
        }
        line.push(')');
        line
    }

    /// A failed start in these safe words (`CHILD_START_FAILED`, `"<prefix>: <line>"`); the
    /// raw cause stays the source, never the message.
    pub(crate) fn start_error(&self, prefix: &str, cause: SubagentError) -> SubagentError {
        SubagentError::new(
            ErrorCode::ChildStartFailed,
            format!("{prefix}: {}", self.line()),
        )
        .with_source(cause)
    }

    /// The run's diagnostic: the line, then the latest unattended decision, if any.
    pub(crate) fn diagnostic(&self, fact: Option<String>) -> String {
        match fact {
            Some(fact) => format!("{}\n{fact}", self.line()),
            None => self.line(),
        }
    }
}

/// An unattended decision a provider (or its product) made, in fixed words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fact {
    pub(crate) request: &'static str,
    pub(crate) decision: &'static str,
    pub(crate) reason: &'static str,
}

impl Fact {
    pub(crate) const fn new(
        request: &'static str,
        decision: &'static str,
        reason: &'static str,
    ) -> Self {
        Self {
            request,
            decision,
            reason,
        }
    }

    /// `<product> unattended decision (mode: M; request: R; decision: D): <reason>`.
    pub(crate) fn text(&self, product: &str, mode: &str) -> String {
        format!(
            "{product} unattended decision (mode: {mode}; request: {}; decision: {}): {}",
            self.request, self.decision, self.reason
        )
    }
}

/// Logs a published run's failure as the TypeScript runtime does:
/// `<prefix> "<name>": child run failed (error): <prefix>: <line>`. A cancelled run is not a
/// failure and is not logged. A macro, so each provider logs from a call site of its own.
macro_rules! log_run_failure {
    ($prefix:expr, $name:expr, $line:expr, $cancelled:expr) => {
        if !$cancelled {
            tracing::warn!(
                "{} \"{}\": child run failed (error): {}: {}",
                $prefix,
                $name,
                $prefix,
                $line
            );
        }
    };
}
pub(crate) use log_run_failure;
