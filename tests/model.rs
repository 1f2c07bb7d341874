//! The scripted model and the block assembler.

use futures::StreamExt;
use serde_json::json;
use subagents::model::{BlockAssembler, BlockType, FinishReason, StreamChunk};
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{CallId, ContentBlock, GenerateRequest, LlmAdapter};
use tokio_util::sync::CancellationToken;

use crate::support::within;

fn request(cancel: &CancellationToken) -> GenerateRequest {
    GenerateRequest {
        provider: "scripted".into(),
        model: "m".into(),
        messages: Vec::new().into(),
        system: None,
        tools: vec![],
        max_tokens: None,
        session_id: None,
        cancel: cancel.clone(),
    }
}

async fn collect(
    model: &ScriptedModel,
    cancel: &CancellationToken,
) -> Vec<Result<StreamChunk, subagents::session::LlmFailure>> {
    model.stream(request(cancel)).collect().await
}

#[test]
fn tool_call_deltas_assemble_into_one_call() {
    let ScriptStep::Chunks(chunks) =
        ScriptStep::tool_call("c9", "search", json!({"query": "rust actors"}))
    else {
        panic!("tool_call gives chunks");
    };
    let mut assembler = BlockAssembler::new();
    let deltas: Vec<_> = chunks
        .iter()
        .filter(|c| !matches!(c, StreamChunk::BlockEnd { .. }))
        .collect();
    assert_eq!(
        deltas
            .iter()
            .filter(|c| matches!(c, StreamChunk::ToolCallDelta { .. }))
            .count(),
        2,
        "arguments are split"
    );
    for chunk in deltas {
        assembler.push(chunk);
    }
    assert_eq!(
        assembler.blocks(),
        [ContentBlock::ToolCall {
            id: CallId::new("c9"),
            name: "search".into(),
            arguments: json!({"query": "rust actors"}).to_string()
        }]
    );
    assert!(assembler.text_blocks().is_empty());
}

#[test]
fn a_call_without_an_id_gets_an_index_id_and_block_end_is_authoritative() {
    let mut assembler = BlockAssembler::new();
    assembler.push(&StreamChunk::BlockStart {
        index: 0,
        block_type: BlockType::Text,
    });
    assembler.push(&StreamChunk::TextDelta {
        index: 0,
        text: "draft".into(),
    });
    assembler.push(&StreamChunk::BlockEnd {
        index: 0,
        block: ContentBlock::text("final"),
    });
    assembler.push(&StreamChunk::ToolCallDelta {
        index: 1,
        id: String::new(),
        name: Some("t".into()),
        arguments_delta: "{}".into(),
    });
    assert_eq!(
        assembler.blocks(),
        [
            ContentBlock::text("final"),
            ContentBlock::ToolCall {
                id: CallId::new("call-1"),
                name: "t".into(),
                arguments: "{}".into()
            }
        ]
    );
}

#[actix_rt::test]
async fn the_script_is_consumed_in_order_and_requests_are_recorded() {
    let model =
        ScriptedModel::with_script([ScriptStep::text("one"), ScriptStep::fail("BOOM", "bad")]);
    let cancel = CancellationToken::new();
    let first = collect(&model, &cancel).await;
    assert!(matches!(
        first.last(),
        Some(Ok(StreamChunk::Finish {
            reason: FinishReason::Stop
        }))
    ));
    let second = collect(&model, &cancel).await;
    assert!(matches!(&second[..], [Err(failure)] if failure.code == "BOOM"));
    let third = collect(&model, &cancel).await;
    assert!(matches!(&third[..], [Err(failure)] if failure.code == "SCRIPT_EXHAUSTED"));
    assert_eq!(model.request_count(), 3);
}

// A call naming a model with a script of its own consumes that script, never the shared one,
// and its running out names the script.
#[actix_rt::test]
async fn a_model_with_a_script_of_its_own_answers_from_it_alone() {
    let model = ScriptedModel::with_script([ScriptStep::text("shared")]);
    model.push_for_model("child", [ScriptStep::text("child's")]);
    let cancel = CancellationToken::new();
    let ask = |name: &str| {
        let mut asked = request(&cancel);
        asked.model = name.into();
        let model = model.clone();
        async move { model.stream(asked).collect::<Vec<_>>().await }
    };
    let text = |items: &[Result<StreamChunk, subagents::session::LlmFailure>]| {
        items
            .iter()
            .filter_map(|item| match item {
                Ok(StreamChunk::TextDelta { text, .. }) => Some(text.clone()),
                _ => None,
            })
            .collect::<String>()
    };
    assert_eq!(text(&ask("child").await), "child's");
    assert_eq!(
        text(&ask("parent").await),
        "shared",
        "the parent's call takes the shared step"
    );
    let exhausted = ask("child").await;
    assert!(
        matches!(&exhausted[..], [Err(failure)] if failure.code == "SCRIPT_EXHAUSTED"
            && failure.message.contains("\"child\"")),
        "{exhausted:?}"
    );
}

#[actix_rt::test]
async fn a_gate_holds_the_response_until_released() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([ScriptStep::text("held").gated(&gate)]);
    let cancel = CancellationToken::new();
    let pending = tokio::spawn({
        let model = model.clone();
        let cancel = cancel.clone();
        async move { collect(&model, &cancel).await }
    });
    within("the call to reach the gate", gate.reached()).await;
    assert!(!pending.is_finished(), "the response is held");
    gate.release();
    let chunks = within("the released response", pending).await.unwrap();
    assert!(chunks
        .iter()
        .any(|c| matches!(c, Ok(StreamChunk::TextDelta { text, .. }) if text == "held")));
}

#[actix_rt::test]
async fn a_hang_ends_only_when_cancelled() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let cancel = CancellationToken::new();
    let mut stream = model.stream(request(&cancel));
    assert!(matches!(
        stream.next().await,
        Some(Ok(StreamChunk::BlockStart { .. }))
    ));
    assert!(
        matches!(stream.next().await, Some(Ok(StreamChunk::TextDelta { text, .. })) if text == "partial")
    );
    cancel.cancel();
    assert!(matches!(stream.next().await, Some(Err(failure)) if failure.code == "ABORTED"));
}

#[actix_rt::test]
async fn latency_is_cancellable() {
    let model = ScriptedModel::repeating(ScriptStep::text("slow"));
    model.set_latency(std::time::Duration::from_secs(3600));
    let cancel = CancellationToken::new();
    cancel.cancel();
    let chunks = within("a cancelled slow call", collect(&model, &cancel)).await;
    assert!(matches!(&chunks[..], [Err(failure)] if failure.code == "ABORTED"));
}
