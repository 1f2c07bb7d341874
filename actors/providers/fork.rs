//! Provides [`ForkInProcess`]: the `fork` provider — an in-process child seeded with the parent's completed turns.

use futures::future::BoxFuture;

use super::LazyProvider;
use crate::actors::providers::in_process::SeedPolicy;
use crate::error::Result;
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, PrepareContinuable,
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentRun,
};

/// The `fork` provider: each child is seeded with the parent's balanced completed-turn prefix
/// (every event through the parent's last `turn/end`; the in-flight turn is left out), so it
/// continues the parent's conversation, in the parent's runtime, with every start-time
/// capability. A parent with no completed turn forks a fresh child. Continuable fork children
/// capture the prefix once, at creation.
pub struct ForkInProcess {
    actor: LazyProvider,
}

impl Default for ForkInProcess {
    fn default() -> Self {
        Self {
            actor: LazyProvider::new(SeedPolicy::CompletedTurns),
        }
    }
}

impl ForkInProcess {
    /// The provider's registry name.
    pub const NAME: &'static str = "fork";
}

impl SubagentProvider for ForkInProcess {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        true
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        self.actor.start(request)
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

impl PrepareContinuable for ForkInProcess {
    fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>> {
        self.actor.prepare(request)
    }
}
