//! Provides the session log: its event vocabulary, header, invariants, seed rules, crash repair
//! and the folds the delegation API reads from a run's events.

mod adjacent;
pub mod event;
pub mod event_list;
pub mod fold;
pub mod header;
pub mod history;
pub mod invariants;
pub mod log;
mod paged_inserts;
mod paging;
pub mod repair;
pub mod seed;
pub(crate) mod shared_seq;
pub mod view;
pub(crate) mod write_behind;

pub use event::{
    CancelCause, EventKind, FailureCategory, InboxTarget, LlmFailure, SessionEvent, SpliceOutcome,
    SurfaceOp, TokenUsage, ToolErrorInfo, TurnEndReason,
};
pub use event_list::EventList;
pub use fold::{
    continuable_stop_reason, final_assistant_output, fold_consumed_work, one_shot_stop_reason,
    AssistantOutputFold, ConsumedWork,
};
pub use header::{SeedReference, SessionHeader, SessionOrigin, SESSION_FORMAT_VERSION};
pub use history::{History, HistoryEntry};
pub use invariants::LogShape;
pub(crate) use log::LogMemo;
pub use log::SessionLog;
pub use repair::{interrupted_turn_closers, interrupted_turn_closers_after};
pub use seed::{check_lossless, validate_seed, Seed};
pub use view::SessionLogView;
pub use write_behind::WRITE_BEHIND_LIMIT;
