//! Output selection: which content a run reports as its output.

use subagents::content::Message;
use subagents::model::StreamChunk;
use subagents::session::AssistantOutputFold;
use subagents::{ContentBlock, EventKind, SessionEvent};

fn message(content: Vec<ContentBlock>) -> SessionEvent {
    SessionEvent::new(
        0,
        EventKind::AssistantMessage {
            turn: 1,
            step: 1,
            message: Message::assistant(content, "p", "m"),
            usage: None,
            interrupted: false,
        },
    )
}

fn delta(text: &str) -> SessionEvent {
    SessionEvent::new(
        0,
        EventKind::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::TextDelta {
                index: 0,
                text: text.into(),
            },
        },
    )
}

fn reasoning_delta(text: &str) -> SessionEvent {
    SessionEvent::new(
        0,
        EventKind::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::ReasoningDelta {
                index: 0,
                text: text.into(),
            },
        },
    )
}

fn fold(events: &[SessionEvent]) -> Option<Vec<ContentBlock>> {
    let mut fold = AssistantOutputFold::new();
    for event in events {
        fold.push_event(event);
    }
    fold.collect()
}

// AOUT-01
#[test]
fn the_last_non_empty_message_wins_past_a_later_usage_only_message() {
    let events = [
        message(vec![ContentBlock::text("step one")]),
        message(vec![ContentBlock::text("step two")]),
        message(vec![]),
    ];
    assert_eq!(fold(&events), Some(vec![ContentBlock::text("step two")]));
}

// AOUT-02
#[test]
fn a_message_beats_text_streamed_around_it() {
    let events = [
        delta("before "),
        message(vec![ContentBlock::text("the message")]),
        delta(" after"),
    ];
    assert_eq!(fold(&events), Some(vec![ContentBlock::text("the message")]));
}

// AOUT-03
#[test]
fn textless_content_counts_as_a_message() {
    let reasoning = vec![ContentBlock::Reasoning {
        text: "thinking".into(),
    }];
    assert_eq!(
        fold(&[delta("streamed"), message(reasoning.clone())]),
        Some(reasoning)
    );
}

// AOUT-04
#[test]
fn the_fallback_is_text_deltas_only() {
    let tool_result = SessionEvent::new(
        0,
        EventKind::ToolResult {
            turn: 1,
            step: 1,
            message: Message::tool_result(
                subagents::CallId::new("c"),
                vec![ContentBlock::text("tool text")],
                false,
            ),
            error: None,
            meta: None,
        },
    );
    let events = [
        delta("partial "),
        reasoning_delta("hmm"),
        tool_result,
        delta("answer"),
    ];
    assert_eq!(
        fold(&events),
        Some(vec![ContentBlock::text("partial answer")])
    );
}

// AOUT-05
#[test]
fn nothing_folds_to_none() {
    assert_eq!(fold(&[]), None);
    assert_eq!(fold(&[reasoning_delta("hmm"), message(vec![])]), None);
}

// AOUT-06
#[test]
fn raw_text_pieces_join_the_streamed_fallback() {
    let mut fold = AssistantOutputFold::new();
    fold.push_text("partial ");
    fold.push_text("");
    fold.push_text("answer");
    assert_eq!(
        fold.collect(),
        Some(vec![ContentBlock::text("partial answer")])
    );
}

// AOUT-07
#[test]
fn collect_is_none_until_something_folds() {
    let mut fold = AssistantOutputFold::new();
    assert_eq!(fold.collect(), None);
    fold.push_event(&message(vec![]));
    assert_eq!(fold.collect(), None);
    fold.push_event(&delta("x"));
    assert_eq!(fold.collect(), Some(vec![ContentBlock::text("x")]));
}
