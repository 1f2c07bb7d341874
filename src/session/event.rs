//! Provides [`SessionEvent`], the envelope of one session-log entry, and [`EventKind`], the kinds
//! the delegation API reads and writes.
//!
//! The serde form is the TypeScript runtime's envelope `{type, seq, time, data, ignorable?,
//! surfaceOp?, sourceEventSeqs?}`. A type this crate does not know is kept as
//! [`EventKind::Extension`] when it is marked `ignorable` (or is one of the plugin kinds a later
//! part of the crate owns); an unknown type without `ignorable` fails the load, as it does there.

use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::adjacent::{ContentOf, TaggedContent};
use crate::content::Message;
use crate::host::BudgetLimit;
use crate::ids::CallId;
use crate::model::StreamChunk;

/// Token counts of one model call (disjoint counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<u64>,
    /// Prompt tokens written to the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<u64>,
    /// Reasoning tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<u64>,
}

/// The broad class of a model failure, so a host can tell what must act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureCategory {
    /// Credentials are missing or refused.
    Auth,
    /// A rate limit or quota was hit.
    Quota,
    /// The provider failed (5xx, overload, timeout).
    Provider,
    /// The response broke the protocol (malformed stream).
    Protocol,
}

/// A model failure, as recorded in `turn/end {error}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmFailure {
    /// What went wrong.
    pub message: String,
    /// A short machine code (`UNKNOWN` for a non-model error).
    pub code: String,
    /// The HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's retry hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_retry_after_ms: Option<u64>,
    /// The provider's request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The failure's class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<FailureCategory>,
}

impl LlmFailure {
    /// A failure with a message and a code.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: code.into(),
            status: None,
            provider_retry_after_ms: None,
            request_id: None,
            category: None,
        }
    }
}

/// Why a turn was cancelled. The first cause recorded for a turn wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CancelCause {
    /// The user or host interrupted.
    User,
    /// The delegating parent cancelled.
    Parent,
    /// A hook refused to go on.
    Hook {
        /// The hook's reason.
        reason: String,
    },
    /// The agent is being disposed.
    Disposed,
    /// A cause written by an older runtime.
    Legacy,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TurnEndReason {
    /// The model finished.
    Completed,
    /// A pre-step hook rejected the step, or the model refused.
    Blocked,
    /// The model hit its token limit.
    MaxTokens,
    /// The turn was cancelled.
    Aborted {
        /// Why.
        reason: CancelCause,
    },
    /// The model (or the loop) failed.
    Error {
        /// The failure.
        error: LlmFailure,
    },
    /// The process died mid-turn; written only by crash repair.
    Interrupted,
    /// The agent's budget ran out: the turn opened on a spent budget, a step reached the token
    /// limit, or the wall-time limit passed mid-turn.
    BudgetExhausted {
        /// The limit that was reached.
        limit: BudgetLimit,
    },
}

/// Which inbox list a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxTarget {
    /// A later turn of its own (FIFO, one message per turn).
    NextTurn,
    /// The next step boundary (drained whole).
    NextStep,
}

/// The outcome of an inbox splice that removed messages outside a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpliceOutcome {
    /// The removed messages were discarded.
    Canceled,
}

/// The error info of a failed tool result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolErrorInfo {
    /// The tool name.
    pub name: String,
    /// A stable code (`UNKNOWN_TOOL`, `INVALID_ARGS`, `ABORTED`, ...).
    pub code: String,
}

/// The kinds of session event the runtime reads and writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum EventKind {
    /// A turn begins; numbers start at 1 and continue across a seed.
    #[serde(rename = "turn/start")]
    TurnStart {
        /// The turn number.
        turn: u64,
    },
    /// A turn ends.
    #[serde(rename = "turn/end")]
    TurnEnd {
        /// The turn number.
        turn: u64,
        /// How it ended.
        reason: TurnEndReason,
        /// The W3C `traceparent` of the turn's span, when an OpenTelemetry layer recorded it:
        /// the first turn of a later resume links back to it, on whichever node or process
        /// that resume runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
    /// A step begins; numbers start at 1 within a turn.
    #[serde(rename = "step/start")]
    StepStart {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
    },
    /// A step ends.
    #[serde(rename = "step/end")]
    StepEnd {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
    },
    /// A user-role message entered the model history.
    #[serde(rename = "user/message")]
    UserMessage(Message),
    /// One streamed chunk of a model response.
    #[serde(rename = "assistant/chunk")]
    AssistantChunk {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
        /// The chunk.
        chunk: StreamChunk,
    },
    /// The assembled model response of one step.
    #[serde(rename = "assistant/message")]
    AssistantMessage {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
        /// The message.
        message: Message,
        /// Token counts, when the model sent them (boxed: see `ToolResult`'s `error`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Box<TokenUsage>>,
        /// Set when the message holds what streamed before a cancel.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
    },
    /// A tool call is dispatched.
    #[serde(rename = "tool/call")]
    ToolCall {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
        /// The call id.
        #[serde(rename = "callId")]
        call_id: CallId,
        /// The tool name.
        name: String,
        /// The raw argument text.
        arguments: String,
    },
    /// A tool call's final result.
    #[serde(rename = "tool/result")]
    ToolResult {
        /// The turn number.
        turn: u64,
        /// The step number.
        step: u64,
        /// The tool-result message.
        message: Message,
        /// Set when the call failed (boxed, as `meta` is: every event is as large as the
        /// largest kind, and most results carry neither).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Box<ToolErrorInfo>>,
        /// Tool-defined metadata.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        meta: Option<Box<Value>>,
    },
    /// The inbox journal: every inbox change, appended before the live lists change.
    #[serde(rename = "agent/inbox/spliced")]
    InboxSpliced {
        /// Which list changed.
        target: InboxTarget,
        /// Where the change starts.
        start: u64,
        /// How many messages were removed.
        #[serde(
            rename = "removedCount",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        removed_count: Option<u64>,
        /// The messages inserted.
        inserted: Vec<Message>,
        /// Set when the removal was a cancellation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<SpliceOutcome>,
    },
    /// Marks the end of a seed.
    #[serde(rename = "session/end-seed")]
    EndSeed {},
    /// Any other kind, kept verbatim.
    #[serde(skip)]
    Extension {
        /// The event type: borrowed when it is a name this crate knows, so the events it
        /// writes carry no copy of it.
        event_type: Cow<'static, str>,
        /// The payload.
        data: Value,
    },
}

