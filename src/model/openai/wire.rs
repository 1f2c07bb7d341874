//! Provides the request body: the system prompt, history and tools in chat-completions form.

use super::*;

/// The JSON body of one chat-completions call.
pub(super) fn request_body(config: &OpenAiConfig, request: &GenerateRequest) -> Value {
    let model = if request.model.trim().is_empty() {
        config.model.clone()
    } else {
        request.model.clone()
    };
    let mut body = Map::new();
    body.insert("model".into(), Value::String(model));
    body.insert(
        "messages".into(),
        Value::Array(wire_messages(
            request.system.as_deref(),
            request.messages.messages(),
        )),
    );
    body.insert("stream".into(), Value::Bool(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            Value::Array(request.tools.iter().map(|tool| wire_tool(tool)).collect()),
        );
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), Value::from(max_tokens));
    }
    Value::Object(body)
}

/// One tool as a `function` tool.
pub(super) fn wire_tool(tool: &ToolSchema) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

/// The system prompt and the history as chat messages.
pub(super) fn wire_messages<'a>(
    system: Option<&str>,
    messages: impl ExactSizeIterator<Item = &'a Message>,
) -> Vec<Value> {
    let mut wire = Vec::with_capacity(messages.len().saturating_add(1));
    if let Some(system) = system.filter(|system| !system.is_empty()) {
        wire.push(json!({"role": "system", "content": system}));
    }
    for message in messages {
        match message.role {
            Role::User => push_user(&mut wire, message),
            Role::Assistant => push_assistant(&mut wire, message),
        }
    }
    wire
}

/// A user-role message: each tool result as a `tool` message (they must directly follow the
/// assistant's calls), then the text, if any, as a `user` message.
pub(super) fn push_user(wire: &mut Vec<Value>, message: &Message) {
    let mut text = String::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text: piece } => text.push_str(piece),
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                ..
            } => wire.push(json!({
                "role": "tool",
                "tool_call_id": tool_call_id.as_str(),
                "content": plain_text(content),
            })),
            ContentBlock::Reasoning { .. } | ContentBlock::ToolCall { .. } => {}
        }
    }
    if !text.is_empty() {
        wire.push(json!({"role": "user", "content": text}));
    }
}

/// An assistant message: its text and its tool calls; reasoning is left out, and a message
/// with neither text nor calls is not sent.
pub(super) fn push_assistant(wire: &mut Vec<Value>, message: &Message) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text: piece } => text.push_str(piece),
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({
                "id": id.as_str(),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })),
            ContentBlock::Reasoning { .. } | ContentBlock::ToolResult { .. } => {}
        }
    }
    if text.is_empty() && calls.is_empty() {
        return;
    }
    let mut entry = Map::new();
    entry.insert("role".into(), Value::String("assistant".into()));
    entry.insert(
        "content".into(),
        if text.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        },
    );
    if !calls.is_empty() {
        entry.insert("tool_calls".into(), Value::Array(calls));
    }
    wire.push(Value::Object(entry));
}

/// The text blocks of a tool result, concatenated.
pub(super) fn plain_text(content: &[ContentBlock]) -> String {
    crate::content::text_of(content)
}

// ---------------------------------------------------------------------------------------------
// One call: connect (with retries), then stream.
// ---------------------------------------------------------------------------------------------
