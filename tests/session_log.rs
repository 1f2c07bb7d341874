//! The session log: envelope serde, invariants, seeds, header validation and the folds.

use serde_json::json;
use subagents::content::Message;
use subagents::ids::CallId;
use subagents::model::StreamChunk;
use subagents::session::repair::TOOL_OUTCOME_UNKNOWN;
use subagents::session::{
    continuable_stop_reason, final_assistant_output, fold_consumed_work, interrupted_turn_closers,
    one_shot_stop_reason, validate_seed, ConsumedWork, InboxTarget, SpliceOutcome,
};
use subagents::{
    CancelCause, ContentBlock, ErrorCode, EventKind, MessageSource, SessionEvent, SessionHeader,
    SessionId, SessionLog, StopReason, TurnEndReason,
};

fn log() -> SessionLog {
    SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap()
}

fn user(text: &str) -> EventKind {
    EventKind::UserMessage(Message::user(
        vec![ContentBlock::text(text)],
        MessageSource::User,
    ))
}

fn assistant(turn: u64, step: u64, content: Vec<ContentBlock>) -> EventKind {
    EventKind::AssistantMessage {
        turn,
        step,
        message: Message::assistant(content, "p", "m"),
        usage: None,
        interrupted: false,
    }
}

/// A log with one completed text turn.
fn completed_turn(log: &SessionLog, turn: u64, answer: &str) {
    for kind in [
        EventKind::TurnStart { turn },
        EventKind::StepStart { turn, step: 1 },
        user("q"),
        assistant(turn, 1, vec![ContentBlock::text(answer)]),
        EventKind::StepEnd { turn, step: 1 },
        EventKind::TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
            traceparent: None,
        },
    ] {
        log.append(kind).unwrap();
    }
}

#[test]
fn events_round_trip_through_the_upstream_envelope() {
    let log = log();
    completed_turn(&log, 1, "a");
    for event in log.events() {
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], event.kind.type_name());
        assert_eq!(json["seq"], event.seq);
        assert_eq!(
            json.get("surfaceOp").is_some(),
            event.kind.is_surface(),
            "{json}"
        );
        let back: SessionEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
    let turn_end = serde_json::to_value(&log.events()[5]).unwrap();
    assert_eq!(
        turn_end["data"],
        json!({"turn": 1, "reason": {"kind": "completed"}})
    );
}

// The envelope's `data` is written straight from the variant (no intermediate JSON value):
// for every kind it must be exactly what the tagged form holds under `data`, and read back
// whole, with the optional envelope fields too.
#[test]
fn every_kind_writes_the_data_its_tagged_form_holds_and_reads_back() {
    let kinds = vec![
        EventKind::TurnStart { turn: 1 },
        EventKind::StepStart { turn: 1, step: 1 },
        user("q"),
        EventKind::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::TextDelta {
                index: 0,
                text: "a \"quoted\" line\n".into(),
            },
        },
        assistant(1, 1, vec![ContentBlock::text("a")]),
        EventKind::ToolCall {
            turn: 1,
            step: 1,
            call_id: CallId::new("c1"),
            name: "read".into(),
            arguments: "{\"path\":\"x\"}".into(),
        },
        EventKind::ToolResult {
            turn: 1,
            step: 1,
            message: Message::tool_result(CallId::new("c1"), vec![ContentBlock::text("r")], true),
            error: Some(Box::new(subagents::session::ToolErrorInfo {
                name: "read".into(),
                code: "E_IO".into(),
            })),
            meta: Some(Box::new(json!({"bytes": 3}))),
        },
        EventKind::InboxSpliced {
            target: InboxTarget::NextStep,
            start: 0,
            removed_count: Some(1),
            inserted: Vec::new(),
            outcome: Some(SpliceOutcome::Canceled),
        },
        EventKind::StepEnd { turn: 1, step: 1 },
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Aborted {
                reason: CancelCause::User,
            },
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        },
        EventKind::EndSeed {},
    ];
    for (seq, kind) in kinds.into_iter().enumerate() {
        let mut event = SessionEvent::new(seq as u64, kind);
        event.source_event_seqs = vec![1, 2].into();
        let json = serde_json::to_value(&event).unwrap();
        let tagged = serde_json::to_value(&event.kind).unwrap();
        assert_eq!(json["data"], tagged["data"], "{}", event.kind.type_name());
        assert_eq!(json["sourceEventSeqs"], json!([1, 2]));
        let back: SessionEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}

