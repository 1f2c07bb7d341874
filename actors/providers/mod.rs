//! The provider actors and their public handles: in-process `spawn` and `fork`.

pub mod fork;
pub mod in_process;
pub mod spawn;

use std::sync::OnceLock;

use actix::prelude::*;
use futures::future::BoxFuture;

use crate::error::{Result, SubagentError};
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, ResolvedSubagentStartRequest, SubagentRun,
};
use in_process::{InProcessProvider, Prepare, SeedPolicy, StartOneShot};

/// The actor behind an in-process provider handle, started on first use (inside the actor
/// system) so a handle can be built anywhere.
struct LazyProvider {
    seed: SeedPolicy,
    addr: OnceLock<Addr<InProcessProvider>>,
}

impl LazyProvider {
    const fn new(seed: SeedPolicy) -> Self {
        Self {
            seed,
            addr: OnceLock::new(),
        }
    }

    fn addr(&self) -> Addr<InProcessProvider> {
        self.addr
            .get_or_init(|| InProcessProvider::new(self.seed).start())
            .clone()
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        let addr = self.addr();
        Box::pin(async move {
            addr.send(StartOneShot(request))
                .await
                .map_err(SubagentError::from)?
        })
    }

    fn prepare(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>> {
        let addr = self.addr();
        Box::pin(async move {
            addr.send(Prepare(request))
                .await
                .map_err(SubagentError::from)
        })
    }
}
