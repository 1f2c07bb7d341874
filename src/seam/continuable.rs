//! Provides the data of the continuable-children API: what a caller passes to `start_continuable`,
//! `followup`, `interrupt` and `report_from`, what they answer, and how the runtime frames a
//! child's report and its settled notice for the parent.
//!
//! A continuable child is one durable session with at most one resident Activation. The
//! continuation manager (`actors/manager.rs`) owns everything after the provider prepared the
//! child's creation spec; these types carry no capability, only requests and identities.

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::content::{ContentBlock, MessageSource};
use crate::host::{Budget, BudgetLimit, DelegatedPolicy};
use crate::ids::{MessageId, SessionId};
use crate::seam::ChildAgentOptions;
use crate::stop_reason::StopReason;
use crate::tools::ToolFilter;

/// What `start_continuable` is asked for: the provider, the delegation's durable label, the
/// delegating parent and prompt, optional composition inputs, and the caller's cancellation.
///
/// The child id is always minted by the manager (a caller never chooses it), and a
/// continuable child carries no output schema: structured output is one run's contract, not a
/// durable child's.
#[derive(Debug, Clone)]
pub struct ContinuableStartSpec {
    /// The subagent provider's name; it must offer `prepare_continuable`.
    pub provider: String,
    /// The delegation description, persisted as the child's durable label.
    pub label: String,
    /// The exact live delegating parent.
    pub parent: AgentRef,
    /// The initial prompt, delivered as the child's first inbox message.
    pub prompt: Vec<ContentBlock>,
    /// Model options for the child; unset fields come from the parent and are recorded in the
    /// descriptor so a cold resume uses the same route.
    pub agent_options: Option<ChildAgentOptions>,
    /// An absolute cap on the child's delegation depth (checked, never recorded).
    pub max_depth: Option<u64>,
    /// Global tools hidden from the child (recorded, re-applied on cold resume).
    pub tool_filter: Option<ToolFilter>,
    /// The child's persona (recorded, re-applied on cold resume).
    pub persona: Option<String>,
    /// The child's budget (recorded in its descriptor, carried across cold resume).
    pub budget: Option<Budget>,
    /// Owns the start only until the prompt is accepted into the child's inbox.
    pub cancel: CancellationToken,
    /// The cluster node the child is placed on (see [`ContinuableStartSpec::on_node`]).
    pub node: Option<crate::cluster::NodeId>,
    pub(crate) policy: Option<DelegatedPolicy>,
    /// The span current where the start was called, captured with the policy: the child's
    /// first epoch continues that trace.
    pub(crate) trace: tracing::Span,
}

impl ContinuableStartSpec {
    /// A start of `prompt` under `parent` on `provider`, labelled `label`.
    pub fn new(
        provider: impl Into<String>,
        label: impl Into<String>,
        parent: &AgentRef,
        prompt: Vec<ContentBlock>,
    ) -> Self {
        Self {
            provider: provider.into(),
            label: label.into(),
            parent: parent.clone(),
            prompt,
            agent_options: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
            budget: None,
            cancel: CancellationToken::new(),
            node: None,
            policy: None,
            trace: tracing::Span::none(),
        }
    }

    /// Places the child on cluster node `node` (this runtime's own node, or `None`, keeps it
    /// here): the child is created and resident there, its follow-ups and interrupts travel
    /// there, and its reports and settled notice come back. A fork placed elsewhere inherits its
    /// parent's completed turns there: they are flushed here and read from the shared store
    /// there (only a reference travels); a seed the store does not hold yet cannot be placed
    /// (`UNSUPPORTED_CAPABILITY`). A runtime in no cluster refuses any other
    /// node (`INVALID_ARGS`), and a node that is not a live member (none of that id, or one
    /// that stopped or left) fails the start, before anything is sent, with
    /// `SESSION_LEASED`. Once the start reached the node, the caller's token no longer stops
    /// it. A parent here whose child's node stops is told, within about a second of the node's
    /// membership expiring, that the child settled (`node-stopped`); a follow-up resumes it.
    #[must_use]
    pub fn on_node(mut self, node: crate::cluster::NodeId) -> Self {
        self.node = Some(node);
        self
    }

    /// Sets the child's model options.
    #[must_use]
    pub fn agent_options(mut self, options: ChildAgentOptions) -> Self {
        self.agent_options = Some(options);
        self
    }

