//! Session projections: pure folds of a session's events ([`ProjectionUnit`]) kept current on
//! every live log by the [`ProjectionRegistry`], checkpointed beside the log for cold sessions,
//! and the durable listing ([`SubagentListEntry`]) they serve.
//!
//! The delegation API registers two units: the subagent identity ([`SubagentIdentityUnit`],
//! `subagent`) and its timing ([`SubagentTimingUnit`], `subagentTiming`).

pub(crate) mod cache;
mod identity;
pub(crate) mod listing;
mod native;
mod registry;
mod timing;
mod unit;

pub use cache::CHECKPOINT_RECORD;
pub use identity::{SubagentIdentity, SubagentIdentityUnit, IDENTITY_UNIT};
pub use listing::{
    SubagentActivity, SubagentDescendantListEntry, SubagentDiagnosticReason, SubagentForestEntry,
    SubagentForestTree, SubagentListEntry, COLD_READS,
};
pub use registry::{CheckpointRow, ProjectionRegistration, ProjectionRegistry, ProjectionSnapshot};
pub use timing::{ActiveSpan, SubagentTiming, SubagentTimingUnit, TIMING_UNIT};
pub use unit::ProjectionUnit;
