//! The contract every out-of-process provider shares (ACP, Codex, Claude Code, the SDK
//! provider): no start capabilities, no parent context, one-shot runs only; the working
//! directory rules; the allow-listed environment; the settlement rules; and [`ChildProcess`],
//! whose whole process tree is terminated and reaped so that no process outlives its run.
//!
//! Every such provider's `start` has three phases. Validation runs first and refuses without
//! starting anything. Startup (spawn, handshake, session) follows; a failure there reaps the
//! child before the start fails. Publication comes last; from then on every failure settles
//! through the run's result, never as an error. No provider bounds a run's wall time: only the
//! caller cancels it.

pub(crate) mod codex;
mod config;
pub(crate) mod diagnostic;
mod env;
pub(crate) mod launch;
pub(crate) mod ndjson;
mod process;
mod settle;
pub(crate) mod stderr_tail;
mod task;

pub use config::{
    default_dispose_eof_grace_ms, default_dispose_grace_ms, default_max_frame_bytes,
    default_startup_timeout_ms, dispose_grace, grace_ms, no_parent_cwd, positive_bytes,
    positive_finite, require_non_empty, resolve_child_cwd, usable_cwd, validate_configured_cwd,
    CwdLabel, MAX_GRACE_MS,
};
pub(crate) use env::with_trace_context;
pub use env::{child_env, BASE_ENV};
pub use ndjson::DEFAULT_MAX_FRAME_BYTES;
pub use process::{ChildProcess, ExitOutcome, ProcessSpec, StderrMode, KILLED_WITHIN};
pub use settle::{out_of_process_run, settle_attempt, PartialOutput};
pub use task::task_texts;

use crate::seam::SubagentCapabilities;

/// What every out-of-process provider advertises: nothing. The service therefore refuses an
/// output schema, a depth cap, a tool filter or a persona before the provider is asked.
pub const NO_START_CAPABILITIES: SubagentCapabilities = SubagentCapabilities::NONE;
