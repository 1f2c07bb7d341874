//! Session projections: the timing unit (TIME-01..04), the identity unit's fold, and the
//! registry's watermark cells, registrations and containment.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use subagents::projection::{
    ProjectionUnit, SubagentIdentity, SubagentIdentityUnit, SubagentTimingUnit, IDENTITY_UNIT,
    TIMING_UNIT,
};
use subagents::seam::DelegationMode;
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{ErrorCode, EventKind, Runtime, SessionEvent, SubagentDescriptor, TurnEndReason};

use crate::support::{agent_with, memory_runtime, run_prompt};

/// An event of `kind` at `seq`, stamped `time`.
fn at(seq: u64, time: u64, kind: EventKind) -> SessionEvent {
    let mut event = SessionEvent::new(seq, kind);
    event.time = time;
    event
}

fn turn_start(seq: u64, time: u64) -> SessionEvent {
    at(seq, time, EventKind::TurnStart { turn: 1 })
}

fn turn_end(seq: u64, time: u64) -> SessionEvent {
    at(
        seq,
        time,
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
            traceparent: None,
        },
    )
}

fn descriptor(seq: u64, time: u64) -> SessionEvent {
    at(
        seq,
        time,
        SubagentDescriptor::continuable("spawn", "task").event(),
    )
}

/// Something unrelated to timing: an extension event of another type.
fn unrelated(seq: u64, time: u64) -> SessionEvent {
    at(
        seq,
        time,
        EventKind::Extension {
            event_type: "test/unrelated".into(),
            data: json!({}),
        },
    )
}

/// The view after `events`, folded both ways a unit folds: by copies (`apply`) and in place
/// (`apply_in_place`, which the registry uses); the two must agree on every state and on
/// whether each event changed it.
fn fold(unit: &dyn ProjectionUnit, events: &[SessionEvent]) -> Value {
    let mut state = unit.init();
    let mut in_place = unit.init();
    for event in events {
        let next = unit.apply(&state, event);
        let changed = unit.apply_in_place(&mut in_place, event);
        assert_eq!(
            changed,
            next.is_some(),
            "whether {event:?} changed the state"
        );
        if let Some(next) = next {
            state = next;
        }
        assert_eq!(in_place, state, "the state in place after {event:?}");
    }
    unit.view(&state).unwrap()
}

/// The states a fold may meet: the unit's own, in each shape it writes, and foreign ones (a
/// checkpoint row written by another build, a state a host unit of the same key left).
fn initial_states() -> Vec<Value> {
    vec![
        SubagentTimingUnit.init(),
        json!({"descriptorSeen": true, "settledMs": 40}),
        json!({"descriptorSeen": false, "settledMs": 0, "pendingTurnStart": 7}),
        json!({"descriptorSeen": true, "settledMs": 3, "active": {"since": 5, "through": 9}}),
        // Decodes, but is not as the unit writes it.
        json!({"descriptorSeen": true, "settledMs": 3, "extra": 1}),
        json!({"descriptorSeen": true, "settledMs": 3, "pendingTurnStart": null}),
        json!({"descriptorSeen": true, "settledMs": 3, "active": {"since": 5, "through": 9, "x": 0}}),
        // Does not decode.
        json!({"descriptorSeen": true, "settledMs": "many"}),
        json!({"active": {"since": 5}}),
        json!({"active": 5}),
        json!([1, 2]),
        Value::Null,
    ]
}

