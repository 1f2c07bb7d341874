//! Provides [`LoadModel`]: the model a load run talks to. It answers from the request alone
//! (no shared script), so any number of agents can call it at once and get the same answers
//! in any order.
//!
//! A user message carrying `[delegate {...}]` is answered with one call of the `delegate` tool
//! whose arguments are that JSON object; anything else with the text `done`. The simulated latency is drawn per call
//! from the run's seed, the calling session and its history length, so a run repeats.

use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Map, Value};

use super::scenario::Latency;
use crate::content::{MessageSource, Role};
use crate::model::scripted::{text_chunks, tool_call_chunks};
use crate::model::{FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
use crate::session::LlmFailure;

/// The tool a delegating load agent calls.
pub const DELEGATE_TOOL: &str = "delegate";

/// The tool a reporting load agent calls.
pub const REPORT_TOOL: &str = "report";

/// The directive that makes a load agent call the `report` tool.
pub const REPORT_DIRECTIVE: &str = "[report]";

/// The directive that makes a load agent call the `delegate` tool with `arguments`.
pub fn delegate_directive(arguments: &Value) -> String {
    format!("[delegate {arguments}]")
}

/// The `delegate` tool's arguments `text` asks for, if it carries the directive.
fn requested(text: &str) -> Option<Value> {
    let start = text.find("[delegate ")? + "[delegate ".len();
    // The first JSON value after the marker; whatever follows it (other directives) is not part
    // of it.
    serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()?
        .ok()
        .filter(Value::is_object)
}

/// SplitMix64: a small, well-mixed hash for seeded draws.
pub(crate) fn mix(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// The load run's model.
#[derive(Debug, Clone)]
pub struct LoadModel {
    latency: Latency,
    seed: u64,
}

impl LoadModel {
    /// A model answering after `latency`, drawn from `seed`.
    pub fn new(latency: Latency, seed: u64) -> Self {
        Self { latency, seed }
    }

    fn delay(&self, request: &GenerateRequest) -> Duration {
        let ms = match self.latency {
            Latency::Fixed { ms } => ms,
            Latency::Uniform { min, max } => {
                let session = request.session_id.map_or(0, |id| {
                    u64::from_le_bytes(id.as_bytes()[..8].try_into().unwrap_or_default())
                });
                let position = u64::try_from(request.messages.len()).unwrap_or(u64::MAX);
                let draw = mix(self.seed ^ mix(session ^ mix(position)));
                // `validate` bounds latencies well below the point where the span overflows.
                min + draw % (max - min).saturating_add(1)
            }
        };
        Duration::from_millis(ms)
    }
}

/// How many of the newest history entries the model reads: the last message and the runtime
/// context after it.
const HISTORY_WINDOW: usize = 8;

/// The answer to `request`: a delegation for a directive in the last message (runtime context
/// left out) when it is a user's, else text.
fn answer(request: &GenerateRequest) -> Vec<StreamChunk> {
    let last = request
        .messages
        .messages()
        .rev()
        .take(HISTORY_WINDOW)
        .find(|message| !matches!(message.source, MessageSource::Plugin { .. }));
    let text = last
        .filter(|message| message.role == Role::User)
        .map(|message| message.text())
        .unwrap_or_default();
    let position = request.messages.len();
    let delegate_id = format!("delegate-{position}");
    let report_id = format!("report-{position}");
    let mut calls = Vec::new();
    if let Some(arguments) = requested(&text) {
        calls.push((delegate_id.as_str(), DELEGATE_TOOL, arguments));
    }
    if text.contains(REPORT_DIRECTIVE) {
        calls.push((report_id.as_str(), REPORT_TOOL, Value::Object(Map::new())));
    }
    if calls.is_empty() {
        text_chunks("done".to_owned(), FinishReason::Stop)
    } else {
        tool_call_chunks(&calls)
    }
}

impl LlmAdapter for LoadModel {
    fn history_window(&self) -> Option<usize> {
        Some(HISTORY_WINDOW)
    }

    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
        let chunks = answer(&request);
        let delay = self.delay(&request);
        let cancel = request.cancel.clone();
        stream::once(async move {
            if !delay.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = cancel.cancelled() => {
                        return Err(LlmFailure::new("ABORTED", "the turn was cancelled"));
                    }
                }
            }
            Ok(chunks)
        })
        .map(|answered| match answered {
            Ok(chunks) => stream::iter(chunks.into_iter().map(Ok)).boxed(),
            Err(failure) => stream::once(async move { Err(failure) }).boxed(),
        })
        .flatten()
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directive_round_trips_and_anything_else_is_not_one() {
        let arguments = serde_json::json!({"count": 7, "level": 2});
        assert_eq!(
            requested(&delegate_directive(&arguments)),
            Some(arguments.clone())
        );
        assert_eq!(
            requested(&format!("work, then {}", delegate_directive(&arguments))),
            Some(arguments.clone())
        );
        assert_eq!(
            requested(&format!("{} and [report]", delegate_directive(&arguments))),
            Some(arguments.clone()),
            "a directive after it is not part of it"
        );
        assert_eq!(requested("[delegate 3]"), None);
        assert_eq!(requested("done"), None);
    }
}