#[test]
fn unknown_types_load_only_when_ignorable() {
    let known =
        json!({"type": "plugin/thing", "seq": 0, "time": 1, "data": {"x": 1}, "ignorable": true});
    let event: SessionEvent = serde_json::from_value(known.clone()).unwrap();
    assert_eq!(
        event.kind,
        EventKind::Extension {
            event_type: "plugin/thing".into(),
            data: json!({"x": 1})
        }
    );
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        known,
        "an extension round-trips verbatim"
    );
    let strict = json!({"type": "plugin/thing", "seq": 0, "time": 1, "data": {}});
    assert!(serde_json::from_value::<SessionEvent>(strict).is_err());
}

// The envelope reads the same whatever the order of its fields (this crate writes `type`
// before `data`, which lets `data` be typed as it is read; other writers need not), skips
// fields it does not know, and refuses a field given twice or a missing `type`.
#[test]
fn an_envelope_reads_the_same_in_any_field_order() {
    let expected = SessionEvent::new(3, EventKind::StepStart { turn: 1, step: 2 });
    for text in [
        r#"{"type":"step/start","seq":3,"time":7,"data":{"turn":1,"step":2}}"#,
        r#"{"data":{"turn":1,"step":2},"time":7,"seq":3,"type":"step/start","extra":[1]}"#,
        r#"{"seq":3,"data":{"turn":1,"step":2},"type":"step/start","time":7}"#,
    ] {
        let event: SessionEvent = serde_json::from_str(text).unwrap();
        assert_eq!((event.seq, event.time), (3, 7), "{text}");
        assert_eq!(event.kind, expected.kind, "{text}");
    }
    let extension = r#"{"data":{"x":1},"type":"plugin/thing","seq":0,"time":1,"ignorable":true}"#;
    let event: SessionEvent = serde_json::from_str(extension).unwrap();
    assert!(matches!(event.kind, EventKind::Extension { .. }));
    for (bad, says) in [
        (
            r#"{"type":"step/start","type":"step/end","seq":3,"time":7,"data":{}}"#,
            "duplicate field `type`",
        ),
        (
            r#"{"seq":3,"time":7,"data":{"turn":1,"step":2}}"#,
            "missing field `type`",
        ),
        (
            r#"{"type":"step/start","time":7,"data":{"turn":1,"step":2}}"#,
            "missing field `seq`",
        ),
        (
            r#"{"type":"step/start","seq":3,"time":7,"data":{"turn":"x","step":2}}"#,
            "invalid type",
        ),
    ] {
        let error = serde_json::from_str::<SessionEvent>(bad)
            .unwrap_err()
            .to_string();
        assert!(error.contains(says), "{bad}: {error}");
    }
}

