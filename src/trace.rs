//! The spans the runtime records, one tree per delegation: an agent's turn
//! (`invoke_agent`), each model call in it (`chat`) and each tool call (`execute_tool`), named
//! and attributed after the OpenTelemetry semantic conventions for generative AI (`gen_ai.*`).
//!
//! A turn's span is the child of the span its claimed message was sent from: a one-shot
//! child's first turn runs under the delegating `subagent` tool call (or whatever span was
//! current where `Subagents::start` was called), a continuable child's epoch under the span of
//! the start or follow-up that opened it, cold resume included; a parent's turn woken by a
//! child's report runs under the child's `report` call, and one woken by a settled notice
//! under the call that opened the settled epoch. The first turn of a resumed session (a
//! continuable child's cold resume, on any node or after a restart) links to the last turn it
//! ran before, whose `turn/end` keeps that turn's `traceparent`.
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
    // Written out once, on the stack: a `%agent` field would format it once per field.
    let mut id = uuid::Uuid::encode_buffer();
    let id: &str = agent.as_uuid().hyphenated().encode_lower(&mut id);
    let span = tracing::info_span!(
        parent: sent_from.and_then(|sent_from| sent_from.span.id()),
        "invoke_agent",
        otel.name = "invoke_agent",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.id = id,
        gen_ai.conversation.id = id,
        subagents.turn = integer(turn),
    );
    if let Some(ended) = sent_from.and_then(|sent_from| sent_from.ended.as_deref()) {
        continue_context(&span, ended);
    }
    span
}

/// Links `span`, the first turn of this incarnation of the session `log` records, to the last
/// turn the session ran before it, by the `traceparent` that turn's `turn/end` keeps: a cold
/// resume links back to the epoch it resumes from, wherever that epoch ran. A fresh session
/// has no such turn (a fork's seed is its parent's), and a log written while nothing recorded
/// spans keeps none: both cost one look at the log's end.
pub(crate) fn link_resumed(span: &Span, log: &crate::session::SessionLog) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return;
    }
    let last = log.last_of_own(|event| match &event.kind {
        crate::session::EventKind::TurnEnd {
            traceparent: Some(traceparent),
            ..
        } => remote_context(traceparent),
        _ => None,
    });
    if let Some(context) = last {
        span.add_link(context);
    }
}