impl EventKind {
    /// The `type` string of the serde envelope.
    pub fn type_name(&self) -> &str {
        match self {
            Self::TurnStart { .. } => "turn/start",
            Self::TurnEnd { .. } => "turn/end",
            Self::StepStart { .. } => "step/start",
            Self::StepEnd { .. } => "step/end",
            Self::UserMessage(_) => "user/message",
            Self::AssistantChunk { .. } => "assistant/chunk",
            Self::AssistantMessage { .. } => "assistant/message",
            Self::ToolCall { .. } => "tool/call",
            Self::ToolResult { .. } => "tool/result",
            Self::InboxSpliced { .. } => "agent/inbox/spliced",
            Self::EndSeed {} => "session/end-seed",
            Self::Extension { event_type, .. } => event_type,
        }
    }

    /// Whether this kind carries a `surfaceOp` (it enters the model history).
    pub fn is_surface(&self) -> bool {
        matches!(
            self,
            Self::UserMessage(_) | Self::AssistantMessage { .. } | Self::ToolResult { .. }
        )
    }

    fn is_known_type(name: &str) -> bool {
        matches!(
            name,
            "turn/start"
                | "turn/end"
                | "step/start"
                | "step/end"
                | "user/message"
                | "assistant/chunk"
                | "assistant/message"
                | "tool/call"
                | "tool/result"
                | "agent/inbox/spliced"
                | "session/end-seed"
        )
    }
}

/// Event types owned by other parts of the crate (delegation, policy, request logging); they
/// are kept as [`EventKind::Extension`] by this module and may appear between turns.
pub const PLUGIN_EVENT_TYPES: &[&str] = &[
    "subagent/descriptor",
    "subagent/budget",
    "sandbox/mode",
    "approval/policy",
    "request/header",
    "request/context",
    "todo/write",
];

/// How a surface event changes the model history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceOp {
    /// Appends to the history.
    Append,
    /// Replaces the history entries `start..end`. The indices are `u32`: a history holds far
    /// fewer entries, and every event carries this field (a larger one would move every event
    /// into a larger allocation class).
    Replace {
        /// First replaced index.
        start: u32,
        /// One past the last replaced index.
        end: u32,
    },
}

impl Serialize for SurfaceOp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Append => serializer.serialize_str("append"),
            Self::Replace { start, end } => {
                serde_json::json!({"op": "replace", "start": start, "end": end})
                    .serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for SurfaceOp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Replace {
            op: String,
            start: u32,
            end: u32,
        }
        let value = Value::deserialize(deserializer)?;
        if value.as_str() == Some("append") {
            return Ok(Self::Append);
        }
        let replace: Replace = serde_json::from_value(value).map_err(serde::de::Error::custom)?;
        if replace.op != "replace" || replace.start > replace.end {
            return Err(serde::de::Error::custom(
                "surfaceOp must be 'append' or a replace range",
            ));
        }
        Ok(Self::Replace {
            start: replace.start,
            end: replace.end,
        })
    }
}

/// One entry of a session log.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEvent {
    /// Position in the log: the log's length at append, gapless from 0.
    pub seq: u64,
    /// Append time, epoch milliseconds.
    pub time: u64,
    /// What happened.
    pub kind: EventKind,
    /// Whether a reader that does not know the type may skip it.
    pub ignorable: bool,
    /// Set on surface kinds only.
    pub surface_op: Option<SurfaceOp>,
    /// Earlier seqs this event derives from (no duplicates). A boxed slice: it is set once,
    /// and every event in a live log carries the field.
    pub source_event_seqs: Box<[u64]>,
}