/// A source is read without a JSON map in between: each known shape still reads as itself,
/// every other value (a known kind with a missing or mistyped field or the wrong form, or no
/// object at all) is kept verbatim, extra fields are ignored and a repeated field keeps its last
/// value, as when a source was read through a `serde_json::Value`.
#[test]
fn message_sources_read_as_their_json_says_without_a_map_in_between() {
    let sender = SessionId::new();
    for known in [
        MessageSource::User,
        MessageSource::Model {
            provider: "load".into(),
            model: "m".into(),
        },
        MessageSource::Tool {
            call_id: CallId::new("c1"),
        },
        MessageSource::Plugin {
            plugin: "runtime-context".into(),
        },
        MessageSource::CoordinatorRelay {
            sender_session_id: sender,
        },
        MessageSource::SubagentReportRelay {
            sender_session_id: sender,
        },
        MessageSource::SubagentSettledNotice {
            summary: "done \"quoted\"".into(),
            sender_session_id: sender,
        },
    ] {
        let text = serde_json::to_string(&known).unwrap();
        assert_eq!(
            serde_json::from_str::<MessageSource>(&text).unwrap(),
            known,
            "{text}"
        );
        let value = serde_json::to_value(&known).unwrap();
        assert_eq!(
            serde_json::from_value::<MessageSource>(value).unwrap(),
            known
        );
    }
    for verbatim in [
        json!({"kind": "model", "provider": 1, "model": "m"}),
        json!({"kind": "model", "provider": "p"}),
        json!({"kind": "coordinator", "form": "notice", "senderSessionId": sender}),
        json!({"kind": "subagent-report", "form": "relay", "senderSessionId": "not-an-id"}),
        json!({"kind": 7}),
        json!({"provider": "p", "model": "m"}),
        json!("user"),
        json!(["user"]),
        json!(null),
        json!(3),
    ] {
        let read: MessageSource = serde_json::from_str(&verbatim.to_string()).unwrap();
        assert_eq!(read, MessageSource::Other(Box::new(verbatim.clone())));
        assert_eq!(serde_json::to_value(&read).unwrap(), verbatim);
    }
    let read = |text: &str| serde_json::from_str::<MessageSource>(text).unwrap();
    let plugin = |plugin: &str| MessageSource::Plugin {
        plugin: plugin.into(),
    };
    assert_eq!(
        read(r#"{"kind":"plugin","plugin":"a","extra":[1]}"#),
        plugin("a")
    );
    assert_eq!(
        read(r#"{"kind":"plugin","plugin":"a","plugin":"b"}"#),
        plugin("b")
    );
    assert_eq!(
        read(r#"{"kind":"webhook","url":"x","url":"y"}"#),
        MessageSource::Other(Box::new(json!({"kind": "webhook", "url": "y"})))
    );
}

#[test]
fn unknown_message_sources_are_kept_verbatim() {
    let raw = json!({"kind": "webhook", "url": "x"});
    let source: MessageSource = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(source, MessageSource::Other(Box::new(raw.clone())));
    assert_eq!(serde_json::to_value(&source).unwrap(), raw);
    let relay = MessageSource::SubagentReportRelay {
        sender_session_id: SessionId::new(),
    };
    let json = serde_json::to_value(&relay).unwrap();
    assert_eq!(json["kind"], "subagent-report");
    assert_eq!(json["form"], "relay");
    assert_eq!(
        serde_json::from_value::<MessageSource>(json).unwrap(),
        relay
    );
}

#[test]
fn turn_numbers_must_follow_and_turns_must_not_nest() {
    let log = log();
    let error = log.append(EventKind::TurnStart { turn: 2 }).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidEvent);
    log.append(EventKind::TurnStart { turn: 1 }).unwrap();
    assert_eq!(
        log.append(EventKind::TurnStart { turn: 2 })
            .unwrap_err()
            .code(),
        ErrorCode::InvalidEvent
    );
    assert_eq!(log.len(), 1, "a refused event leaves the log unchanged");
}

#[test]
fn steps_and_assistant_events_sit_inside_their_turn() {
    let log = log();
    assert!(
        log.append(EventKind::StepStart { turn: 1, step: 1 })
            .is_err(),
        "no open turn"
    );
    log.append(EventKind::TurnStart { turn: 1 }).unwrap();
    assert!(log.append(assistant(1, 1, vec![])).is_err(), "no open step");
    assert!(
        log.append(EventKind::StepStart { turn: 1, step: 2 })
            .is_err(),
        "steps start at 1"
    );
    log.append(EventKind::StepStart { turn: 1, step: 1 })
        .unwrap();
    assert!(
        log.append(EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
            traceparent: None,
        })
        .is_err(),
        "open step"
    );
    log.append(EventKind::StepEnd { turn: 1, step: 1 }).unwrap();
    log.append(EventKind::TurnEnd {
        turn: 1,
        reason: TurnEndReason::Completed,
        traceparent: None,
    })
    .unwrap();
    assert!(log.is_balanced());
}

#[test]
fn tool_results_pair_with_calls_of_the_same_step() {
    let log = log();
    log.append(EventKind::TurnStart { turn: 1 }).unwrap();
    log.append(EventKind::StepStart { turn: 1, step: 1 })
        .unwrap();
    let result = |id: &str| EventKind::ToolResult {
        turn: 1,
        step: 1,
        message: Message::tool_result(CallId::new(id), vec![], false),
        error: None,
        meta: None,
    };
    assert!(log.append(result("c1")).is_err(), "no such call");
    log.append(EventKind::ToolCall {
        turn: 1,
        step: 1,
        call_id: CallId::new("c1"),
        name: "t".into(),
        arguments: "{}".into(),
    })
    .unwrap();
    assert!(
        log.append(EventKind::StepEnd { turn: 1, step: 1 }).is_err(),
        "a dangling call blocks step/end"
    );
    log.append(result("c1")).unwrap();
    assert!(log.append(result("c1")).is_err(), "answered once");
    log.append(EventKind::StepEnd { turn: 1, step: 1 }).unwrap();
}

#[test]
fn source_seqs_must_be_distinct_and_earlier() {
    let log = log();
    log.append(user("a")).unwrap();
    assert!(log.append_with_sources(user("b"), vec![5]).is_err());
    assert!(log.append_with_sources(user("b"), vec![0, 0]).is_err());
    log.append_with_sources(user("b"), vec![0]).unwrap();
}

#[test]
fn lossy_json_is_refused() {
    let log = log();
    let lossy = EventKind::Extension {
        event_type: "plugin/x".into(),
        data: json!({"v": -0.0}),
    };
    assert_eq!(
        log.append(lossy).unwrap_err().code(),
        ErrorCode::InvalidEvent
    );
    log.append(EventKind::Extension {
        event_type: "plugin/x".into(),
        data: json!({"v": 0.0}),
    })
    .unwrap();
}

#[test]
fn a_seed_must_be_contiguous_from_zero() {
    let source = log();
    completed_turn(&source, 1, "a");
    let mut events = source.events();
    events.remove(2);
    let error = validate_seed(&events).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidSeed);
    let shifted: Vec<_> = source.events().into_iter().skip(1).collect();
    assert_eq!(
        validate_seed(&shifted).unwrap_err().code(),
        ErrorCode::InvalidSeed
    );
}

