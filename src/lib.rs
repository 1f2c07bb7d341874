//! `subagents`: lets an agent delegate work to child agents, on an actix actor system with
//! sled-backed session logs.
//!
//! The **delegation layer** ([`Subagents`], from [`Runtime::subagents`]) holds named providers and
//! starts one-shot children: [`SpawnInProcess`] (a fresh child) and [`ForkInProcess`] (a child
//! seeded with the parent's completed turns) run them in this runtime; a [`SubagentRun`] yields
//! one [`SubagentResult`] (output, optional structured value checked against a JSON Schema
//! subset, stop reason) and is always disposed. Requests are checked against each provider's
//! [`SubagentCapabilities`] before anything exists.
//!
//! **Continuable children** ([`Subagents::start_continuable`]) are durable child sessions with
//! at most one live Activation (the child resident in memory; its run of work until it settles
//! is an *epoch*): [`Subagents::followup`] queues a turn in the child's own inbox
//! (FIFO), [`Subagents::interrupt`] ends its running turn and keeps the queue, the parent hears
//! its reports ([`Subagents::report_from`]) and one settled notice per epoch (a host awaits
//! each epoch's stop reason and output with [`Subagents::settlements`]), and a child that
//! is not resident is cold-resumed from the store. [`Subagents::list_children`],
//! [`Subagents::list_descendants`] and [`Subagents::stream_forest`] (every root's tree, entry by
//! entry) list them durably without loading them;
//! [`Subagents::drain_continuable_descendants`] and [`Runtime::shutdown`] release children
//! before parents. A fork's inherited turns are stored by reference to its parent's log
//! ([`SeedReference`]), not copied.
//!
//! ```
//! use subagents::testing::{ScriptStep, ScriptedModel};
//! use subagents::{
//!     ContentBlock, ContinuableStartSpec, CreateAgent, FollowupOptions, MemoryStore,
//!     MessageSource, Runtime, StopReason,
//! };
//!
//! # fn main() -> Result<(), subagents::SubagentError> {
//! actix::System::new().block_on(async {
//!     let model = ScriptedModel::repeating(ScriptStep::text("done"));
//!     let rt = Runtime::builder().store(MemoryStore::new()).model("scripted", model).build()?;
//!     rt.subagents().register_in_process_providers().await?;
//!     let parent = rt.agents().create(CreateAgent::new()).await?;
//!     let text = |t: &str| vec![ContentBlock::text(t)];
//!     let spec = ContinuableStartSpec::new("spawn", "watcher", parent.agent(), text("watch CI"));
//!     let mut settled = rt.subagents().settlements(parent.agent());
//!     let child = rt.subagents().start_continuable(spec).await?.child_id;
//!     assert_eq!(settled.next_of(child).await?.stop_reason, StopReason::Completed);
//!     let options = FollowupOptions::new(MessageSource::User);
//!     rt.subagents().followup(parent.agent(), child, text("and again"), options).await?;
//!     let listed = rt.subagents().list_children(parent.agent().id(), Default::default()).await?;
//!     assert_eq!(listed.len(), 1);
//!     rt.shutdown().await
//! })
//! # }
//! ```
//!
//! Around it:
//!
//! - **Model-facing tools** ([`install_subagent_tool`], [`install_control_tools`],
//!   [`install_report_tool`]): `subagent`, `subagent_fork`, `subagent_continuable`,
//!   `send_message`, `list_agents` and `report`, so a model delegates by calling them.
//! - **Children in other processes**: [`AcpProvider`] (any Agent Client Protocol agent),
//!   [`CodexProvider`] (`codex app-server`), [`ClaudeCodeProvider`] (the Claude Code CLI) and
//!   [`SdkProvider`] (another `subagents` process); see [`out_of_process`].
//! - **PostgreSQL and the cluster** ([`store::PostgresStore`], [`cluster`]): sessions shared by
//!   processes and machines under fenced leases; runtimes that join as nodes place children on
//!   each other ([`ContinuableStartSpec::on_node`]) and route follow-ups, interrupts, reports and
//!   notices between them.
//! - **The load harness** ([`load`]) and the **history checker** ([`check`]): many concurrent
//!   children with a verified report, and seeded randomized histories checked for
//!   exactly-once delivery; both are `subagents` subcommands too.
//!
//! It stands on the **host runtime**:
//!
//! - **Agents** ([`Agents`], [`AgentRef`], [`AgentHandle`]): one actor per live agent. Its
//!   mailbox feeds its one journaled inbox; a turn runs as a spawned future, so cancel and
//!   status reach it mid-turn. An [`AgentRef`] is exact identity (session id + incarnation).
//!   Every child is owned by its exact parent, and disposal and [`Runtime::shutdown`] release
//!   children first.
//! - **Session logs** ([`SessionLog`], read-only as [`SessionLogView`] for a live agent):
//!   append-only, seq contiguous from 0, checked against the turn/step invariants, seeded only
//!   with balanced prefixes; the model [`History`] is kept incrementally.
//! - **Storage** ([`SessionPersistence`]): [`SledStore`] by default, [`MemoryStore`] for tests.
//!   `flush` is the durability point; a failed write faults its agent instead of vanishing;
//!   every live session is written under its lease's fencing epoch; a turn interrupted by a
//!   crash is repaired on load.
//! - **Models** ([`LlmAdapter`]): [`testing::ScriptedModel`] drives tests and load runs
//!   deterministically, with gates that hold a response until released;
//!   [`model::OpenAiAdapter`] talks to any OpenAI-compatible chat-completions endpoint.
//! - **Tools** ([`Tool`], [`ToolRegistry`]): global and agent-scoped layers, restrictions,
//!   guards, conclude-turn.
//! - **Events** ([`EventBus`]): each listener contained on its own.
//! - **Test doubles** ([`testing`]): the scripted model, a scripted provider, a store that
//!   fails or holds chosen operations.
//!
//! ```
//! use subagents::testing::{ScriptStep, ScriptedModel};
//! use subagents::{ContentBlock, CreateAgent, MessageSource, MemoryStore, Runtime};
//!
//! # fn main() -> Result<(), subagents::SubagentError> {
//! actix::System::new().block_on(async {
//!     let model = ScriptedModel::with_script([ScriptStep::text("hello")]);
//!     let rt = Runtime::builder().store(MemoryStore::new()).model("scripted", model).build()?;
//!     let root = rt.agents().create(CreateAgent::new()).await?;
//!     root.agent().followup(vec![ContentBlock::text("hi")], MessageSource::User).await?;
//!     root.agent().when_idle().await;
//!     let output = subagents::session::final_assistant_output(&root.agent().log().events());
//!     assert_eq!(output, vec![ContentBlock::text("hello")]);
//!     root.dispose().await
//! })
//! # }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![deny(clippy::cast_possible_truncation, clippy::print_stdout)]

