//! The spans the runtime records, one tree per delegation: an agent's turn
//! (`invoke_agent`), each model call in it (`chat`) and each tool call (`execute_tool`), named
//! and attributed after the OpenTelemetry semantic conventions for generative AI (`gen_ai.*`).
//!
//! A turn's span is the child of the span its claimed message was sent from: a one-shot
//! child's first turn runs under the delegating `subagent` tool call (or whatever span was
//! current where `Subagents::start` was called), a continuable child's epoch under the span of
//! the start or follow-up that opened it, cold resume included; a parent's turn woken by a
//! child's report runs under the child's `report` call, and one woken by a settled notice
//! under the call that opened the settled epoch. The first turn of a cold resume links to the
//! call that opened the epoch it resumes from, when this runtime saw that epoch end.
//! Follow-ups, interrupts and reports are events (`followup`, `interrupt`, `report`) on the
//! span they were sent from, with their outcome and, refused, their `error.type`; a drain is
//! a `drain` span. A delegation tree is one trace.
//!
//! Where an OpenTelemetry layer records the spans (`tracing-opentelemetry`), a message keeps
//! only its sender's span context and the turn joins that context, so the sender's span ends
//! when the sender is done (a `tracing` span stays open while anything holds it or a span
//! below it lives, and a continuable child's epoch outlives the call that opened it). Under
//! any other subscriber the turn is the `tracing` child of the sender's span, kept with the
//! message until a turn claims it; the settled notice's turn then starts a trace of its own.
//!
//! The spans are INFO spans of target `subagents::trace`. A host that installs a subscriber
//! recording them (for example `tracing-opentelemetry`, which names each span from its
//! `otel.name`) sees the whole tree; `subagents load`, `demo`, `node` and `acp-agent` export
//! them over OTLP with `--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`. Without a
//! subscriber they are disabled at their call sites and cost a check each.
//!
//! Across processes the trace travels as W3C trace context: [`traceparent_of`] is what the
//! ACP and SDK providers send in a prompt's `_meta` (and the Codex and Claude Code providers
//! set as `TRACEPARENT`), and a [`served_span`] continues it: `subagents acp-agent` serving a
//! prompt, a cluster node serving a placed start or a follow-up from its peer.
//!
//! Content is recorded only when the host opts in ([`crate::RuntimeBuilder::trace_content`],
//! `--trace-content` on the command line), as the conventions advise, since prompts, outputs
//! and tool arguments may hold what a trace backend should not keep: then a `chat` span
//! carries `gen_ai.system_instructions`, `gen_ai.input.messages` and
//! `gen_ai.output.messages`, and an `execute_tool` span `gen_ai.tool.call.arguments` and
//! `gen_ai.tool.call.result`, in the conventions' JSON shapes. By default none of them is an
//! attribute.

use tracing::Span;

use opentelemetry::trace::SpanContext;

use crate::content::{ContentBlock, Role};
use crate::error::Result;
use crate::ids::{MessageId, SessionId};
use crate::model::{FinishReason, GenerateRequest};
use crate::session::TokenUsage;

/// The span of turn `turn` of agent `agent`, under `sent_from` (where its first claimed
/// message was sent from), or a root of its own.
pub(crate) fn turn_span(sent_from: Option<&SentFrom>, agent: SessionId, turn: u64) -> Span {
    let span = tracing::info_span!(
        parent: sent_from.and_then(|sent_from| sent_from.span.id()),
        "invoke_agent",
        otel.name = "invoke_agent",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.id = %agent,
        gen_ai.conversation.id = %agent,
        subagents.turn = turn,
    );
    if let Some(contexts) = sent_from.and_then(|sent_from| sent_from.contexts.as_deref()) {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        if let Some(ended) = &contexts.ended {
            continue_context(&span, ended);
        }
        if let Some(resumes) = &contexts.resumes {
            span.add_link(resumes.clone());
        }
    }
    span
}

/// The span of one model call of the current turn, to `model` through `provider`; its usage
/// and finish reason are recorded by [`record_response`].
pub(crate) fn chat_span(provider: &str, model: &str, step: u64) -> Span {
    // A route without a model name (a scripted model) names the span after the operation.
    let named = !model.is_empty();
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat{}{model}", if named { " " } else { "" }),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = named.then_some(model),
        subagents.step = step,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.system_instructions = tracing::field::Empty,
        gen_ai.input.messages = tracing::field::Empty,
        gen_ai.output.messages = tracing::field::Empty,
    )
}

/// Records a model call's system prompt and input messages on its `chat` span (content: only
/// when the host opted in).
pub(crate) fn record_request(span: &Span, request: &GenerateRequest) {
    if span.is_disabled() {
        return;
    }
    if let Some(system) = &request.system {
        let parts = serde_json::json!([{"type": "text", "content": system}]);
        span.record("gen_ai.system_instructions", parts.to_string());
    }
    let messages: Vec<serde_json::Value> = request
        .messages
        .messages()
        .map(|message| conventional_message(message.role, &message.content, None))
        .collect();
    span.record(
        "gen_ai.input.messages",
        serde_json::Value::from(messages).to_string(),
    );
}

