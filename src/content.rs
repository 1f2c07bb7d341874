//! Provides the message vocabulary: [`ContentBlock`], [`Message`], [`Role`] and
//! [`MessageSource`].
//!
//! These are plain data that cross the disk and process boundaries, so their serde forms follow the
//! TypeScript runtime's wire shapes (`{"type":"text","text":…}`, `{"kind":"user"}`, camelCase
//! fields).

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::ids::{CallId, MessageId, SessionId};

/// One block of message content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Model reasoning, kept in the log but not required by consumers.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// A tool call the model made; `arguments` is the raw JSON text the model produced.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        /// The call id.
        id: CallId,
        /// The tool name.
        name: String,
        /// The raw argument text (normally a JSON object).
        arguments: String,
    },
    /// The result of one tool call, carried by a user-role message.
    #[serde(rename_all = "camelCase")]
    ToolResult {
        /// The call this answers.
        tool_call_id: CallId,
        /// What the tool returned.
        content: Vec<ContentBlock>,
        /// Whether the call failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// The text of a text block, if this is one.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            _ => None,
        }
    }
}

/// Refuses `content` that says nothing: no block, or only text blocks of whitespace. `what`
/// names it in the error ("a follow-up", "a report", ...).
///
/// # Errors
/// `INVALID_ARGS`: an empty prompt, follow-up or report would run (or wake) a turn with no
/// input.
pub(crate) fn require_content(what: &str, content: &[ContentBlock]) -> crate::error::Result<()> {
    let blank = content
        .iter()
        .all(|block| block.as_text().is_some_and(|text| text.trim().is_empty()));
    if blank {
        return Err(crate::error::SubagentError::new(
            crate::error::ErrorCode::InvalidArgs,
            format!("{what} must carry content: it is empty"),
        ));
    }
    Ok(())
}

/// Who authored a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user side: prompts, follow-ups, tool results, relays and notices.
    User,
    /// The model.
    Assistant,
}

/// Where a message came from.
///
/// The set is open: a source this crate does not know deserializes as [`MessageSource::Other`]
/// and serializes back unchanged, so logs written by newer hosts stay readable.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MessageSource {
    /// Typed by the user or the host.
    User,
    /// Produced by a model.
    Model {
        /// The model provider's route name (shared text: every assistant message carries
        /// it, and a message is as large as its largest source).
        provider: Arc<str>,
        /// The model name.
        model: Arc<str>,
    },
    /// A tool result.
    Tool {
        /// The call it answers.
        call_id: CallId,
    },
    /// A plugin's runtime context.
    Plugin {
        /// The plugin name.
        plugin: String,
    },
    /// A message relayed from a coordinating agent (`send_message`).
    CoordinatorRelay {
        /// The sender's session.
        sender_session_id: SessionId,
    },
    /// A report relayed from a child (`report`).
    SubagentReportRelay {
        /// The reporting child's session.
        sender_session_id: SessionId,
    },
    /// A notice that a continuable child settled.
    SubagentSettledNotice {
        /// A summary, at most 120 characters.
        summary: String,
        /// The settled child's session.
        sender_session_id: SessionId,
    },
    /// A source this crate does not know, kept verbatim (boxed: every message pays for the
    /// largest source inline, and this one is rare).
    Other(Box<Value>),
}

/// The serde shape of the known sources.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownSource {
    User,
    Model {
        provider: String,
        model: String,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        call_id: CallId,
    },
    Plugin {
        plugin: String,
    },
    #[serde(rename_all = "camelCase")]
    Coordinator {
        form: RelayForm,
        sender_session_id: SessionId,
    },
    #[serde(rename_all = "camelCase")]
    SubagentReport {
        form: RelayForm,
        sender_session_id: SessionId,
    },
    #[serde(rename_all = "camelCase")]
    SubagentSettled {
        form: NoticeForm,
        summary: String,
        sender_session_id: SessionId,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RelayForm {
    Relay,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum NoticeForm {
    Notice,
}

impl Serialize for MessageSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let known = match self {
            Self::User => KnownSource::User,
            Self::Model { provider, model } => KnownSource::Model {
                provider: provider.to_string(),
                model: model.to_string(),
            },
            Self::Tool { call_id } => KnownSource::Tool {
                call_id: call_id.clone(),
            },
            Self::Plugin { plugin } => KnownSource::Plugin {
                plugin: plugin.clone(),
            },
            Self::CoordinatorRelay { sender_session_id } => KnownSource::Coordinator {
                form: RelayForm::Relay,
                sender_session_id: *sender_session_id,
            },
            Self::SubagentReportRelay { sender_session_id } => KnownSource::SubagentReport {
                form: RelayForm::Relay,
                sender_session_id: *sender_session_id,
            },
            Self::SubagentSettledNotice {
                summary,
                sender_session_id,
            } => KnownSource::SubagentSettled {
                form: NoticeForm::Notice,
                summary: summary.clone(),
                sender_session_id: *sender_session_id,
            },
            Self::Other(value) => return value.serialize(serializer),
        };
        known.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for MessageSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let Ok(known) = serde_json::from_value::<KnownSource>(value.clone()) else {
            return Ok(Self::Other(Box::new(value)));
        };
        Ok(match known {
            KnownSource::User => Self::User,
            KnownSource::Model { provider, model } => Self::Model {
                provider: provider.into(),
                model: model.into(),
            },
            KnownSource::Tool { call_id } => Self::Tool { call_id },
            KnownSource::Plugin { plugin } => Self::Plugin { plugin },
            KnownSource::Coordinator {
                sender_session_id, ..
            } => Self::CoordinatorRelay { sender_session_id },
            KnownSource::SubagentReport {
                sender_session_id, ..
            } => Self::SubagentReportRelay { sender_session_id },
            KnownSource::SubagentSettled {
                summary,
                sender_session_id,
                ..
            } => Self::SubagentSettledNotice {
                summary,
                sender_session_id,
            },
        })
    }
}

/// One message: an id, a role, content blocks and a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Unique id.
    pub id: MessageId,
    /// Who authored it.
    pub role: Role,
    /// The content.
    pub content: Vec<ContentBlock>,
    /// Where it came from.
    pub source: MessageSource,
}

impl Message {
    /// A user-role message with a fresh id.
    pub fn user(content: Vec<ContentBlock>, source: MessageSource) -> Self {
        Self {
            id: MessageId::new(),
            role: Role::User,
            content,
            source,
        }
    }

    /// An assistant message produced by `provider`/`model`.
    pub fn assistant(content: Vec<ContentBlock>, provider: &str, model: &str) -> Self {
        Self {
            id: MessageId::new(),
            role: Role::Assistant,
            content,
            source: MessageSource::Model {
                provider: provider.into(),
                model: model.into(),
            },
        }
    }

    /// A tool-result message: user role, exactly one tool-result block.
    pub fn tool_result(call_id: CallId, content: Vec<ContentBlock>, is_error: bool) -> Self {
        Self {
            id: MessageId::new(),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call_id.clone(),
                content,
                is_error,
            }],
            source: MessageSource::Tool { call_id },
        }
    }

    /// The concatenated text blocks.
    pub fn text(&self) -> String {
        text_of(&self.content)
    }
}

/// The text blocks of `blocks`, concatenated (other blocks are left out).
pub fn text_of(blocks: &[ContentBlock]) -> String {
    blocks.iter().filter_map(ContentBlock::as_text).collect()
}
