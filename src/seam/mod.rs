//! Provides the delegation API's vocabulary (the module keeps the TypeScript runtime's name for
//! it, the seam): capabilities, the start request, the result, the
//! run, the provider contract, the durable descriptor, lifecycle events, depth rules, the
//! in-process driver and run settlement.

pub(crate) mod budget;
pub mod capabilities;
pub mod child_run;
pub mod continuable;
pub mod depth;
pub mod descriptor;
pub mod events;
pub mod invariant;
pub mod provider;
pub mod request;
pub mod result;
pub mod run;
pub(crate) mod run_outcome;
pub(crate) mod scripted;
pub mod settlement;
pub mod settlements;
pub mod setup;

pub use budget::BUDGET_EVENT;
pub use capabilities::SubagentCapabilities;
pub use continuable::{
    ContinuableStart, ContinuableStartSpec, FollowupOptions, InterruptAuthority, ReportDelivery,
    ReportOptions,
};
pub use descriptor::{
    DelegationMode, SubagentDescriptor, BUDGETED_DESCRIPTOR_VERSION, SUBAGENT_DESCRIPTOR_VERSION,
};
pub use events::{SubagentEvent, SubagentRunEndInfo, SubagentRunInfo};
pub use invariant::LifecycleInvariant;
pub use provider::{
    ContinuableCreateRequest, ContinuableCreateSpec, PrepareContinuable, SubagentProvider,
};
pub use request::{ChildAgentOptions, ResolvedSubagentStartRequest, SubagentStartRequest};
pub use result::SubagentResult;
pub use run::SubagentRun;
pub use settlement::{settle_run, JobOutcome};
pub use settlements::Settlements;
pub use setup::{ContinuableSetupContribution, SetupDisposer, SetupRegistration};
