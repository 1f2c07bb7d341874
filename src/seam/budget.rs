//! Provides the durable form of a continuable child's [`Budget`]: its JSON payload (inside a
//! version-3 descriptor, and in the `subagent/budget` event a raising follow-up appends), the
//! fold that finds a child's current budget, and the check that refuses a limit of zero.
//!
//! The descriptor records the budget set at start; each raise appends a `subagent/budget`
//! event to the child's own log, and the last one wins. Readers older than budgets skip the
//! event (it is an extension kind) and classify a version-3 descriptor as unknown, not corrupt.

use std::borrow::Borrow;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{Budget, BudgetLimit, BudgetSpent};
use crate::ids::SessionId;
use crate::json::field;
use crate::session::{EventKind, SessionEvent};

/// The event type a raising follow-up appends to the child's log.
pub const BUDGET_EVENT: &str = "subagent/budget";

/// The version of the `subagent/budget` payload.
const BUDGET_EVENT_VERSION: u64 = 1;

/// The budget as it is recorded: a limit of zero is refused (a child under it could never
/// run), and so is a wall-time limit under one millisecond; a wall-time limit is kept in whole
/// milliseconds (the unit of its durable record), rounded up, so the limit in force before a
/// cold resume is the one in force after it.
///
/// # Errors
/// `INVALID_BUDGET` naming the limit.
pub(crate) fn normalize(mut budget: Budget) -> Result<Budget> {
    let zero = [
        ("turns", budget.turns == Some(0)),
        ("tokens", budget.tokens == Some(0)),
        ("wall time", budget.wall_time == Some(Duration::ZERO)),
    ];
    if let Some((name, _)) = zero.iter().find(|(_, is_zero)| *is_zero) {
        return Err(SubagentError::new(
            ErrorCode::InvalidBudget,
            format!("a budget's {name} limit must be greater than zero"),
        ));
    }
    if let Some(wall_time) = budget.wall_time {
        if wall_time < Duration::from_millis(1) {
            return Err(SubagentError::new(
                ErrorCode::InvalidBudget,
                format!(
                    "a budget's wall time limit must be at least 1 ms (it is recorded in whole \
                     milliseconds), not {wall_time:?}"
                ),
            ));
        }
        let millis = wall_time.as_nanos().div_ceil(1_000_000);
        budget.wall_time = Some(Duration::from_millis(
            u64::try_from(millis).unwrap_or(u64::MAX),
        ));
    }
    Ok(budget)
}

/// The budget's limits as a JSON object (`turns`, `tokens`, `wallTimeMs`; unset ones omitted).
pub(crate) fn to_json(budget: &Budget) -> Map<String, Value> {
    let mut limits = Map::new();
    if let Some(turns) = budget.turns {
        limits.insert("turns".into(), json!(turns));
    }
    if let Some(tokens) = budget.tokens {
        limits.insert("tokens".into(), json!(tokens));
    }
    if let Some(wall_time) = budget.wall_time {
        let millis = u64::try_from(wall_time.as_millis()).unwrap_or(u64::MAX);
        limits.insert("wallTimeMs".into(), json!(millis));
    }
    limits
}

/// Reads the limits of `map`, ignoring the keys in `also` (the payload's own envelope).
///
/// # Errors
/// `INVALID_DESCRIPTOR` naming the broken field.
pub(crate) fn from_json(map: &Map<String, Value>, also: &[&str]) -> Result<Budget> {
    const LIMITS: [&str; 3] = ["turns", "tokens", "wallTimeMs"];
    if let Some(unknown) = map
        .keys()
        .find(|key| !LIMITS.contains(&key.as_str()) && !also.contains(&key.as_str()))
    {
        return Err(invalid(&format!("budget has unknown field \"{unknown}\"")));
    }
    let limit = |key: &str| -> Result<Option<u64>> {
        match field(map, key) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| invalid(&format!("budget.{key} must be a non-negative integer"))),
        }
    };
    Ok(Budget {
        turns: limit("turns")?,
        tokens: limit("tokens")?,
        wall_time: limit("wallTimeMs")?.map(Duration::from_millis),
    })
}

/// The `subagent/budget` event that raises a child's budget to `budget`.
pub(crate) fn budget_event(budget: &Budget) -> EventKind {
    let mut payload = to_json(budget);
    payload.insert("version".into(), json!(BUDGET_EVENT_VERSION));
    EventKind::Extension {
        event_type: BUDGET_EVENT.into(),
        data: Value::Object(payload),
    }
}

