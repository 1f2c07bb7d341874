//! Provides [`SpawnInProcess`]: the `spawn` provider — a fresh in-process child per delegation.

use futures::future::BoxFuture;

use super::LazyProvider;
use crate::actors::providers::in_process::SeedPolicy;
use crate::error::Result;
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, PrepareContinuable,
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentRun,
};

/// The `spawn` provider: each child starts fresh (it does not see the parent's conversation),
/// in the parent's runtime, with every start-time capability. It can also prepare continuable
/// children (which start fresh too).
pub struct SpawnInProcess {
    actor: LazyProvider,
}

impl Default for SpawnInProcess {
    fn default() -> Self {
        Self {
            actor: LazyProvider::new(SeedPolicy::Fresh),
        }
    }
}

impl SpawnInProcess {
    /// The provider's registry name.
    pub const NAME: &'static str = "spawn";
}

impl SubagentProvider for SpawnInProcess {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        false
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

impl PrepareContinuable for SpawnInProcess {
    fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>> {
        self.actor.prepare(request)
    }
}