#[test]
fn a_seed_must_be_balanced() {
    let source = log();
    source.append(EventKind::TurnStart { turn: 1 }).unwrap();
    let error = SessionLog::new(SessionHeader::new(SessionId::new()), source.events()).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidSeed);
    assert!(error.message().contains("unbalanced"));
}

#[test]
fn a_valid_seed_gets_one_end_seed_marker() {
    let source = log();
    completed_turn(&source, 1, "a");
    let seeded = SessionLog::new(SessionHeader::new(SessionId::new()), source.events()).unwrap();
    assert_eq!(seeded.len(), 7);
    assert_eq!(seeded.events()[6].kind, EventKind::EndSeed {});
    let again = SessionLog::new(SessionHeader::new(SessionId::new()), seeded.events()).unwrap();
    assert_eq!(
        again.len(),
        7,
        "a seed ending with the marker gets no second one"
    );
    assert_eq!(
        again.last_turn(),
        1,
        "turn numbering continues after the seed"
    );
}

#[test]
fn header_validation_names_the_broken_field() {
    let mut header = SessionHeader::new(SessionId::new());
    header.validate().unwrap();
    header.cwd = Some("relative/dir".into());
    assert_eq!(
        header.validate().unwrap_err().code(),
        ErrorCode::InvalidHeader
    );
    header.cwd = None;
    header.version = 7;
    assert!(header.validate().unwrap_err().message().contains("version"));
    header.version = 0;
    header.delegation_depth = Some(1 << 60);
    assert!(header
        .validate()
        .unwrap_err()
        .message()
        .contains("delegationDepth"));
    let json = serde_json::to_value(SessionHeader::new(SessionId::new())).unwrap();
    assert!(json.get("createdAt").is_some() && json.get("seedLength").is_none());
}

#[test]
fn fold_consumed_work_takes_the_last_turn_that_stepped_or_failed_a_claim() {
    let log = log();
    completed_turn(&log, 1, "a");
    // Turn 2 claims work and is aborted before stepping.
    log.append(EventKind::TurnStart { turn: 2 }).unwrap();
    log.append(EventKind::InboxSpliced {
        target: InboxTarget::NextTurn,
        start: 0,
        removed_count: Some(1),
        inserted: vec![],
        outcome: None,
    })
    .unwrap();
    log.append(EventKind::TurnEnd {
        turn: 2,
        reason: TurnEndReason::Aborted {
            reason: CancelCause::User,
        },
        traceparent: None,
    })
    .unwrap();
    // Turn 3 claims nothing and completes without a step: it consumed no work.
    log.append(EventKind::TurnStart { turn: 3 }).unwrap();
    log.append(EventKind::TurnEnd {
        turn: 3,
        reason: TurnEndReason::Completed,
        traceparent: None,
    })
    .unwrap();
    let work = fold_consumed_work(log.events());
    assert_eq!(
        work.end,
        Some(TurnEndReason::Aborted {
            reason: CancelCause::User
        })
    );
    assert!(!work.dropped_unrun);
    log.append(EventKind::InboxSpliced {
        target: InboxTarget::NextTurn,
        start: 0,
        removed_count: Some(1),
        inserted: vec![],
        outcome: Some(SpliceOutcome::Canceled),
    })
    .unwrap();
    assert!(
        fold_consumed_work(log.events()).dropped_unrun,
        "a discard after the last turn is dropped work"
    );
}

