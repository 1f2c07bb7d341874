//! The Codex app-server wire's safe vocabulary: the failure line (`Product subagent failure
//! (product: Codex; stage: …; category: …)`), the error-info categories, the unattended
//! permission facts and the stderr signatures they are read from. Nothing here ever carries
//! the product's own error text, a command, a path or a token.

pub(crate) mod turn;

use serde_json::Value;

pub(crate) use crate::out_of_process::diagnostic::{Fact, FailureLine};

/// The message prefix of the Codex provider.
pub(crate) const PREFIX: &str = "subagent-codex";
/// The product, as the failure line and the facts name it.
pub(crate) const PRODUCT: &str = "Codex";

/// Where a Codex run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The handshake and the thread's start together, when their deadline passed.
    Startup,
    Initialize,
    ThreadStart,
    TurnStart,
    Turn,
    Process,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Initialize => "initialize",
            Self::ThreadStart => "thread-start",
            Self::TurnStart => "turn-start",
            Self::Turn => "turn",
            Self::Process => "process",
        }
    }
}

impl Stage {
    /// A failure at this stage in `category`.
    pub(crate) fn failure(self, category: impl Into<String>) -> FailureLine {
        FailureLine::new(PRODUCT, self.as_str(), category)
    }

    /// A failure at this stage in category `unknown`.
    pub(crate) fn unknown(self) -> FailureLine {
        self.failure("unknown")
    }
}

const STRING_CATEGORIES: [&str; 11] = [
    "contextWindowExceeded",
    "sessionBudgetExceeded",
    "usageLimitExceeded",
    "serverOverloaded",
    "cyberPolicy",
    "internalServerError",
    "unauthorized",
    "badRequest",
    "threadRollbackFailed",
    "sandboxError",
    "other",
];

const OBJECT_CATEGORIES: [&str; 5] = [
    "httpConnectionFailed",
    "responseStreamConnectionFailed",
    "responseStreamDisconnected",
    "responseTooManyFailedAttempts",
    "activeTurnNotSteerable",
];

/// The category (and HTTP status, where the variant carries one) of a failed turn's
/// `error.codexErrorInfo`. Anything this version does not know is `unknown`; the error's own
/// message is never read.
pub(crate) fn categorize(error: Option<&Value>) -> (String, Option<u16>) {
    let unknown = || ("unknown".to_owned(), None);
    let Some(info) = error.and_then(|error| error.get("codexErrorInfo")) else {
        return unknown();
    };
    if let Some(name) = info.as_str() {
        return match STRING_CATEGORIES.contains(&name) {
            true => (name.to_owned(), None),
            false => unknown(),
        };
    }
    let Some(object) = info.as_object() else {
        return unknown();
    };
    let mut entries = object.iter();
    let (Some((key, detail)), None) = (entries.next(), entries.next()) else {
        return unknown();
    };
    if !OBJECT_CATEGORIES.contains(&key.as_str()) || !detail.is_object() {
        return unknown();
    }
    // `turnKind` (activeTurnNotSteerable) is never exposed.
    let status = (key != "activeTurnNotSteerable")
        .then(|| detail.get("httpStatusCode").and_then(Value::as_u64))
        .flatten()
        .and_then(|code| u16::try_from(code).ok());
    (key.clone(), status)
}

const NO_APPROVAL: &str = "the provider does not grant interactive approval";

/// The unattended decisions of a Codex run, in fixed words.
pub(crate) mod facts {
    use super::{Fact, NO_APPROVAL};

    /// An approval request answered `cancel` or `decline`.
    pub(crate) fn approval(request: &'static str, cancelled: bool) -> Fact {
        let decision = if cancelled { "cancelled" } else { "declined" };
        Fact::new(request, decision, NO_APPROVAL)
    }

    pub(crate) const PERMISSION_GRANT: Fact = Fact::new(
        "permission grant",
        "denied",
        "the provider grants no additional turn permissions",
    );
    pub(crate) const USER_INPUT: Fact = Fact::new(
        "user input",
        "empty response",
        "the provider does not collect interactive answers",
    );
    pub(crate) const MCP_ELICITATION: Fact = Fact::new(
        "MCP elicitation",
        "declined",
        "the provider does not collect interactive MCP input",
    );
    pub(crate) const COMMAND_DECLINED: Fact = Fact::new(
        "command execution",
        "declined",
        "Codex declined the command under the selected permission mode",
    );
    pub(crate) const FILE_DECLINED: Fact = Fact::new(
        "file change",
        "declined",
        "Codex declined the file change under the selected permission mode",
    );
    pub(crate) const SANDBOX_FAILED: Fact = Fact::new(
        "sandbox execution",
        "failed",
        "Codex reported a sandbox failure",
    );
    pub(crate) const ESCALATION_DENIED: Fact = Fact::new(
        "command execution",
        "denied",
        "Codex rejected an escalation because the selected policy never asks for approval",
    );
    pub(crate) const SANDBOX_VIOLATION: Fact = Fact::new(
        "sandbox execution",
        "failed",
        "Codex reported a sandbox violation",
    );
}