/// An event of one of the kinds the timing unit tells apart, at `time`.
fn timing_event(kind: u8, seq: u64, time: u64) -> SessionEvent {
    match kind % 4 {
        0 => turn_start(seq, time),
        1 => turn_end(seq, time),
        2 => descriptor(seq, time),
        _ => unrelated(seq, time),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// The timing unit folds any events from any state to the same state, and says the same
    /// about what changed, whether it folds by copies or in place (as the registry folds).
    #[test]
    fn the_timing_unit_folds_the_same_in_place_and_by_copies(
        initial in 0..12usize,
        events in proptest::collection::vec((0..4u8, 0..50u64), 0..24),
    ) {
        let unit = SubagentTimingUnit;
        let mut state = initial_states()[initial].clone();
        let mut in_place = state.clone();
        for (seq, (kind, time)) in events.into_iter().enumerate() {
            let event = timing_event(kind, seq as u64, time);
            let next = unit.apply(&state, &event);
            let changed = unit.apply_in_place(&mut in_place, &event);
            proptest::prop_assert_eq!(changed, next.is_some(), "whether {:?} changed the state", event);
            if let Some(next) = next {
                state = next;
            }
            proptest::prop_assert_eq!(&in_place, &state, "the state in place after {:?}", event);
        }
    }
}

// TIME-01 (adapted: the seam cannot be unloaded; "after unload" is a runtime without projections)
#[actix_rt::test]
async fn the_seam_units_register_with_the_projection_registry() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let registry = rt.projections().expect("projections are on by default");
    let agent = agent_with(&rt, |_| {}).await;
    let values = registry.snapshot(agent.agent().log()).unwrap().values;
    assert_eq!(values[TIMING_UNIT], json!({"settledMs": 0}));
    assert_eq!(values[IDENTITY_UNIT], Value::Null, "the null sentinel");
    agent.dispose().await.unwrap();
    let bare = Runtime::builder()
        .model("scripted", model)
        .without_projections()
        .build()
        .unwrap();
    assert!(bare.projections().is_none());
}

// TIME-02
#[test]
fn the_descriptor_resets_inherited_timing_and_later_turns_add_up() {
    let events = [
        turn_start(0, 100),
        descriptor(1, 110),
        turn_end(2, 300),
        turn_start(3, 1_000),
        descriptor(4, 1_100),
        turn_end(5, 4_100),
        turn_start(6, 10_000),
        turn_end(7, 12_000),
    ];
    assert_eq!(
        fold(&SubagentTimingUnit, &events),
        json!({"settledMs": 5_100})
    );
}

// TIME-03
#[test]
fn an_open_turn_is_exposed_and_reversed_boundaries_subtract_nothing() {
    let events = [
        turn_start(0, 1_000),
        descriptor(1, 1_100),
        turn_end(2, 900),
        turn_start(3, 2_000),
        unrelated(4, 2_500),
    ];
    assert_eq!(
        fold(&SubagentTimingUnit, &events),
        json!({"settledMs": 0, "active": {"since": 2_000, "through": 2_500}})
    );
}

// TIME-04
#[test]
fn completed_pre_descriptor_turns_and_unrelated_events_change_nothing() {
    let unit = SubagentTimingUnit;
    let initial = unit.init();
    assert_eq!(unit.apply(&initial, &unrelated(0, 1)), None);
    assert_eq!(unit.apply(&initial, &turn_end(1, 2)), None);
    let described = unit.apply(&initial, &descriptor(2, 3)).unwrap();
    assert_eq!(unit.apply(&described, &turn_end(3, 4)), None);
    assert_eq!(
        fold(
            &unit,
            &[turn_start(0, 100), turn_end(1, 200), descriptor(2, 300)]
        ),
        json!({"settledMs": 0})
    );
}

#[test]
fn the_identity_is_the_last_descriptor_and_a_bad_one_resets_it_to_null() {
    let unit = SubagentIdentityUnit;
    let first = at(
        0,
        1,
        SubagentDescriptor::continuable("spawn", "first").event(),
    );
    let second = at(
        1,
        2,
        SubagentDescriptor::continuable("spawn", "second").event(),
    );
    let malformed = at(
        2,
        3,
        EventKind::Extension {
            event_type: "subagent/descriptor".into(),
            data: json!({"version": 2, "mode": "continuable"}),
        },
    );
    let unknown = at(
        3,
        4,
        EventKind::Extension {
            event_type: "subagent/descriptor".into(),
            data: json!({"version": 99}),
        },
    );
    let identity = fold(&unit, &[first.clone(), second.clone()]);
    assert_eq!(
        SubagentIdentity::from_view(&identity),
        Some(SubagentIdentity {
            mode: DelegationMode::Continuable,
            label: Some("second".into()),
            seq: 1,
        })
    );
    // The sentinel survives a JSON round trip as a present null.
    let reset = fold(&unit, &[first.clone(), malformed]);
    assert_eq!(reset, Value::Null);
    let round_trip: Value =
        serde_json::from_str(&json!({ "subagent": reset }).to_string()).unwrap();
    assert_eq!(round_trip.get("subagent"), Some(&Value::Null));
    assert_eq!(fold(&unit, &[first, unknown]), Value::Null);
    assert_eq!(
        fold(&unit, &[second]),
        json!({"mode": "continuable", "label": "second", "seq": 1})
    );
}