#[path = "../actors/mod.rs"]
pub mod actors;
pub mod check;
pub mod cluster;
pub mod content;
pub mod error;
pub mod events;
pub mod host;
pub mod ids;
pub mod jobs;
mod json;
pub mod load;
pub mod metrics;
pub mod model;
pub mod out_of_process;
pub mod projection;
pub mod runtime;
pub mod schema;
pub mod seam;
pub mod session;
pub mod stop_reason;
pub mod store;
pub mod testing;
pub mod tools;
pub mod tour;
pub mod trace;

pub use actors::agent::{AgentRef, AgentSnapshot, InboxPolicy};
pub use actors::agents::Agents;
pub use actors::providers::acp::{AcpPermission, AcpProvider, AcpProviderConfig};
pub use actors::providers::claude_code::{
    ClaudeCodeProvider, ClaudeCodeProviderConfig, ClaudePermissionMode,
};
pub use actors::providers::codex::{CodexPermissionMode, CodexProvider, CodexProviderConfig};
pub use actors::providers::fork::ForkInProcess;
pub use actors::providers::sdk::{SdkProvider, SdkProviderConfig};
pub use actors::providers::spawn::SpawnInProcess;
pub use actors::service::{ProviderRegistration, Subagents};
pub use content::{ContentBlock, Message, MessageSource, Role};
pub use error::{ErrorCode, Result, SubagentError};
pub use events::{EventBus, EventScope, Subscription};
pub use host::{
    AgentEvent, AgentEventKind, AgentOptions, AgentScope, AgentStatus, FlushPolicy, PromptSection,
};
pub use host::{AgentHandle, Budget, BudgetLimit, BudgetSpent, CreateAgent, ResumeAgent};
pub use ids::{CallId, MessageId, RunId, SessionId};
pub use model::{BlockType, FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
pub use projection::{
    SubagentActivity, SubagentDescendantListEntry, SubagentDiagnosticReason, SubagentForestEntry,
    SubagentForestTree, SubagentListEntry,
};
pub use runtime::{Runtime, RuntimeBuilder};
pub use schema::ObjectSchema;
pub use seam::{
    ChildAgentOptions, ContinuableCreateRequest, ContinuableCreateSpec,
    ContinuableSetupContribution, ContinuableStart, ContinuableStartSpec, FollowupOptions,
    InterruptAuthority, PrepareContinuable, ReportDelivery, ReportOptions,
    ResolvedSubagentStartRequest, Settlements, SetupDisposer, SetupRegistration,
    SubagentCapabilities, SubagentDescriptor, SubagentEvent, SubagentProvider, SubagentResult,
    SubagentRun, SubagentRunEndInfo, SubagentStartRequest,
};
pub use session::{
    CancelCause, EventKind, EventList, FailureCategory, History, HistoryEntry, LlmFailure, Seed,
    SeedReference, SessionEvent, SessionHeader, SessionLog, SessionLogView, TokenUsage,
    TurnEndReason,
};
pub use stop_reason::StopReason;
pub use store::{
    Lease, LeaseEpoch, LeaseHolder, MemoryStore, SessionPersistence, SharedStore, SledStore,
};
/// The cancellation token every cancellable operation takes (re-exported from `tokio-util`, so
/// a host needs no direct dependency to build one).
pub use tokio_util::sync::CancellationToken;
pub use tools::{
    install_control_tools, install_report_tool, install_subagent_tool, SubagentToolConfig, Tool,
    ToolCtx, ToolError, ToolFilter, ToolOutput, ToolRegistry, ToolRevocation,
};

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
