//! Provides per-agent budgets: [`Budget`] (limits on turns, model tokens and wall time),
//! [`BudgetSpent`] (what an agent has used, folded from its log) and the crate's
//! `BudgetMeter`, which the turn driver charges as it runs.
//!
//! The runtime enforces a budget at three points, so the turn that crosses a limit is the one
//! that ends with `budget-exhausted`:
//! - a turn opens on a spent budget: it ends at once, before any step;
//! - a step's token usage reaches the token limit: the turn ends after that step;
//! - the wall-time limit passes mid-turn: the turn is cancelled where it stands.
//!
//! Only turns that reached a step count; wall time is the summed length of those turns, so an
//! idle child spends nothing while it waits for a follow-up.

use std::borrow::Borrow;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::session::{EventKind, SessionEvent, TokenUsage, TurnEndReason};

/// Optional limits on what an agent may spend. An unset limit never binds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Budget {
    /// The most turns that may reach the model.
    pub turns: Option<u64>,
    /// The most model tokens (input plus output, summed over every step).
    pub tokens: Option<u64>,
    /// The most wall time spent inside turns.
    pub wall_time: Option<Duration>,
}

impl Budget {
    /// A budget with no limits.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// Limits the turns that may reach the model.
    #[must_use]
    pub fn turns(mut self, turns: u64) -> Self {
        self.turns = Some(turns);
        self
    }

    /// Limits the model tokens (input plus output).
    #[must_use]
    pub fn tokens(mut self, tokens: u64) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Limits the wall time spent inside turns. A continuable child's budget records it in
    /// whole milliseconds, rounded up; under one millisecond it is refused (`INVALID_BUDGET`).
    #[must_use]
    pub fn wall_time(mut self, wall_time: Duration) -> Self {
        self.wall_time = Some(wall_time);
        self
    }

    /// True when no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.turns.is_none() && self.tokens.is_none() && self.wall_time.is_none()
    }

    /// The first limit `spent` has reached, in the order turns, tokens, wall time.
    pub fn exhausted_by(&self, spent: &BudgetSpent) -> Option<BudgetLimit> {
        let reached = |limit: Option<u64>, used: u64| limit.is_some_and(|limit| used >= limit);
        if reached(self.turns, spent.turns) {
            Some(BudgetLimit::Turns)
        } else if reached(self.tokens, spent.tokens) {
            Some(BudgetLimit::Tokens)
        } else if self.wall_time.is_some_and(|limit| spent.wall_time >= limit) {
            Some(BudgetLimit::WallTime)
        } else {
            None
        }
    }
}

/// Which limit of a [`Budget`] was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetLimit {
    /// The turn limit.
    Turns,
    /// The token limit.
    Tokens,
    /// The wall-time limit.
    WallTime,
}

impl BudgetLimit {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turns => "turns",
            Self::Tokens => "tokens",
            Self::WallTime => "wall-time",
        }
    }
}

impl fmt::Display for BudgetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an agent has spent against its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetSpent {
    /// Turns that reached the model.
    pub turns: u64,
    /// Model tokens, input plus output.
    pub tokens: u64,
    /// Wall time inside those turns.
    pub wall_time: Duration,
}

impl BudgetSpent {
    /// Folds what `events` spent: turns that stepped, the usage of every model call, and the
    /// length of every turn (a crash-repaired turn counts up to its last event before the
    /// repair, so downtime is never charged).
    pub fn fold<E: Borrow<SessionEvent>>(events: &[E]) -> Self {
        let mut spent = Self::default();
        let mut open: Option<(u64, bool)> = None;
        let mut last_time = 0;
        for event in events {
            let event = event.borrow();
            match &event.kind {
                EventKind::TurnStart { .. } => open = Some((event.time, false)),
                EventKind::StepStart { .. } => {
                    if let Some((_, stepped)) = open.as_mut() {
                        *stepped = true;
                    }
                }
                EventKind::AssistantMessage {
                    usage: Some(usage), ..
                } => spent.tokens = spent.tokens.saturating_add(tokens_of(usage)),
                EventKind::TurnEnd { reason, .. } => {
                    if let Some((started, stepped)) = open.take() {
                        let ended = match reason {
                            TurnEndReason::Interrupted => last_time,
                            _ => event.time,
                        };
                        spent.wall_time += Duration::from_millis(ended.saturating_sub(started));
                        spent.turns += u64::from(stepped);
                    }
                }
                _ => {}
            }
            last_time = event.time;
        }
        spent
    }
}