/// A unit that counts the events it is shown.
struct Counting(Arc<AtomicUsize>);

impl ProjectionUnit for Counting {
    fn key(&self) -> &str {
        "counting"
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> Value {
        json!(0)
    }
    fn apply(&self, state: &Value, _: &SessionEvent) -> Option<Value> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Some(json!(state.as_u64().unwrap_or(0) + 1))
    }
}

#[actix_rt::test]
async fn a_live_snapshot_folds_only_what_was_appended_since_the_last_one() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let registry = rt.projections().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let _registration = registry
        .register(Arc::new(Counting(Arc::clone(&seen))))
        .unwrap();
    let agent = agent_with(&rt, |_| {}).await;
    let log = agent.agent().log();
    run_prompt(agent.agent(), "one").await;
    let first = registry.snapshot(log).unwrap();
    let len = agent.agent().log().len();
    assert_eq!(first.values["counting"], json!(len));
    assert_eq!(first.as_of_seq, Some(len - 1));
    assert_eq!(seen.load(Ordering::SeqCst) as u64, len);
    // Nothing new: no event is folded again.
    registry.snapshot(log).unwrap();
    assert_eq!(seen.load(Ordering::SeqCst) as u64, len);
    run_prompt(agent.agent(), "two").await;
    let grown = agent.agent().log().len();
    let second = registry.snapshot(log).unwrap();
    assert_eq!(second.values["counting"], json!(grown));
    assert_eq!(
        seen.load(Ordering::SeqCst) as u64,
        grown,
        "only the new events"
    );
    agent.dispose().await.unwrap();
}

/// A unit whose view always fails.
struct Broken;

impl ProjectionUnit for Broken {
    fn key(&self) -> &str {
        "broken"
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> Value {
        Value::Null
    }
    fn apply(&self, _: &Value, _: &SessionEvent) -> Option<Value> {
        None
    }
    fn view(&self, _: &Value) -> subagents::Result<Value> {
        panic!("a foreign unit's bug")
    }
}

#[actix_rt::test]
async fn registrations_are_counted_versions_must_agree_and_a_failing_unit_is_contained() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let registry = rt.projections().unwrap();
    let first = registry
        .register(Arc::new(Counting(Arc::default())))
        .unwrap();
    let second = registry
        .register(Arc::new(Counting(Arc::default())))
        .unwrap();
    struct OtherVersion;
    impl ProjectionUnit for OtherVersion {
        fn key(&self) -> &str {
            "counting"
        }
        fn state_version(&self) -> u32 {
            2
        }
        fn init(&self) -> Value {
            Value::Null
        }
        fn apply(&self, _: &Value, _: &SessionEvent) -> Option<Value> {
            None
        }
    }
    let refused = registry.register(Arc::new(OtherVersion)).err().unwrap();
    assert_eq!(refused.code(), ErrorCode::InvalidProjection);
    first.remove();
    assert!(
        registry.unit("counting").is_some(),
        "one registration is left"
    );
    second.remove();
    assert!(registry.unit("counting").is_none());
    let broken = registry.register(Arc::new(Broken)).unwrap();
    let agent = agent_with(&rt, |_| {}).await;
    let failed = registry.snapshot(agent.agent().log()).unwrap_err();
    assert!(failed.message().contains("broken"), "{failed}");
    broken.remove();
    assert!(registry.snapshot(agent.agent().log()).is_ok());
    agent.dispose().await.unwrap();
}

/// A unit whose `init` panics.
struct BrokenInit;

impl ProjectionUnit for BrokenInit {
    fn key(&self) -> &str {
        "brokenInit"
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> Value {
        panic!("a foreign unit cannot even start")
    }
    fn apply(&self, _: &Value, _: &SessionEvent) -> Option<Value> {
        None
    }
}

#[actix_rt::test]
async fn a_unit_whose_init_panics_fails_only_the_snapshot() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let registry = rt.projections().unwrap();
    let broken = registry.register(Arc::new(BrokenInit)).unwrap();
    let agent = agent_with(&rt, |_| {}).await;
    let failed = registry.snapshot(agent.agent().log()).unwrap_err();
    assert!(failed.message().contains("brokenInit"), "{failed}");
    assert!(registry.fold(&[]).is_err(), "a cold fold contains it too");
    broken.remove();
    assert!(registry.snapshot(agent.agent().log()).is_ok());
    agent.dispose().await.unwrap();
}