    /// Caps the child's delegation depth.
    #[must_use]
    pub fn max_depth(mut self, depth: u64) -> Self {
        self.max_depth = Some(depth);
        self
    }

    /// Scopes the child's global tools.
    #[must_use]
    pub fn tool_filter(mut self, filter: ToolFilter) -> Self {
        self.tool_filter = Some(filter);
        self
    }

    /// Sets the child's persona.
    #[must_use]
    pub fn persona(mut self, persona: impl Into<String>) -> Self {
        self.persona = Some(persona.into());
        self
    }

    /// Limits what the child may spend over its whole life: the turn that crosses a limit ends
    /// `budget-exhausted`, and follow-ups are refused with `BUDGET_EXHAUSTED` until one raises the
    /// limit (see [`FollowupOptions::budget`]). A zero limit, or a wall time under 1 ms, is
    /// `INVALID_BUDGET`.
    #[must_use]
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets the caller's cancellation token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Captures the parent's delegated policy now, unless it already was.
    pub(crate) fn capture_policy(&mut self) {
        if self.policy.is_none() {
            self.policy = Some(crate::seam::child_run::delegated_policy(&self.parent, None));
        }
        self.trace = tracing::Span::current();
    }
}

/// The identities a continuable start answers once the child accepted its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinuableStart {
    /// The durable child session id, stable across Activations.
    pub child_id: SessionId,
    /// The accepted initial prompt's inbox message id.
    pub message_id: MessageId,
}

/// Options of one follow-up.
#[derive(Debug, Clone)]
pub struct FollowupOptions {
    /// Durable attribution kept on the delivered message; it grants no authority.
    pub source: MessageSource,
    /// Replaces the child's budget before the follow-up is admitted (a raise); recorded in the
    /// child's log as `subagent/budget` only once the follow-up is accepted.
    pub budget: Option<Budget>,
    /// Owns the follow-up only until inbox acceptance.
    pub cancel: CancellationToken,
    /// The follow-up's message id, chosen by the caller to make a retry idempotent: a
    /// follow-up whose id the child already accepted (pending, claimed or discarded) is
    /// answered with that first acceptance and runs no second time. `None`: a fresh id.
    pub message_id: Option<MessageId>,
}

impl FollowupOptions {
    /// A follow-up attributed to `source`, with a fresh token and a fresh message id.
    pub fn new(source: MessageSource) -> Self {
        Self {
            source,
            budget: None,
            cancel: CancellationToken::new(),
            message_id: None,
        }
    }

    /// Sends the follow-up under `id`: sent again under the same id (a retry after a lost
    /// answer), it is accepted once. Looking the id up reads the child's log, so a fresh
    /// follow-up is cheaper without one.
    #[must_use]
    pub fn message_id(mut self, id: MessageId) -> Self {
        self.message_id = Some(id);
        self
    }

    /// Sets the child's budget with this follow-up: the way to raise a spent limit. The new
    /// budget replaces the old one whole (a limit left unset is lifted); a budget that the
    /// child's spending already exhausts refuses the follow-up with `BUDGET_EXHAUSTED` and
    /// changes nothing.
    #[must_use]
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets the caller's cancellation token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }
}

/// The authority under which one interrupt is admitted.
#[derive(Debug, Clone)]
pub enum InterruptAuthority {
    /// A human client holding the target's durable direct-parent address.
    User {
        /// The parent session id the client presents.
        parent_session_id: SessionId,
    },
    /// An exact live agent whose recorded lineage the target's must contain.
    Ancestor(AgentRef),
}

/// How a report reaches the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReportDelivery {
    /// Injected context: no inbox turn, no wake; the parent reads it at its next step.
    Quiet,
    /// One ordinary later parent turn (a follow-up); never joins a turn already running.
    #[default]
    Wakeup,
}

/// Options of one report.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// The parent's scheduling policy, already resolved.
    pub delivery: ReportDelivery,
    /// Owns authorization and admission until acceptance.
    pub cancel: CancellationToken,
}

impl ReportOptions {
    /// A report delivered as `delivery`, with a fresh token.
    pub fn new(delivery: ReportDelivery) -> Self {
        Self {
            delivery,
            cancel: CancellationToken::new(),
        }
    }

    /// Sets the caller's cancellation token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }
}

/// The longest settled-notice summary kept in the message source, in characters.
pub const SETTLED_SUMMARY_LIMIT: usize = 120;

