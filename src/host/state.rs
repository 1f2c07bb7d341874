//! Provides [`AgentState`]: the agent actor's state machine, kept apart from the actor so each
//! transition is a plain method that tests can drive without an actor system.
//!
//! # States
//! - **Admission** says what the agent accepts: `Open`; `Faulted` (a durable write failed: new
//!   sends are refused with `AGENT_FAULTED`, no turn starts); `Disposing` (refused with
//!   `AGENT_DISPOSED`, no turn starts). Once left, `Open` is never re-entered, and `Disposing`
//!   wins over `Faulted` for the refusal.
//! - **Phase** is `Idle` or `Running` one turn, with what happens once that turn ends
//!   ([`AfterTurn`]) and whether a waking `next-step` send is still unclaimed.
//! - **Parked** pending work (a keep-inbox cancel) waits for the next waking send.
//!
//! # Transitions
//! | event | from | to |
//! | --- | --- | --- |
//! | waking send | Idle, Open | Running (unparks) |
//! | waking send | Running, cancelled | the send goes to `next-turn`; the wake is latched |
//! | waking send | Running | unparks; a `next-step` send is marked unclaimed |
//! | turn ends | Running, `Retire` | the actor retires |
//! | turn ends | Running | Running again if a wake was latched, or if work is pending, not parked and admission is open; else Idle |
//! | cancel `disposed` | any | admission `Disposing` |
//! | cancel, keep inbox | Running | parked |
//! | cancel, discard | any | latched wake forgotten |
//! | fault | any | admission `Faulted`; a running turn is cancelled |
//! | failed claim | any | admission `Faulted`: a claim that cannot be journaled never restarts a turn |

use crate::error::{ErrorCode, SubagentError};
use crate::host::driver::TurnCancel;
use crate::ids::SessionId;
use crate::session::{CancelCause, InboxTarget};

use crate::actors::agent::{InboxPolicy, Wake};

/// What the agent accepts.
#[derive(Debug, Clone)]
pub(crate) enum Admission {
    Open,
    Faulted(SubagentError),
    Disposing,
}

/// What happens once the running turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterTurn {
    /// Run the next turn if work is pending and not parked.
    Continue,
    /// A waking send arrived after the turn was cancelled: run the next turn regardless of
    /// parking.
    Restart,
    /// Disposal arrived mid-turn: retire once the turn has closed.
    Retire,
}

/// The turn in flight.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) turn: u64,
    pub(crate) cancel: TurnCancel,
    pub(crate) after: AfterTurn,
    /// A waking `next-step` send arrived and no claim has taken it yet.
    pub(crate) step_wake_pending: bool,
}

/// Idle or running.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
    Idle,
    Running(Running),
}

/// What the actor does after a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing more.
    Stay,
    /// Open a turn now.
    StartTurn,
    /// Become idle and answer idle waiters.
    Idle,
    /// Stop: discard, unwind, stop the actor.
    Retire,
}

/// The agent actor's state.
#[derive(Debug, Clone)]
pub(crate) struct AgentState {
    pub(crate) admission: Admission,
    pub(crate) phase: Phase,
    pub(crate) parked: bool,
}

impl AgentState {
    pub(crate) fn new() -> Self {
        Self {
            admission: Admission::Open,
            phase: Phase::Idle,
            parked: false,
        }
    }

    /// The refusal of a new send, if the agent takes none.
    pub(crate) fn refusal(&self, id: SessionId) -> Option<SubagentError> {
        match &self.admission {
            Admission::Open => None,
            Admission::Disposing => Some(SubagentError::agent_gone(id)),
            Admission::Faulted(cause) => Some(SubagentError::new(
                ErrorCode::AgentFaulted,
                format!("agent {id} is faulted and takes no new work: {cause}"),
            )),
        }
    }

    fn running_cancelled(&self) -> bool {
        matches!(&self.phase, Phase::Running(running) if running.cancel.is_cancelled())
    }

    /// Where a send goes: a waking send after a cancel waits for the next turn.
    pub(crate) fn route(&self, target: InboxTarget, wake: Wake) -> InboxTarget {
        if wake == Wake::Wake && self.running_cancelled() {
            InboxTarget::NextTurn
        } else {
            target
        }
    }

