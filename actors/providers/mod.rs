//! The provider actors and their public handles: in-process `spawn` and `fork`, and the
//! out-of-process `acp` (and the SDK provider built on it), `codex` and `claude_code`.

pub mod acp;
pub mod claude_code;
pub mod codex;
pub mod fork;
pub mod in_process;
pub(crate) mod process;
pub mod sdk;
pub mod spawn;

use std::marker::PhantomData;
use std::sync::OnceLock;

use actix::prelude::*;
use futures::future::{BoxFuture, FutureExt};

use crate::error::{Result, SubagentError};
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, PrepareContinuable,
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentRun,
};
use in_process::{start_abandoned, InProcessProvider, Prepare, SeedPolicy, StartOneShot};

/// What distinguishes one in-process provider from another: its name and how it seeds children.
pub trait InProcessKind: Send + Sync + 'static {
    /// The registry name.
    const NAME: &'static str;
    /// How children are seeded.
    const SEED: SeedPolicy;
}

/// An in-process provider handle ([`spawn::SpawnInProcess`], [`fork::ForkInProcess`]). Its
/// actor is started on first use, inside the actor system, so the handle can be built anywhere.
pub struct InProcess<K: InProcessKind> {
    addr: OnceLock<Addr<InProcessProvider>>,
    kind: PhantomData<K>,
}

impl<K: InProcessKind> Default for InProcess<K> {
    fn default() -> Self {
        Self {
            addr: OnceLock::new(),
            kind: PhantomData,
        }
    }
}

impl<K: InProcessKind> std::fmt::Debug for InProcess<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess").field("name", &K::NAME).finish()
    }
}

impl<K: InProcessKind> InProcess<K> {
    /// The provider's registry name.
    pub const NAME: &'static str = K::NAME;

    /// The provider actor, started on first use. Borrowed: a clone of an actix address
    /// allocates a sender of its own.
    fn addr(&self) -> &Addr<InProcessProvider> {
        self.addr
            .get_or_init(|| InProcessProvider::new(K::SEED).start())
    }
}

impl<K: InProcessKind> SubagentProvider for InProcess<K> {
    fn name(&self) -> &str {
        K::NAME
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        K::SEED == SeedPolicy::CompletedTurns
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        // Enqueued now, so starts reach the provider in the order they were made. The message
        // carries its own answer channel instead of going through `send`, whose request holds
        // the whole message inline: the future the caller keeps stays a pointer and a flag.
        let (started, run) = tokio::sync::oneshot::channel();
        self.addr().do_send(StartOneShot {
            request,
            reply: started,
        });
        // A stopped provider actor, or a worker stopped before the child was published, drops
        // the answer channel: the runtime is shutting down.
        Box::pin(run.map(|run| run.map_err(|_| start_abandoned())?))
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

impl<K: InProcessKind> PrepareContinuable for InProcess<K> {
    fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>> {
        let addr = self.addr().clone();
        Box::pin(async move {
            addr.send(Prepare(request))
                .await
                .map_err(SubagentError::from)
        })
    }
}