/// The tokens one model call spends against a budget: input plus output.
pub(crate) fn tokens_of(usage: &TokenUsage) -> u64 {
    usage.input_tokens.saturating_add(usage.output_tokens)
}

/// An agent's live budget: its limits and what it has spent, shared by the agent actor, its
/// turn driver and the continuation manager. The lock is never held across an await.
#[derive(Debug, Clone)]
pub(crate) struct BudgetMeter(Arc<Mutex<Metered>>);

#[derive(Debug)]
struct Metered {
    budget: Budget,
    spent: BudgetSpent,
}

impl BudgetMeter {
    /// A meter over `budget` that has already spent `spent` (folded from the log on resume).
    pub(crate) fn new(budget: Budget, spent: BudgetSpent) -> Self {
        Self(Arc::new(Mutex::new(Metered { budget, spent })))
    }

    fn lock(&self) -> MutexGuard<'_, Metered> {
        // A panic while holding this lock leaves plain counters behind: still usable.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The limit already reached, if any.
    pub(crate) fn exhausted(&self) -> Option<BudgetLimit> {
        let metered = self.lock();
        metered.budget.exhausted_by(&metered.spent)
    }

    /// The limits and the spending so far.
    pub(crate) fn snapshot(&self) -> (Budget, BudgetSpent) {
        let metered = self.lock();
        (metered.budget, metered.spent)
    }

    /// Replaces the limits (a parent raised them).
    pub(crate) fn set_budget(&self, budget: Budget) {
        self.lock().budget = budget;
    }

    /// The wall time left before the limit, if one is set.
    pub(crate) fn wall_time_left(&self) -> Option<Duration> {
        let metered = self.lock();
        metered
            .budget
            .wall_time
            .map(|limit| limit.saturating_sub(metered.spent.wall_time))
    }

    /// Charges a turn that reached its first step.
    pub(crate) fn charge_turn(&self) {
        self.lock().spent.turns += 1;
    }

    /// Charges a model call; answers whether the token limit is now reached.
    pub(crate) fn charge_tokens(&self, usage: &TokenUsage) -> bool {
        let mut metered = self.lock();
        metered.spent.tokens = metered.spent.tokens.saturating_add(tokens_of(usage));
        metered
            .budget
            .tokens
            .is_some_and(|limit| metered.spent.tokens >= limit)
    }

    /// Charges the wall time of a finished turn.
    pub(crate) fn charge_wall_time(&self, elapsed: Duration) {
        self.lock().spent.wall_time += elapsed;
    }
}

/// A budget raised together with a delivery: the new limits and the event that records them
/// in the agent's log.
#[derive(Debug, Clone)]
pub(crate) struct BudgetRaise {
    pub(crate) budget: Budget,
    pub(crate) record: EventKind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::Message;
    use crate::session::CancelCause;

    fn at(seq: u64, time: u64, kind: EventKind) -> SessionEvent {
        let mut event = SessionEvent::new(seq, kind);
        event.time = time;
        event
    }

    fn answered(turn: u64, usage: TokenUsage) -> EventKind {
        EventKind::AssistantMessage {
            turn,
            step: 1,
            message: Message::assistant(Vec::new(), "p", "m"),
            usage: Some(Box::new(usage)),
            interrupted: false,
        }
    }

    fn usage(input: u64, output: u64) -> TokenUsage {
        TokenUsage {
            input_tokens: input,
            output_tokens: output,
            ..TokenUsage::default()
        }
    }