    /// A send was journaled into `target`.
    pub(crate) fn delivered(&mut self, target: InboxTarget, wake: Wake) -> Next {
        if wake == Wake::Quiet {
            return Next::Stay;
        }
        let cancelled = self.running_cancelled();
        match &mut self.phase {
            Phase::Idle => {
                if !matches!(self.admission, Admission::Open) {
                    return Next::Stay;
                }
                self.parked = false;
                Next::StartTurn
            }
            Phase::Running(running) if cancelled => {
                if running.after == AfterTurn::Continue {
                    running.after = AfterTurn::Restart;
                }
                Next::Stay
            }
            Phase::Running(running) => {
                self.parked = false;
                // The driver may already be past its last claim: make sure the message is
                // picked up by a step of this turn or by the next turn.
                running.step_wake_pending |= target == InboxTarget::NextStep;
                Next::Stay
            }
        }
    }

    /// A turn was opened.
    pub(crate) fn turn_started(&mut self, turn: u64, cancel: TurnCancel) {
        self.phase = Phase::Running(Running {
            turn,
            cancel,
            after: AfterTurn::Continue,
            step_wake_pending: false,
        });
    }

    /// The running turn claimed `next-step`.
    pub(crate) fn step_claimed(&mut self) {
        if let Phase::Running(running) = &mut self.phase {
            running.step_wake_pending = false;
        }
    }

    /// The running turn ended; `next_turn_pending` is whether `next-turn` has work.
    pub(crate) fn turn_finished(&mut self, next_turn_pending: bool) -> Next {
        let Phase::Running(running) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return Next::Idle;
        };
        if running.after == AfterTurn::Retire {
            return Next::Retire;
        }
        if !matches!(self.admission, Admission::Open) {
            return Next::Idle;
        }
        let latched = running.after == AfterTurn::Restart;
        if latched {
            self.parked = false;
        }
        let pending = next_turn_pending || running.step_wake_pending;
        if latched || (!self.parked && pending) {
            Next::StartTurn
        } else {
            Next::Idle
        }
    }

    /// A cancel arrived. Returns the token of the running turn to cancel, and whether pending
    /// work is to be discarded.
    pub(crate) fn cancelled(
        &mut self,
        cause: &CancelCause,
        policy: InboxPolicy,
    ) -> (Option<TurnCancel>, bool) {
        if *cause == CancelCause::Disposed {
            self.admission = Admission::Disposing;
        }
        let token = match &mut self.phase {
            Phase::Running(running) => {
                if policy == InboxPolicy::Discard && running.after == AfterTurn::Restart {
                    running.after = AfterTurn::Continue;
                }
                if policy == InboxPolicy::Discard {
                    running.step_wake_pending = false;
                }
                Some(running.cancel.clone())
            }
            Phase::Idle => None,
        };
        if policy == InboxPolicy::Keep && token.is_some() {
            self.parked = true;
        }
        (token, policy == InboxPolicy::Discard)
    }

    /// Disposal arrived. Returns the running turn's token when the actor must wait for that turn
    /// to close before it retires; `None` means retire now.
    pub(crate) fn retire(&mut self) -> Option<TurnCancel> {
        self.admission = Admission::Disposing;
        match &mut self.phase {
            Phase::Running(running) => {
                running.after = AfterTurn::Retire;
                Some(running.cancel.clone())
            }
            Phase::Idle => None,
        }
    }

    /// A durable write failed (or a claim could not be journaled). Returns the running turn's
    /// token to cancel. The first fault is kept; disposal is never undone.
    pub(crate) fn faulted(&mut self, error: SubagentError) -> Option<TurnCancel> {
        if matches!(self.admission, Admission::Open) {
            self.admission = Admission::Faulted(error);
        }
        match &self.phase {
            Phase::Running(running) => Some(running.cancel.clone()),
            Phase::Idle => None,
        }
    }

    /// The running turn, if any.
    pub(crate) fn turn(&self) -> Option<u64> {
        match &self.phase {
            Phase::Running(running) => Some(running.turn),
            Phase::Idle => None,
        }
    }
}