impl SessionEvent {
    /// An event at `seq`, stamped now, with `surfaceOp` set exactly when the kind is a surface
    /// kind (invariant 5).
    pub fn new(seq: u64, kind: EventKind) -> Self {
        Self {
            seq,
            time: crate::session::header::now_ms(),
            surface_op: kind.is_surface().then_some(SurfaceOp::Append),
            kind,
            ignorable: false,
            source_event_seqs: Box::default(),
        }
    }
}

/// An event as stored, written from borrowed parts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RawEventRef<'a, D> {
    #[serde(rename = "type")]
    event_type: &'a str,
    seq: u64,
    time: u64,
    data: D,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignorable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    surface_op: Option<SurfaceOp>,
    #[serde(skip_serializing_if = "<[u64]>::is_empty")]
    source_event_seqs: &'a [u64],
}

impl AsRef<SessionEvent> for SessionEvent {
    /// Itself: lets the folds over events take owned, borrowed and shared events alike.
    fn as_ref(&self) -> &SessionEvent {
        self
    }
}

impl Serialize for SessionEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fn raw<'a, D>(event: &'a SessionEvent, event_type: &'a str, data: D) -> RawEventRef<'a, D> {
            RawEventRef {
                event_type,
                seq: event.seq,
                time: event.time,
                data,
                ignorable: event.ignorable,
                surface_op: event.surface_op,
                source_event_seqs: &event.source_event_seqs,
            }
        }
        match &self.kind {
            EventKind::Extension { event_type, data } => {
                raw(self, event_type, data).serialize(serializer)
            }
            // A known kind's `data` is written straight from its variant.
            known => raw(
                self,
                known.type_name(),
                ContentOf {
                    value: known,
                    content: "data",
                },
            )
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for SessionEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

/// Reads the stored envelope. A known kind's `data` that follows its `type` (as this crate
/// writes it) is read straight into its variant; otherwise it is read as JSON and typed at the
/// end, which also serves extensions (whose `ignorable` may come after their `data`).
struct EventVisitor;

/// The envelope's fields; others are skipped.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    #[serde(rename = "type")]
    Type,
    Seq,
    Time,
    Data,
    Ignorable,
    SurfaceOp,
    SourceEventSeqs,
    #[serde(other)]
    Other,
}

/// The envelope's `data`: typed already, or read as JSON.
enum Data {
    Known(EventKind),
    Json(Value),
}

impl<'de> Visitor<'de> for EventVisitor {
    type Value = SessionEvent;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a session event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SessionEvent, A::Error> {
        fn once<T, E: de::Error>(
            slot: &mut Option<T>,
            field: &'static str,
            value: T,
        ) -> Result<(), E> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(E::duplicate_field(field)),
            }
        }
        let mut event_type: Option<String> = None;
        let mut seq = None;
        let mut time = None;
        let mut data = None;
        let mut ignorable = None;
        let mut surface_op = None;
        let mut source_event_seqs = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Type => once(&mut event_type, "type", map.next_value()?)?,
                Field::Seq => once(&mut seq, "seq", map.next_value()?)?,
                Field::Time => once(&mut time, "time", map.next_value()?)?,
                Field::Data => {
                    let value = match event_type.as_deref() {
                        Some(known) if EventKind::is_known_type(known) => Data::Known(
                            map.next_value_seed(TaggedContent::new("type", known, "data"))?,
                        ),
                        _ => Data::Json(map.next_value()?),
                    };
                    once(&mut data, "data", value)?;
                }
                Field::Ignorable => once(&mut ignorable, "ignorable", map.next_value()?)?,
                Field::SurfaceOp => once(
                    &mut surface_op,
                    "surfaceOp",
                    map.next_value::<Option<SurfaceOp>>()?,
                )?,
                Field::SourceEventSeqs => {
                    once(&mut source_event_seqs, "sourceEventSeqs", map.next_value()?)?;
                }
                Field::Other => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        let event_type = event_type.ok_or_else(|| de::Error::missing_field("type"))?;
        let ignorable = ignorable.unwrap_or(false);
        let kind = match data.unwrap_or(Data::Json(Value::Null)) {
            Data::Known(kind) => kind,
            Data::Json(data) if EventKind::is_known_type(&event_type) => {
                TaggedContent::new("type", &event_type, "data")
                    .deserialize(data)
                    .map_err(de::Error::custom)?
            }
            Data::Json(data) if ignorable || PLUGIN_EVENT_TYPES.contains(&event_type.as_str()) => {
                let event_type = match PLUGIN_EVENT_TYPES
                    .iter()
                    .find(|known| **known == event_type)
                {
                    Some(known) => Cow::Borrowed(*known),
                    None => Cow::Owned(event_type),
                };
                EventKind::Extension { event_type, data }
            }
            Data::Json(_) => {
                return Err(de::Error::custom(format!(
                    "unknown event type {event_type:?} without ignorable"
                )))
            }
        };
        Ok(SessionEvent {
            seq: seq.ok_or_else(|| de::Error::missing_field("seq"))?,
            time: time.ok_or_else(|| de::Error::missing_field("time"))?,
            kind,
            ignorable,
            surface_op: surface_op.flatten(),
            source_event_seqs: source_event_seqs
                .map(Vec::into_boxed_slice)
                .unwrap_or_default(),
        })
    }
}
