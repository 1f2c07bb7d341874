//! The shell every process provider shares (ACP, the SDK provider, Codex, Claude Code): an
//! actor, started on first use inside the actor system, that counts the provider's runs and
//! starts each one; every run then lives in tasks of its own, so a slow child never holds the
//! actor. What differs between the providers is their [`ProcessBackend`].

use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use futures::future::BoxFuture;

use crate::error::{Result, SubagentError};
use crate::seam::{ResolvedSubagentStartRequest, SubagentRun};

/// One process provider's checked configuration and its way to start a run.
pub(crate) trait ProcessBackend: Send + Sync + 'static {
    /// The registry name.
    fn name(&self) -> &str;

    /// Validates, starts and publishes one run.
    fn start_run(
        self: Arc<Self>,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>>;
}

/// A backend behind its actor.
pub(crate) struct ProcessShell<B: ProcessBackend> {
    backend: Arc<B>,
    addr: OnceLock<Addr<ShellActor<B>>>,
}

impl<B: ProcessBackend> ProcessShell<B> {
    pub(crate) fn new(backend: B) -> Self {
        Self {
            backend: Arc::new(backend),
            addr: OnceLock::new(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.backend.name()
    }

    /// Starts a run through the actor.
    pub(crate) fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        let addr = self
            .addr
            .get_or_init(|| {
                ShellActor {
                    backend: Arc::clone(&self.backend),
                    started: 0,
                }
                .start()
            })
            .clone();
        Box::pin(async move {
            addr.send(StartRun(request))
                .await
                .map_err(SubagentError::from)?
        })
    }
}

struct ShellActor<B: ProcessBackend> {
    backend: Arc<B>,
    started: u64,
}

impl<B: ProcessBackend> Actor for ShellActor<B> {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Result<SubagentRun>")]
struct StartRun(ResolvedSubagentStartRequest);

impl<B: ProcessBackend> Handler<StartRun> for ShellActor<B> {
    type Result = ResponseFuture<Result<SubagentRun>>;

    fn handle(&mut self, msg: StartRun, _: &mut Context<Self>) -> Self::Result {
        self.started += 1;
        tracing::debug!(provider = %self.backend.name(), started = self.started, "process run start");
        Arc::clone(&self.backend).start_run(msg.0)
    }
}

/// Implements [`crate::seam::SubagentProvider`] and `Debug` for a provider made of a `shell`
/// field (no start capabilities, no parent context, runs through the shell's actor), and
/// [`ProcessBackend`] for its settings type, whose `name` field is the registry name and whose
/// runs start with the async fn `$start(Arc<$settings>, ResolvedSubagentStartRequest)`.
macro_rules! process_provider {
    ($provider:ty, $settings:ty, $start:path) => {
        impl $crate::actors::providers::process::ProcessBackend for $settings {
            fn name(&self) -> &str {
                &self.name
            }

            fn start_run(
                self: std::sync::Arc<Self>,
                request: $crate::seam::ResolvedSubagentStartRequest,
            ) -> futures::future::BoxFuture<'static, $crate::error::Result<$crate::seam::SubagentRun>>
            {
                Box::pin($start(self, request))
            }
        }

        impl $crate::seam::SubagentProvider for $provider {
            fn name(&self) -> &str {
                self.shell.name()
            }

            fn capabilities(&self) -> $crate::seam::SubagentCapabilities {
                $crate::out_of_process::NO_START_CAPABILITIES
            }

            fn inherits_parent_context(&self) -> bool {
                false
            }

            fn start(
                &self,
                request: $crate::seam::ResolvedSubagentStartRequest,
            ) -> futures::future::BoxFuture<'static, $crate::error::Result<$crate::seam::SubagentRun>>
            {
                self.shell.start(request)
            }
        }

        impl std::fmt::Debug for $provider {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($provider))
                    .field("name", &self.shell.name())
                    .finish_non_exhaustive()
            }
        }
    };
}
pub(crate) use process_provider;