/// The latest fact by observation order: an older observation (a replayed early item) never
/// replaces a newer one.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    latest: Option<(u64, Fact)>,
}

impl Facts {
    pub(crate) fn record(&mut self, fact: Fact, order: u64) {
        if self.latest.is_none_or(|(seen, _)| order >= seen) {
            self.latest = Some((order, fact));
        }
    }

    pub(crate) fn latest(&self) -> Option<Fact> {
        self.latest.map(|(_, fact)| fact)
    }
}

const SIGNATURES: [(&str, Fact); 2] = [
    (
        "approval policy is Never; reject command",
        facts::ESCALATION_DENIED,
    ),
    ("recorded sandbox violation:", facts::SANDBOX_VIOLATION),
];

/// Reads the two stderr signatures across chunk boundaries, keeping only a tail short enough
/// to complete one (never the raw text).
#[derive(Debug, Default)]
pub(crate) struct StderrSignatures {
    tail: String,
}

impl StderrSignatures {
    /// The fact the chunk completes, if any: when both appear, the later one.
    pub(crate) fn observe(&mut self, chunk: &str) -> Option<Fact> {
        let observed = format!("{}{chunk}", self.tail);
        let found = SIGNATURES
            .iter()
            .filter_map(|(signature, fact)| observed.rfind(signature).map(|at| (at, *fact)))
            .max_by_key(|(at, _)| *at)
            .map(|(_, fact)| fact);
        self.tail = Self::pending_prefix(&observed);
        found
    }

    /// The longest suffix of `observed` that is a proper prefix of a signature.
    fn pending_prefix(observed: &str) -> String {
        let longest = SIGNATURES.iter().map(|(s, _)| s.len()).max().unwrap_or(0);
        (1..longest)
            .rev()
            .filter(|&len| len <= observed.len() && observed.is_char_boundary(observed.len() - len))
            .map(|len| &observed[observed.len() - len..])
            .find(|suffix| {
                SIGNATURES.iter().any(|(signature, _)| {
                    signature.len() > suffix.len() && signature.starts_with(suffix)
                })
            })
            .unwrap_or_default()
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    // CODEX-44 (reference 13, 14, 15)
    #[test]
    fn categories_keep_only_known_names_and_integer_statuses() {
        let of = |info: Value| categorize(Some(&json!({ "codexErrorInfo": info })));
        assert_eq!(
            of(json!("usageLimitExceeded")),
            ("usageLimitExceeded".into(), None)
        );
        assert_eq!(of(json!("futureError")), ("unknown".into(), None));
        assert_eq!(
            of(json!({"httpConnectionFailed": {"httpStatusCode": 503}})),
            ("httpConnectionFailed".into(), Some(503))
        );
        assert_eq!(
            of(json!({"httpConnectionFailed": {"httpStatusCode": "503"}})),
            ("httpConnectionFailed".into(), None)
        );
        assert_eq!(
            of(json!({"activeTurnNotSteerable": {"turnKind": "review"}})),
            ("activeTurnNotSteerable".into(), None)
        );
        assert_eq!(
            of(json!({"httpConnectionFailed": null})),
            ("unknown".into(), None)
        );
        assert_eq!(
            of(json!({"httpConnectionFailed": {}, "otherVariant": {}})),
            ("unknown".into(), None)
        );
        assert_eq!(
            categorize(Some(&json!("SECRET_TOKEN"))),
            ("unknown".into(), None)
        );
        assert_eq!(categorize(None), ("unknown".into(), None));
    }

    // CODEX-45 (reference 23)
    #[test]
    fn stderr_signatures_match_across_chunks_and_the_later_one_wins() {
        let mut signatures = StderrSignatures::default();
        assert_eq!(
            signatures.observe("SECRET_TOKEN approval policy is Ne"),
            None
        );
        assert_eq!(
            signatures.observe("ver; reject command — /private/secret.txt"),
            Some(facts::ESCALATION_DENIED)
        );
        let both = "approval policy is Never; reject command\nrecorded sandbox violation: x";
        assert_eq!(signatures.observe(both), Some(facts::SANDBOX_VIOLATION));
        assert_eq!(
            signatures.observe(&format!("recorded sandbox violation: {}", "x".repeat(2048))),
            Some(facts::SANDBOX_VIOLATION)
        );
        assert!(signatures.tail.len() < 40);
    }
}
