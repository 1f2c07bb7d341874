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

/// The serde shape of the known sources, as written (borrowed from the source).
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownSource<'a> {
    User,
    Model {
        provider: &'a str,
        model: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        call_id: &'a CallId,
    },
    Plugin {
        plugin: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    Coordinator {
        form: &'static str,
        sender_session_id: SessionId,
    },
    #[serde(rename_all = "camelCase")]
    SubagentReport {
        form: &'static str,
        sender_session_id: SessionId,
    },
    #[serde(rename_all = "camelCase")]
    SubagentSettled {
        form: &'static str,
        summary: &'a str,
        sender_session_id: SessionId,
    },
}

/// The `form` of a relayed message's source.
const RELAY: &str = "relay";
/// The `form` of a settled notice's source.
const NOTICE: &str = "notice";

impl Serialize for MessageSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let known = match self {
            Self::User => KnownSource::User,
            Self::Model { provider, model } => KnownSource::Model { provider, model },
            Self::Tool { call_id } => KnownSource::Tool { call_id },
            Self::Plugin { plugin } => KnownSource::Plugin { plugin },
            Self::CoordinatorRelay { sender_session_id } => KnownSource::Coordinator {
                form: RELAY,
                sender_session_id: *sender_session_id,
            },
            Self::SubagentReportRelay { sender_session_id } => KnownSource::SubagentReport {
                form: RELAY,
                sender_session_id: *sender_session_id,
            },
            Self::SubagentSettledNotice {
                summary,
                sender_session_id,
            } => KnownSource::SubagentSettled {
                form: NOTICE,
                summary,
                sender_session_id: *sender_session_id,
            },
            Self::Other(value) => return value.serialize(serializer),
        };
        known.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for MessageSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match deserializer.deserialize_any(RawSourceVisitor)? {
            RawSource::Fields(fields) => Self::known(&fields).unwrap_or_else(|| {
                // A repeated field keeps its last value, as in any JSON object read here.
                Self::Other(Box::new(Value::Object(fields.into_iter().collect())))
            }),
            RawSource::Other(value) => Self::Other(Box::new(value)),
        })
    }
}

impl MessageSource {
    /// The known source `fields` spell (the last of a repeated field counts; others are
    /// ignored), or `None` for any other shape, which is kept verbatim.
    fn known(fields: &[(String, Value)]) -> Option<Self> {
        let field = |name: &str| {
            fields
                .iter()
                .rev()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value)
        };
        let text = |name: &str| field(name)?.as_str();
        let form = |expected: &str| (text("form")? == expected).then_some(());
        let sender = || SessionId::deserialize(field("senderSessionId")?).ok();
        Some(match text("kind")? {
            "user" => Self::User,
            "model" => Self::Model {
                provider: text("provider")?.into(),
                model: text("model")?.into(),
            },
            "tool" => Self::Tool {
                call_id: CallId::new(text("callId")?),
            },
            "plugin" => Self::Plugin {
                plugin: text("plugin")?.to_owned(),
            },
            "coordinator" => {
                form(RELAY)?;
                Self::CoordinatorRelay {
                    sender_session_id: sender()?,
                }
            }
            "subagent-report" => {
                form(RELAY)?;
                Self::SubagentReportRelay {
                    sender_session_id: sender()?,
                }
            }
            "subagent-settled" => {
                form(NOTICE)?;
                Self::SubagentSettledNotice {
                    summary: text("summary")?.to_owned(),
                    sender_session_id: sender()?,
                }
            }
            _ => return None,
        })
    }
}

/// A source as read: an object's fields in order (a list, not a map: a source has a few, and
/// a map would hash every key on every message read), or any other JSON value.
enum RawSource {
    Fields(Vec<(String, Value)>),
    Other(Value),
}

struct RawSourceVisitor;

impl<'de> serde::de::Visitor<'de> for RawSourceVisitor {
    type Value = RawSource;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a message source")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RawSource, A::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some(field) = map.next_entry::<String, Value>()? {
            fields.push(field);
        }
        Ok(RawSource::Fields(fields))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawSource, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(RawSource::Other(Value::Array(items)))
    }

    fn visit_bool<E>(self, value: bool) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::Bool(value)))
    }

    fn visit_i64<E>(self, value: i64) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::from(value)))
    }

    fn visit_u64<E>(self, value: u64) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::from(value)))
    }

    fn visit_f64<E>(self, value: f64) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::from(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::from(value)))
    }

    fn visit_string<E>(self, value: String) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::String(value)))
    }

    fn visit_unit<E>(self) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::Null))
    }

    fn visit_none<E>(self) -> Result<RawSource, E> {
        Ok(RawSource::Other(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawSource, D::Error> {
        deserializer.deserialize_any(self)
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