/// Records a model call's output message on its `chat` span (content: only when the host
/// opted in).
pub(crate) fn record_output(span: &Span, content: &[ContentBlock], finish: Option<&FinishReason>) {
    if span.is_disabled() {
        return;
    }
    let message = conventional_message(Role::Assistant, content, finish.map(finish_reason));
    span.record(
        "gen_ai.output.messages",
        serde_json::json!([message]).to_string(),
    );
}

/// A message in the conventions' JSON shape: a role and its parts; a user-role message that
/// answers tool calls has the role `tool`.
fn conventional_message(
    role: Role,
    content: &[ContentBlock],
    finish_reason: Option<&str>,
) -> serde_json::Value {
    let answers_tools = content
        .iter()
        .any(|block| matches!(block, ContentBlock::ToolResult { .. }));
    let role = match role {
        Role::Assistant => "assistant",
        Role::User if answers_tools => "tool",
        Role::User => "user",
    };
    let mut message = serde_json::json!({
        "role": role,
        "parts": content.iter().map(conventional_part).collect::<Vec<_>>(),
    });
    if let Some(reason) = finish_reason {
        message["finish_reason"] = reason.into();
    }
    message
}

/// A content block as one of the conventions' message parts.
fn conventional_part(block: &ContentBlock) -> serde_json::Value {
    match block {
        ContentBlock::Text { text } => serde_json::json!({"type": "text", "content": text}),
        ContentBlock::Reasoning { text } => {
            serde_json::json!({"type": "reasoning", "content": text})
        }
        ContentBlock::ToolCall {
            id,
            name,
            arguments,
        } => serde_json::json!({
            "type": "tool_call",
            "id": id.as_str(),
            "name": name,
            "arguments": arguments_value(arguments),
        }),
        ContentBlock::ToolResult {
            tool_call_id,
            content,
            ..
        } => serde_json::json!({
            "type": "tool_call_response",
            "id": tool_call_id.as_str(),
            "response": text_of(content),
        }),
    }
}

/// A tool call's arguments as JSON when they parse, as the raw text the model wrote otherwise.
fn arguments_value(arguments: &str) -> serde_json::Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| arguments.into())
}

/// The text of a tool's answer.
fn text_of(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Records a model call's token usage and finish reason on its `chat` span.
pub(crate) fn record_response(
    span: &Span,
    usage: Option<&TokenUsage>,
    finish: Option<&FinishReason>,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(usage) = usage {
        span.record("gen_ai.usage.input_tokens", usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", usage.output_tokens);
    }
    if let Some(finish) = finish {
        span.record("gen_ai.response.finish_reasons", finish_reason(finish));
    }
}

/// The conventions' finish reason of `finish` (`stop`, `tool_calls`, `length`,
/// `content_filter`, `error`).
fn finish_reason(finish: &FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::MaxTokens => "length",
        FinishReason::Refusal => "content_filter",
        _ => "error",
    }
}

/// The span of one tool call of the current step.
pub(crate) fn tool_span(name: &str, call_id: &str) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
    )
}

/// Records a tool call's arguments on its `execute_tool` span (content: only when the host
/// opted in).
pub(crate) fn record_tool_arguments(span: &Span, arguments: &str) {
    if !span.is_disabled() {
        span.record("gen_ai.tool.call.arguments", arguments);
    }
}

/// Records what a tool answered on its `execute_tool` span (content: only when the host opted
/// in).
pub(crate) fn record_tool_result(span: &Span, content: &[ContentBlock]) {
    if !span.is_disabled() {
        span.record("gen_ai.tool.call.result", text_of(content));
    }
}

/// The span of a drain of the continuable descendants of `parents` parents, under the span
/// current where it was asked for.
pub(crate) fn drain_span(parents: usize) -> Span {
    tracing::info_span!(
        "drain",
        otel.name = "drain",
        subagents.drain.parents = parents
    )
}

/// The OpenTelemetry context of `span`, when an OpenTelemetry layer records it: what a later
/// span continues once `span` itself has ended (a settled notice continues the call that
/// opened its epoch). Holding it, unlike holding the span, does not keep the span open.
pub(crate) fn span_context(span: &Span) -> Option<SpanContext> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return None;
    }
    let context = span.context().span().span_context().clone();
    context.is_valid().then_some(context)
}

/// Where a message was sent from, kept with it until a turn claims it: the sender's span
/// while it lives, or the context of one that has ended (a settled notice comes from the
/// call that opened the epoch, long returned); and, for the message a cold resume delivers,
/// the epoch it resumes from, which the turn links to. Holding a context, unlike holding a
/// span, does not keep the span open.
#[derive(Debug)]
pub(crate) struct SentFrom {
    span: Span,
    /// Boxed: most messages carry neither.
    contexts: Option<Box<SentContexts>>,
}

#[derive(Debug, Default)]
struct SentContexts {
    ended: Option<SpanContext>,
    resumes: Option<SpanContext>,
}

impl Default for SentFrom {
    /// From nowhere traced.
    fn default() -> Self {
        Span::none().into()
    }
}