impl Default for AgentState {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(state: &mut AgentState) -> TurnCancel {
        let cancel = TurnCancel::new();
        state.turn_started(1, cancel.clone());
        cancel
    }

    #[test]
    fn a_waking_send_starts_a_turn_only_when_idle_and_open() {
        let mut state = AgentState::new();
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Wake),
            Next::StartTurn
        );
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Quiet),
            Next::Stay
        );
        state.faulted(SubagentError::new(ErrorCode::StoreIo, "disk"));
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Wake),
            Next::Stay
        );
        let refusal = state
            .refusal(SessionId::new())
            .expect("a faulted agent refuses");
        assert_eq!(refusal.code(), ErrorCode::AgentFaulted);
    }

    #[test]
    fn a_wake_after_a_cancel_is_routed_to_the_next_turn_and_latched() {
        let mut state = AgentState::new();
        let cancel = running(&mut state);
        let (token, discard) = state.cancelled(&CancelCause::User, InboxPolicy::Keep);
        token
            .expect("the running turn is cancelled")
            .cancel(CancelCause::User);
        assert!(!discard);
        assert!(cancel.is_cancelled());
        assert!(state.parked, "keep-inbox parks pending work");
        assert_eq!(
            state.route(InboxTarget::NextStep, Wake::Wake),
            InboxTarget::NextTurn
        );
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Wake),
            Next::Stay
        );
        assert_eq!(
            state.turn_finished(false),
            Next::StartTurn,
            "the latched wake restarts"
        );
        assert!(!state.parked);
    }

    #[test]
    fn parked_work_waits_for_a_waking_send() {
        let mut state = AgentState::new();
        running(&mut state);
        state.cancelled(&CancelCause::User, InboxPolicy::Keep);
        assert_eq!(
            state.turn_finished(true),
            Next::Idle,
            "parked work does not run"
        );
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Wake),
            Next::StartTurn
        );
    }

    #[test]
    fn a_discard_forgets_a_latched_wake() {
        let mut state = AgentState::new();
        let cancel = running(&mut state);
        cancel.cancel(CancelCause::User);
        state.delivered(InboxTarget::NextTurn, Wake::Wake);
        state.cancelled(&CancelCause::User, InboxPolicy::Discard);
        assert_eq!(state.turn_finished(false), Next::Idle);
    }

    #[test]
    fn disposal_mid_turn_retires_when_the_turn_ends_and_never_restarts() {
        let mut state = AgentState::new();
        running(&mut state);
        assert!(state.retire().is_some(), "wait for the running turn");
        assert_eq!(
            state.delivered(InboxTarget::NextTurn, Wake::Wake),
            Next::Stay
        );
        assert_eq!(state.turn_finished(true), Next::Retire);
        let mut idle = AgentState::new();
        assert!(idle.retire().is_none(), "an idle agent retires at once");
    }

    #[test]
    fn a_faulted_agent_never_starts_another_turn() {
        let mut state = AgentState::new();
        running(&mut state);
        let token = state.faulted(SubagentError::new(ErrorCode::StoreIo, "disk"));
        assert!(token.is_some(), "the running turn is cancelled");
        assert_eq!(
            state.turn_finished(true),
            Next::Idle,
            "pending work does not restart a faulted agent (no hot loop)"
        );
        state.cancelled(&CancelCause::Disposed, InboxPolicy::Discard);
        assert_eq!(
            state.refusal(SessionId::new()).map(|e| e.code()),
            Some(ErrorCode::AgentDisposed),
            "disposal wins over the fault for refusals"
        );
    }

    #[test]
    fn a_running_next_step_wake_is_remembered_until_claimed() {
        let mut state = AgentState::new();
        running(&mut state);
        state.delivered(InboxTarget::NextStep, Wake::Wake);
        let mut claimed = state.clone();
        claimed.step_claimed();
        assert_eq!(claimed.turn_finished(false), Next::Idle);
        assert_eq!(state.turn_finished(false), Next::StartTurn);
    }
}