/// The child's current budget: the last `subagent/budget` event of its own events, else the
/// budget its descriptor recorded.
///
/// # Errors
/// `INVALID_DESCRIPTOR` for a malformed payload of the current version; a payload of another
/// version is skipped.
pub(crate) fn current<E: Borrow<SessionEvent>>(
    own: &[E],
    recorded: Option<Budget>,
) -> Result<Option<Budget>> {
    let last = own
        .iter()
        .rev()
        .find_map(|event| match &event.borrow().kind {
            EventKind::Extension { event_type, data } if event_type == BUDGET_EVENT => {
                Some(data.clone())
            }
            _ => None,
        });
    let Some(payload) = last else {
        return Ok(recorded);
    };
    let Value::Object(map) = &payload else {
        return Err(invalid("a budget event must be an object"));
    };
    if field(map, "version").and_then(Value::as_u64) != Some(BUDGET_EVENT_VERSION) {
        tracing::debug!("budget event of another version is skipped");
        return Ok(recorded);
    }
    from_json(map, &["version"]).map(Some)
}

/// Refuses work for `child` when `budget` is already spent: `BUDGET_EXHAUSTED`, naming the
/// limit and how much of it was used.
///
/// # Errors
/// `BUDGET_EXHAUSTED` when a limit of `budget` is reached by `spent`.
pub(crate) fn admit(child: SessionId, budget: &Budget, spent: &BudgetSpent) -> Result<()> {
    let Some(limit) = budget.exhausted_by(spent) else {
        return Ok(());
    };
    let used = match limit {
        BudgetLimit::Turns => format!("{} of {} turns", spent.turns, budget.turns.unwrap_or(0)),
        BudgetLimit::Tokens => format!("{} of {} tokens", spent.tokens, budget.tokens.unwrap_or(0)),
        BudgetLimit::WallTime => format!(
            "{} ms of {} ms",
            spent.wall_time.as_millis(),
            budget.wall_time.unwrap_or_default().as_millis()
        ),
    };
    Err(SubagentError::new(
        ErrorCode::BudgetExhausted,
        format!(
            "continuable child {child} has spent its {limit} budget ({used}); \
             send the follow-up with a raised budget"
        ),
    ))
}

fn invalid(detail: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::InvalidDescriptor,
        format!("persisted subagent budget is invalid: {detail}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind) -> SessionEvent {
        SessionEvent::new(0, kind)
    }

    #[test]
    fn a_zero_limit_or_a_sub_millisecond_wall_time_is_refused() {
        assert!(normalize(Budget::unlimited().turns(3)).is_ok());
        for budget in [
            Budget::unlimited().turns(0),
            Budget::unlimited().tokens(0),
            Budget::unlimited().wall_time(Duration::ZERO),
            Budget::unlimited().wall_time(Duration::from_nanos(999_999)),
        ] {
            let error = normalize(budget).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidBudget);
        }
    }

    #[test]
    fn a_wall_time_is_kept_in_whole_milliseconds_rounded_up() {
        let kept = |wall_time| normalize(Budget::unlimited().wall_time(wall_time)).unwrap();
        assert_eq!(
            kept(Duration::from_millis(1)).wall_time,
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            kept(Duration::from_nanos(1_000_001)).wall_time,
            Some(Duration::from_millis(2))
        );
        let budget = kept(Duration::from_micros(2_500));
        let recorded = from_json(&to_json(&budget), &[]).unwrap();
        assert_eq!(recorded, budget, "the record round-trips exactly");
    }

    #[test]
    fn admission_names_the_spent_limit() {
        let child = SessionId::new();
        let spent = BudgetSpent {
            turns: 2,
            tokens: 10,
            wall_time: Duration::from_millis(5),
        };
        assert!(admit(child, &Budget::unlimited().turns(3), &spent).is_ok());
        let error = admit(child, &Budget::unlimited().turns(2), &spent).unwrap_err();
        assert_eq!(error.code(), ErrorCode::BudgetExhausted);
        assert!(error.message().contains("turns budget (2 of 2 turns)"));
        let error = admit(child, &Budget::unlimited().tokens(10), &spent).unwrap_err();
        assert!(error.message().contains("tokens budget (10 of 10 tokens)"));
    }

    #[test]
    fn the_last_raise_wins_over_the_recorded_budget() {
        let recorded = Budget::unlimited().turns(1);
        assert_eq!(
            current::<SessionEvent>(&[], Some(recorded)).unwrap(),
            Some(recorded)
        );
        let raised = Budget::unlimited()
            .turns(4)
            .tokens(900)
            .wall_time(Duration::from_millis(1_500));
        let events = vec![
            event(budget_event(&Budget::unlimited().turns(2))),
            event(budget_event(&raised)),
        ];
        assert_eq!(current(&events, Some(recorded)).unwrap(), Some(raised));
    }

    #[test]
    fn a_budget_event_of_another_version_is_skipped_and_a_broken_one_is_invalid() {
        let recorded = Some(Budget::unlimited().turns(1));
        let later = event(EventKind::Extension {
            event_type: BUDGET_EVENT.into(),
            data: json!({"version": 2, "turns": "many"}),
        });
        assert_eq!(current(&[later], recorded).unwrap(), recorded);
        let broken = event(EventKind::Extension {
            event_type: BUDGET_EVENT.into(),
            data: json!({"version": 1, "turns": -1}),
        });
        let error = current(&[broken], recorded).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidDescriptor);
        assert!(error.message().contains("budget.turns"));
    }
}
