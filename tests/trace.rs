//! One trace per delegation tree (issue #19): the spans the narrated tour records, named and
//! attributed after the OpenTelemetry GenAI conventions, each child's turns under the tool
//! call that delegated to it.

use std::time::Duration;

use subagents::tour::{run_tour, TOUR_PROMPT};
use tracing::Instrument as _;

use crate::support::{CapturedSpan, SpanCapture};
use crate::tour::tour_runtime;

/// The spans below `index`, children first-level only.
fn children(spans: &[CapturedSpan], index: usize) -> Vec<usize> {
    (0..spans.len())
        .filter(|&at| spans[at].parent == Some(index))
        .collect()
}

/// The `execute_tool` span of tool `name`, the n-th one.
fn tool_call(spans: &[CapturedSpan], name: &str, nth: usize) -> usize {
    (0..spans.len())
        .filter(|&at| {
            spans[at].name == "execute_tool"
                && spans[at].fields.get("gen_ai.tool.name").map(String::as_str) == Some(name)
        })
        .nth(nth)
        .unwrap_or_else(|| panic!("no call {nth} of {name} in {spans:#?}"))
}

/// The agent ids of the `invoke_agent` spans directly below `index`, in the order they opened.
fn turns_below(spans: &[CapturedSpan], index: usize) -> Vec<String> {
    children(spans, index)
        .into_iter()
        .filter(|&at| spans[at].name == "invoke_agent")
        .map(|at| spans[at].fields["gen_ai.agent.id"].clone())
        .collect()
}

/// The agent id of the one `invoke_agent` span directly below `index`.
fn delegated_turn(spans: &[CapturedSpan], index: usize) -> String {
    let turns = turns_below(spans, index);
    assert_eq!(turns.len(), 1, "one child turn under {:?}", spans[index]);
    turns[0].clone()
}

/// The root above `index`.
fn root_of(spans: &[CapturedSpan], mut index: usize) -> usize {
    while let Some(parent) = spans[index].parent {
        index = parent;
    }
    index
}

#[actix_rt::test]
async fn the_tours_delegations_nest_each_childs_turn_under_the_tool_call_that_made_it() {
    let capture = SpanCapture::start();
    let rt = tour_runtime().await;
    let demo = tracing::info_span!(target: "subagents::trace", "demo");
    let (parent, _) = run_tour(&rt, Duration::from_secs(30))
        .instrument(demo)
        .await
        .unwrap();
    rt.shutdown().await.unwrap();
    let spans = capture.spans();
    let parent = parent.to_string();

    // The parent's first turn continues the trace its prompt was sent from.
    let first_turn = (0..spans.len())
        .find(|&at| spans[at].name == "invoke_agent")
        .unwrap();
    assert_eq!(spans[first_turn].fields["gen_ai.agent.id"], parent);
    assert_eq!(spans[first_turn].parent, Some(0), "{spans:#?}");
    assert_eq!(spans[0].name, "demo");

    // Each delegation's child turn sits under the tool call that delegated it, in the
    // parent's trace: the spawn and fork children, and the continuable child's first epoch.
    let spawn = tool_call(&spans, "subagent", 0);
    let fork = tool_call(&spans, "subagent_fork", 0);
    let continuable = tool_call(&spans, "subagent_continuable", 0);
    let spawned = delegated_turn(&spans, spawn);
    let forked = delegated_turn(&spans, fork);
    let child = delegated_turn(&spans, continuable);
    let ids = [parent.as_str(), &spawned, &forked, &child];
    for (at, id) in ids.iter().enumerate() {
        assert!(!ids[at + 1..].contains(id), "distinct agents: {ids:?}");
    }
    // One trace: the parent's later turns, woken by the continuable child's report and settled
    // notice, continue the trace of the call the message came from.
    for at in 0..spans.len() {
        assert_eq!(root_of(&spans, at), 0, "one trace: {spans:#?}");
    }
    // The follow-up's epoch sits under the `send_message` call that sent it, and so does the
    // parent turn its settled notice woke; the turn the child's report woke sits under the
    // child's `report` call.
    let followup = tool_call(&spans, "send_message", 0);
    assert_eq!(
        turns_below(&spans, followup),
        [child.clone(), parent.clone()]
    );
    let report = tool_call(&spans, "report", 0);
    assert_eq!(turns_below(&spans, report), [parent.clone()]);

    // The attribute names are the conventions'; a model call records its model and usage.
    let chat = (0..spans.len())
        .find(|&at| spans[at].name == "chat")
        .unwrap();
    assert_eq!(spans[chat].fields["gen_ai.operation.name"], "chat");
    assert!(spans[chat].fields.contains_key("gen_ai.request.model"));
    assert!(spans[chat]
        .fields
        .contains_key("gen_ai.response.finish_reasons"));
    assert_eq!(spans[spawn].fields["gen_ai.operation.name"], "execute_tool");
    assert!(spans[spawn].fields.contains_key("gen_ai.tool.call.id"));
    assert_eq!(
        spans[first_turn].fields["gen_ai.operation.name"],
        "invoke_agent"
    );
    // No content: neither the prompt nor any answer is an attribute.
    for span in &spans {
        for value in span.fields.values() {
            assert!(!value.contains(TOUR_PROMPT), "content in {span:?}");
        }
    }
}