/// The content of a report: a header naming the child, then the selected blocks.
pub(crate) fn report_content(child: SessionId, content: Vec<ContentBlock>) -> Vec<ContentBlock> {
    let mut framed = Vec::with_capacity(content.len() + 1);
    framed.push(ContentBlock::text(format!(
        "Background subagent {child} reported:"
    )));
    framed.extend(content);
    framed
}

/// The one-line account of how a child's epoch ended; a spent budget names its limit.
pub(crate) fn settled_summary(
    child: SessionId,
    stop_reason: &StopReason,
    exhausted: Option<BudgetLimit>,
) -> String {
    if let Some(limit) = exhausted {
        let what = match limit {
            BudgetLimit::Turns => "turn",
            BudgetLimit::Tokens => "token",
            BudgetLimit::WallTime => "wall-time",
        };
        return format!("Background subagent {child} used up its {what} budget.");
    }
    let how = match stop_reason {
        StopReason::Completed => "finished and will do no further work unless you send it more.",
        StopReason::Aborted => "was stopped before it finished.",
        StopReason::MaxTokens => "ran out of room before it finished.",
        StopReason::Refusal => "declined the task.",
        StopReason::Error => "failed before it finished.",
        other => {
            return format!(
                "Background subagent {child} ended abnormally ({}) before it finished.",
                other.as_str()
            )
        }
    };
    format!("Background subagent {child} {how}")
}

/// The settled notice: the summary, then the closing message or its absence, attributed to the
/// runtime (`subagent-settled`), never to the child.
pub(crate) fn settled_notice(
    child: SessionId,
    stop_reason: &StopReason,
    exhausted: Option<BudgetLimit>,
    output: Option<Vec<ContentBlock>>,
) -> (Vec<ContentBlock>, MessageSource) {
    let summary = settled_summary(child, stop_reason, exhausted);
    let source = MessageSource::SubagentSettledNotice {
        summary: bound_summary(&summary),
        sender_session_id: child,
    };
    let mut content = Vec::with_capacity(3);
    content.push(ContentBlock::text(summary));
    if exhausted.is_some() {
        content.push(ContentBlock::text(
            "It takes no more work until a follow-up raises that budget.",
        ));
    }
    match output {
        Some(output) if !output.is_empty() => {
            content.push(ContentBlock::text("Its closing message:"));
            content.extend(output);
        }
        _ => content.push(ContentBlock::text("It left no closing message.")),
    }
    (content, source)
}

/// Bounds a summary to [`SETTLED_SUMMARY_LIMIT`] characters, ending a cut one with `…`.
fn bound_summary(summary: &str) -> String {
    // No longer in bytes means no longer in characters: most summaries need no count.
    if summary.len() <= SETTLED_SUMMARY_LIMIT || summary.chars().count() <= SETTLED_SUMMARY_LIMIT {
        return summary.to_owned();
    }
    let mut bounded: String = summary.chars().take(SETTLED_SUMMARY_LIMIT - 1).collect();
    bounded.push('\u{2026}');
    bounded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_follow_the_stop_reason() {
        let child = SessionId::new();
        assert!(settled_summary(child, &StopReason::Completed, None)
            .ends_with("finished and will do no further work unless you send it more."));
        assert!(
            settled_summary(child, &StopReason::Other("stalled".into()), None)
                .ends_with("ended abnormally (stalled) before it finished.")
        );
        let spent = settled_summary(
            child,
            &StopReason::BudgetExhausted,
            Some(BudgetLimit::WallTime),
        );
        assert!(spent.ends_with("used up its wall-time budget."));
        assert!(spent.chars().count() <= SETTLED_SUMMARY_LIMIT);
    }

    #[test]
    fn a_long_summary_is_bounded_with_an_ellipsis() {
        let long = "x".repeat(300);
        let bounded = bound_summary(&long);
        assert_eq!(bounded.chars().count(), SETTLED_SUMMARY_LIMIT);
        assert!(bounded.ends_with('\u{2026}'));
        assert_eq!(bound_summary("short"), "short");
    }

    #[test]
    fn a_notice_without_output_says_so() {
        let child = SessionId::new();
        let (content, source) = settled_notice(child, &StopReason::Refusal, None, None);
        assert_eq!(content.len(), 2);
        assert_eq!(
            content[1],
            ContentBlock::text("It left no closing message.")
        );
        assert!(matches!(
            source,
            MessageSource::SubagentSettledNotice { sender_session_id, .. } if sender_session_id == child
        ));
    }
}