#[test]
fn the_two_stop_reason_tables_disagree_only_where_the_spec_says() {
    let aborted = TurnEndReason::Aborted {
        reason: CancelCause::User,
    };
    let error = TurnEndReason::Error {
        error: subagents::session::LlmFailure::new("X", "y"),
    };
    let cases = [
        (
            Some(TurnEndReason::Completed),
            StopReason::Completed,
            StopReason::Completed,
        ),
        (
            Some(TurnEndReason::MaxTokens),
            StopReason::MaxTokens,
            StopReason::MaxTokens,
        ),
        (Some(aborted), StopReason::Aborted, StopReason::Aborted),
        (
            Some(TurnEndReason::Blocked),
            StopReason::Refusal,
            StopReason::Refusal,
        ),
        (Some(error), StopReason::Error, StopReason::Error),
        (
            Some(TurnEndReason::Interrupted),
            StopReason::Error,
            StopReason::Aborted,
        ),
        (
            Some(TurnEndReason::BudgetExhausted {
                limit: subagents::BudgetLimit::Tokens,
            }),
            StopReason::BudgetExhausted,
            StopReason::BudgetExhausted,
        ),
        (None, StopReason::Error, StopReason::Completed),
    ];
    for (end, one_shot, continuable) in cases {
        assert_eq!(
            one_shot_stop_reason(end.as_ref()),
            one_shot,
            "one-shot {end:?}"
        );
        let work = ConsumedWork {
            end: end.clone(),
            dropped_unrun: false,
        };
        assert_eq!(
            continuable_stop_reason(&work),
            continuable,
            "continuable {end:?}"
        );
    }
    let dropped = ConsumedWork {
        end: Some(TurnEndReason::Completed),
        dropped_unrun: true,
    };
    assert_eq!(continuable_stop_reason(&dropped), StopReason::Aborted);
}

#[test]
fn stop_reasons_are_an_open_set_and_unknown_ones_are_failures() {
    let other: StopReason = serde_json::from_value(json!("stalled")).unwrap();
    assert_eq!(other, StopReason::Other("stalled".into()));
    assert!(!other.is_success());
    let spent: StopReason = serde_json::from_value(json!("budget-exhausted")).unwrap();
    assert_eq!(spent, StopReason::BudgetExhausted);
    assert!(!spent.is_success());
    assert_eq!(
        serde_json::to_value(&StopReason::MaxTokens).unwrap(),
        json!("max-tokens")
    );
    assert!(StopReason::Completed.is_success());
}

#[test]
fn output_is_the_last_non_empty_message_then_streamed_text_then_nothing() {
    let log = log();
    completed_turn(&log, 1, "first");
    completed_turn(&log, 2, "second");
    assert_eq!(
        final_assistant_output(log.events()),
        vec![ContentBlock::text("second")]
    );

    let streamed = self::log();
    streamed.append(EventKind::TurnStart { turn: 1 }).unwrap();
    streamed
        .append(EventKind::StepStart { turn: 1, step: 1 })
        .unwrap();
    for part in ["par", "tial"] {
        streamed
            .append(EventKind::AssistantChunk {
                turn: 1,
                step: 1,
                chunk: StreamChunk::TextDelta {
                    index: 0,
                    text: part.into(),
                },
            })
            .unwrap();
    }
    streamed.append(assistant(1, 1, vec![])).unwrap();
    assert_eq!(
        final_assistant_output(streamed.events()),
        vec![ContentBlock::text("partial")]
    );
    assert!(final_assistant_output(self::log().events()).is_empty());
}

#[test]
fn crash_repair_closes_open_calls_the_step_and_the_turn() {
    let log = log();
    log.append(EventKind::TurnStart { turn: 1 }).unwrap();
    log.append(EventKind::StepStart { turn: 1, step: 1 })
        .unwrap();
    let calls = vec![
        ContentBlock::ToolCall {
            id: CallId::new("ran"),
            name: "a".into(),
            arguments: "{}".into(),
        },
        ContentBlock::ToolCall {
            id: CallId::new("never"),
            name: "b".into(),
            arguments: "{}".into(),
        },
    ];
    log.append(assistant(1, 1, calls)).unwrap();
    log.append(EventKind::ToolCall {
        turn: 1,
        step: 1,
        call_id: CallId::new("ran"),
        name: "a".into(),
        arguments: "{}".into(),
    })
    .unwrap();
    let closers = interrupted_turn_closers(log.events());
    let codes: Vec<_> = closers
        .iter()
        .filter_map(|k| match k {
            EventKind::ToolResult {
                error: Some(error), ..
            } => Some(error.code.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(codes, [TOOL_OUTCOME_UNKNOWN, "TOOL_NOT_STARTED"]);
    assert_eq!(closers[2], EventKind::StepEnd { turn: 1, step: 1 });
    assert_eq!(
        closers[3],
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Interrupted,
            traceparent: None,
        }
    );
    for closer in closers {
        log.append(closer).unwrap();
    }
    assert!(log.is_balanced(), "the repaired log is balanced");
    assert!(
        interrupted_turn_closers(log.events()).is_empty(),
        "repair is idempotent"
    );
}