impl From<Span> for SentFrom {
    fn from(span: Span) -> Self {
        Self {
            span,
            contexts: None,
        }
    }
}

impl SentFrom {
    /// Sent from a span that has ended, known by its context (none: from nowhere traced).
    pub(crate) fn ended(context: Option<&SpanContext>) -> Self {
        Self {
            span: Span::none(),
            contexts: context.map(|context| {
                Box::new(SentContexts {
                    ended: Some(context.clone()),
                    resumes: None,
                })
            }),
        }
    }

    /// The same, with the turn that claims it linked to `resumes` (the epoch a cold resume
    /// resumes from).
    pub(crate) fn resuming(mut self, resumes: Option<SpanContext>) -> Self {
        if let Some(resumes) = resumes {
            self.contexts.get_or_insert_default().resumes = Some(resumes);
        }
        self
    }

    /// Keeps only the context of a span an OpenTelemetry layer records, so that holding the
    /// message does not hold its sender's span open (a `tracing` span stays open while
    /// anything holds it, or while a span below it lives: a turn parented on it by `tracing`
    /// would keep a follow-up's call open until the turn ends). A span nothing records that
    /// way is kept: the turn is then its `tracing` child, as any subscriber sees it.
    pub(crate) fn detached(self) -> Self {
        match span_context(&self.span) {
            Some(context) => {
                let mut contexts = self.contexts.unwrap_or_default();
                contexts.ended = Some(context);
                Self {
                    span: Span::none(),
                    contexts: Some(contexts),
                }
            }
            None => self,
        }
    }

    /// Whether nothing traced sent it: nothing to keep.
    pub(crate) fn is_none(&self) -> bool {
        self.span.is_none() && self.contexts.is_none()
    }
}

/// An event `$name` on `$parent` recording a call's answer about `$child`: accepted (with
/// the id of the message it sent, when it sent one), or refused with its code.
macro_rules! answered {
    ($name:literal, $parent:expr, $child:expr, $answer:expr) => {
        match $answer {
            Ok(message) => tracing::event!(
                name: $name,
                parent: $parent,
                tracing::Level::INFO,
                subagents.child = %$child,
                subagents.message.id = message.map(tracing::field::display),
                subagents.outcome = "accepted",
            ),
            Err(error) => tracing::event!(
                name: $name,
                parent: $parent,
                tracing::Level::INFO,
                subagents.child = %$child,
                subagents.outcome = "refused",
                error.type = error.code().as_str(),
            ),
        }
    };
}

/// Marks a follow-up's answer on the span it was sent from.
pub(crate) fn followup_event(sent_from: &Span, child: SessionId, answer: &Result<MessageId>) {
    if !sent_from.is_disabled() {
        answered!("followup", sent_from, child, answer.as_ref().map(Some));
    }
}

/// Marks an interrupt's answer on the span current where it was asked for.
pub(crate) fn interrupt_event(target: SessionId, answer: &Result<()>) {
    let current = Span::current();
    if !current.is_disabled() {
        let answer = answer.as_ref().map(|()| None::<&MessageId>);
        answered!("interrupt", &current, target, answer);
    }
}

/// Marks a report's answer on the span it was sent from.
pub(crate) fn report_event(sent_from: &Span, child: SessionId, answer: &Result<MessageId>) {
    if !sent_from.is_disabled() {
        answered!("report", sent_from, child, answer.as_ref().map(Some));
    }
}

/// The span of a request served for another process or node (`otel.name` `name`, kind
/// server), continuing the caller's trace when `traceparent` names one; none otherwise, so a
/// request from an untraced caller adds nothing.
pub fn served_span(name: &str, traceparent: Option<&str>) -> Span {
    let Some(traceparent) = traceparent else {
        return Span::none();
    };
    let span = tracing::info_span!("served", otel.name = name, otel.kind = "server");
    continue_remote(&span, traceparent);
    span
}

/// The W3C `traceparent` of `span`, when an OpenTelemetry layer (`tracing-opentelemetry`)
/// records it: what a child in another process or on another node continues. `None` for a
/// span nothing records (and then at the cost of a check).
pub fn traceparent_of(span: &Span) -> Option<String> {
    span_context(span).and_then(|context| traceparent_of_context(&context))
}

/// The W3C `traceparent` of a span by its context.
pub(crate) fn traceparent_of_context(context: &SpanContext) -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    let mut carrier = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new().inject_context(
        &opentelemetry::Context::new().with_remote_span_context(context.clone()),
        &mut carrier,
    );
    carrier.remove("traceparent")
}

/// Makes `span` a child of the span `parent` names (one that has ended, or one in another
/// process).
fn continue_context(span: &Span, parent: &SpanContext) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    // Refused only for a span already started or not recorded: nothing to continue then.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent.clone()));
}

/// Makes `span` continue the trace a W3C `traceparent` from another process names; a value
/// that does not parse leaves `span` where it was.
fn continue_remote(span: &Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let carrier =
        std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let remote = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    if remote.span().span_context().is_valid() {
        // Refused only for a span already started or not recorded: nothing to continue then.
        let _ = span.set_parent(remote);
    }
}