    #[test]
    fn a_budget_names_the_first_limit_reached() {
        let budget = Budget::unlimited().turns(2).tokens(100);
        let mut spent = BudgetSpent::default();
        assert_eq!(budget.exhausted_by(&spent), None);
        spent.tokens = 100;
        assert_eq!(budget.exhausted_by(&spent), Some(BudgetLimit::Tokens));
        spent.turns = 2;
        assert_eq!(budget.exhausted_by(&spent), Some(BudgetLimit::Turns));
        let timed = Budget::unlimited().wall_time(Duration::from_secs(1));
        spent.wall_time = Duration::from_secs(1);
        assert_eq!(timed.exhausted_by(&spent), Some(BudgetLimit::WallTime));
        assert!(Budget::unlimited().is_unlimited());
        assert_eq!(Budget::unlimited().exhausted_by(&spent), None);
    }

    #[test]
    fn the_fold_counts_stepped_turns_tokens_and_turn_time() {
        let events = vec![
            at(0, 1_000, EventKind::TurnStart { turn: 1 }),
            at(1, 1_010, EventKind::StepStart { turn: 1, step: 1 }),
            at(2, 1_200, answered(1, usage(30, 12))),
            at(3, 1_250, EventKind::StepEnd { turn: 1, step: 1 }),
            at(
                4,
                1_300,
                EventKind::TurnEnd {
                    turn: 1,
                    reason: TurnEndReason::Completed,
                    traceparent: None,
                },
            ),
            // A turn that never stepped: its time counts, the turn does not.
            at(5, 5_000, EventKind::TurnStart { turn: 2 }),
            at(
                6,
                5_040,
                EventKind::TurnEnd {
                    turn: 2,
                    reason: TurnEndReason::Aborted {
                        reason: CancelCause::User,
                    },
                    traceparent: None,
                },
            ),
            // A crash-repaired turn is charged up to its last event before the repair.
            at(7, 9_000, EventKind::TurnStart { turn: 3 }),
            at(8, 9_100, EventKind::StepStart { turn: 3, step: 1 }),
            at(
                9,
                90_000,
                EventKind::TurnEnd {
                    turn: 3,
                    reason: TurnEndReason::Interrupted,
                    traceparent: None,
                },
            ),
        ];
        let spent = BudgetSpent::fold(&events);
        assert_eq!(spent.turns, 2);
        assert_eq!(spent.tokens, 42);
        assert_eq!(spent.wall_time, Duration::from_millis(300 + 40 + 100));
    }

    #[test]
    fn a_budget_exhausted_turn_end_round_trips_through_the_envelope() {
        let event = SessionEvent::new(
            3,
            EventKind::TurnEnd {
                turn: 1,
                reason: TurnEndReason::BudgetExhausted {
                    limit: BudgetLimit::WallTime,
                },
                traceparent: None,
            },
        );
        let wire = serde_json::to_string(&event).unwrap();
        assert!(
            wire.contains(r#"{"kind":"budget-exhausted","limit":"wall-time"}"#),
            "{wire}"
        );
        let back: SessionEvent = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.kind, event.kind);
    }

    #[test]
    fn the_meter_charges_and_reports_its_limit() {
        let meter = BudgetMeter::new(
            Budget::unlimited().tokens(50),
            BudgetSpent {
                tokens: 20,
                ..BudgetSpent::default()
            },
        );
        assert!(!meter.charge_tokens(&usage(10, 10)));
        assert_eq!(meter.exhausted(), None);
        assert!(meter.charge_tokens(&usage(5, 5)));
        assert_eq!(meter.exhausted(), Some(BudgetLimit::Tokens));
        meter.set_budget(Budget::unlimited().tokens(100));
        assert_eq!(meter.exhausted(), None);
        assert_eq!(meter.wall_time_left(), None);
        meter.set_budget(Budget::unlimited().wall_time(Duration::from_secs(2)));
        meter.charge_wall_time(Duration::from_millis(500));
        assert_eq!(meter.wall_time_left(), Some(Duration::from_millis(1_500)));
        meter.charge_turn();
        assert_eq!(meter.snapshot().1.turns, 1);
    }
}