/// The span of one model call of the current turn, to `model` through `provider`; its usage
/// and finish reason are recorded by [`record_response`].
pub(crate) fn chat_span(provider: &str, model: &str, step: u64) -> Span {
    // A route without a model name (a scripted model) names the span after the operation.
    let named = !model.is_empty();
    let name = if named {
        std::borrow::Cow::Owned(format!("chat {model}"))
    } else {
        std::borrow::Cow::Borrowed("chat")
    };
    tracing::info_span!(
        "chat",
        otel.name = &*name,
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = named.then_some(model),
        subagents.step = integer(step),
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
    use tracing::field::Value;
    let Some(fields) = span.metadata().map(tracing::Metadata::fields) else {
        return;
    };
    let (Some(input), Some(output), Some(reasons)) = (
        fields.field("gen_ai.usage.input_tokens"),
        fields.field("gen_ai.usage.output_tokens"),
        fields.field("gen_ai.response.finish_reasons"),
    ) else {
        return;
    };
    let input_tokens = usage.map(|usage| integer(usage.input_tokens));
    let output_tokens = usage.map(|usage| integer(usage.output_tokens));
    let finish = finish.map(finish_reason);
    // One record for the three: each record is a trip through every layer.
    span.record_all(&fields.value_set(&[
        (
            &input,
            input_tokens.as_ref().map(|tokens| tokens as &dyn Value),
        ),
        (
            &output,
            output_tokens.as_ref().map(|tokens| tokens as &dyn Value),
        ),
        (&reasons, finish.as_ref().map(|finish| finish as &dyn Value)),
    ]));
}

/// A count as a signed integer, the type OpenTelemetry has: an unsigned field would reach the
/// exporter as text (the layer writes any type it has no conversion for out with `Debug`).
fn integer(count: impl TryInto<i64>) -> i64 {
    count.try_into().unwrap_or(i64::MAX)
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
        subagents.drain.parents = integer(parents),
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
/// call that opened the epoch, long returned). Holding a context, unlike holding a span,
/// does not keep the span open.
#[derive(Debug)]
pub(crate) struct SentFrom {
    span: Span,
    /// Boxed: most messages carry none.
    ended: Option<Box<SpanContext>>,
}

impl Default for SentFrom {
    /// From nowhere traced.
    fn default() -> Self {
        Span::none().into()
    }
}

impl From<Span> for SentFrom {
    fn from(span: Span) -> Self {
        Self { span, ended: None }
    }
}

impl SentFrom {
    /// Sent from a span that has ended, known by its context (none: from nowhere traced).
    pub(crate) fn ended(context: Option<&SpanContext>) -> Self {
        Self {
            span: Span::none(),
            ended: context.map(|context| Box::new(context.clone())),
        }
    }

    /// Keeps only the context of a span an OpenTelemetry layer records, so that holding the
    /// message does not hold its sender's span open (a `tracing` span stays open while
    /// anything holds it, or while a span below it lives: a turn parented on it by `tracing`
    /// would keep a follow-up's call open until the turn ends). A span nothing records that
    /// way is kept: the turn is then its `tracing` child, as any subscriber sees it.
    pub(crate) fn detached(self) -> Self {
        match span_context(&self.span) {
            Some(context) => Self {
                span: Span::none(),
                ended: Some(Box::new(context)),
            },
            None => self,
        }
    }

    /// Whether nothing traced sent it: nothing to keep.
    pub(crate) fn is_none(&self) -> bool {
        self.span.is_none() && self.ended.is_none()
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

/// The W3C `traceparent` of a span by its context (version `00`, as the SDK's propagator
/// writes it; written out directly, since every turn's `turn/end` keeps one).
pub(crate) fn traceparent_of_context(context: &SpanContext) -> Option<String> {
    if !context.is_valid() {
        return None;
    }
    let mut written = String::with_capacity(TRACEPARENT_LENGTH);
    written.push_str("00-");
    push_hex(&mut written, &context.trace_id().to_bytes());
    written.push('-');
    push_hex(&mut written, &context.span_id().to_bytes());
    written.push('-');
    push_hex(&mut written, &[context.trace_flags().to_u8()]);
    Some(written)
}

/// The length of a version-`00` `traceparent`: `00-` and 32, 16 and 2 hex digits with their dashes.
const TRACEPARENT_LENGTH: usize = 55;

/// Appends `bytes` as lowercase hex, as W3C Trace Context writes ids.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// The context a W3C `traceparent` names, when it is one: a version other than `ff` (and for
/// `00`, nothing after the flags), a 32-digit trace id and a 16-digit span id that are not all
/// zeros, and two digits of flags (of which only "sampled" is kept), every digit lowercase hex.
/// Read directly rather than through the SDK's propagator, which builds a carrier map for each
/// read and does not check the ids' lengths.
fn remote_context(traceparent: &str) -> Option<SpanContext> {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
    /// `field` as a number, when it is exactly `digits` lowercase hex digits.
    fn hex(field: &str, digits: usize) -> Option<u128> {
        let lowercase_hex = |byte: &u8| matches!(byte, b'0'..=b'9' | b'a'..=b'f');
        (field.len() == digits && field.bytes().all(|byte| lowercase_hex(&byte)))
            .then(|| u128::from_str_radix(field, 16).ok())
            .flatten()
    }
    let mut fields = traceparent.trim().split('-');
    let version = hex(fields.next()?, 2)?;
    let trace_id = hex(fields.next()?, 32)?;
    let span_id = u64::try_from(hex(fields.next()?, 16)?).ok()?;
    let flags = u8::try_from(hex(fields.next()?, 2)?).ok()?;
    if version == 0xff || (version == 0 && fields.next().is_some()) {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from(trace_id),
        SpanId::from(span_id),
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
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
    if let Some(remote) = remote_context(traceparent) {
        continue_context(span, &remote);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};

    use super::*;

    #[test]
    fn a_traceparent_is_written_as_the_sdks_propagator_writes_it_and_reads_back() {
        let context = SpanContext::new(
            TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c_u128),
            SpanId::from(0xb7ad_6b71_6920_3331_u64),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let written = traceparent_of_context(&context).unwrap();
        assert_eq!(
            written,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        let mut carrier = std::collections::HashMap::new();
        opentelemetry_sdk::propagation::TraceContextPropagator::new().inject_context(
            &opentelemetry::Context::new().with_remote_span_context(context.clone()),
            &mut carrier,
        );
        assert_eq!(carrier.get("traceparent"), Some(&written));
        let read = remote_context(&written).unwrap();
        assert_eq!(
            (read.trace_id(), read.span_id(), read.trace_flags()),
            (context.trace_id(), context.span_id(), context.trace_flags())
        );
        assert!(remote_context("00-not-a-traceparent").is_none());
        assert!(traceparent_of_context(&SpanContext::empty_context()).is_none());
    }

    /// What the SDK's propagator reads from `traceparent`: (trace id, span id, flags).
    fn read_by_the_sdk(traceparent: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
        let carrier =
            std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let read = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        let context = read.span().span_context().clone();
        context
            .is_valid()
            .then(|| (context.trace_id(), context.span_id(), context.trace_flags()))
    }

    #[test]
    fn a_traceparent_is_read_as_the_sdk_reads_it_and_refused_where_w3c_refuses_it() {
        let ids = "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331";
        // Read alike: plain, unsampled, unknown flags (zeroed), padded, and a later version with
        // more fields after the flags.
        for agreed in [
            format!("00-{ids}-01"),
            format!("00-{ids}-00"),
            format!("00-{ids}-ff"),
            format!("  00-{ids}-01 "),
            format!("cc-{ids}-01-what-comes-later"),
        ] {
            let ours = remote_context(&agreed)
                .map(|context| (context.trace_id(), context.span_id(), context.trace_flags()));
            assert!(ours.is_some(), "{agreed}");
            assert_eq!(ours, read_by_the_sdk(&agreed), "{agreed}");
        }
        // Refused alike: version ff, version 00 with more fields, uppercase, ids of zeros, not
        // hex, too few fields.
        for refused in [
            format!("ff-{ids}-01"),
            format!("00-{ids}-01-more"),
            format!("00-{}-01", ids.to_uppercase()),
            "00-00000000000000000000000000000000-b7ad6b7169203331-01".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01".to_owned(),
            format!("00-{ids}-zz"),
            format!("00-{ids}"),
            String::new(),
        ] {
            assert!(remote_context(&refused).is_none(), "{refused}");
            assert!(read_by_the_sdk(&refused).is_none(), "{refused}");
        }
        // Refused here though the SDK reads them: ids and fields of the wrong length, and a
        // signed number, none of which W3C Trace Context allows.
        for malformed in [
            "00-af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(remote_context(malformed).is_none(), "{malformed}");
        }
    }
}
