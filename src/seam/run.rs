//! Provides [`SubagentRun`]: the consumer-owned handle of one published one-shot child.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::actors::agent::AgentRef;
use crate::error::Result;
use crate::host::handle::OnceTask;
use crate::ids::SessionId;
use crate::seam::run_outcome::{RunOutcome, SettleObserver};
use crate::seam::SubagentResult;

type SharedResult = Shared<BoxFuture<'static, Result<SubagentResult>>>;
type Dispose = Box<dyn FnOnce() -> BoxFuture<'static, Result<()>> + Send>;

/// One published one-shot child: one disposable foreground delegation with one result. It has
/// no steering and no resume. Cheap to clone; clones share the result and the disposal.
///
/// Consumers await [`SubagentRun::result`] and should always [`SubagentRun::dispose`] to cancel
/// remaining work and reach quiescence, and to learn whether the release failed. A run whose
/// last clone is dropped undisposed is disposed in the background (its error, if any, is
/// logged), so a forgotten run never keeps a live child or its watcher.
#[derive(Clone)]
#[must_use = "a run owns a live child: await `result` and call `dispose`"]
pub struct SubagentRun {
    inner: Arc<RunInner>,
}

struct RunInner {
    id: SessionId,
    local_agent: Option<AgentRef>,
    outcome: Outcome,
    dispose: Mutex<Option<Dispose>>,
    disposal: OnceTask,
}

/// Where a run's result comes from.
enum Outcome {
    /// An in-process run: its own task settles the outcome.
    Local(LocalWiring),
    /// Any other run: a future driven independently of the handle.
    Shared(SharedResult),
}

impl RunInner {
    fn take_dispose(&self) -> BoxFuture<'static, Result<()>> {
        let dispose = self
            .dispose
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match dispose {
            Some(dispose) => dispose(),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

/// What an in-process run has beyond its disposal.
pub(crate) struct LocalWiring {
    /// Settled by the run's own task.
    pub(crate) outcome: Arc<RunOutcome>,
    /// The worker the child lives on, when it has one.
    pub(crate) home: Option<actix::ArbiterHandle>,
}

impl Drop for RunInner {
    fn drop(&mut self) {
        if self.disposal.started() {
            // The child's memory (its log above all) goes back to its worker to be freed there,
            // beside the rest of it, rather than on the caller's thread.
            let home = match &self.outcome {
                Outcome::Local(local) => local.home.as_ref(),
                Outcome::Shared(_) => None,
            };
            if let (Some(agent), Some(home)) = (self.local_agent.take(), home) {
                home.spawn(async move { drop(agent) });
            }
            return;
        }
        let id = self.id;
        let release = self.take_dispose();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = release.await {
                        tracing::warn!(child_id = %id, %error, "disposing a dropped run failed");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(child_id = %id, "a run was dropped outside the actor system: its child is left to shutdown");
            }
        }
    }
}

impl std::fmt::Debug for SubagentRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentRun")
            .field("id", &self.inner.id)
            .field("local", &self.inner.local_agent.is_some())
            .finish()
    }
}

impl SubagentRun {
    /// A run whose outcome is `result` and whose release is `dispose` (called at most once).
    ///
    /// `result` should be driven independently of this handle (for example by a spawned task)
    /// so the run progresses whether or not anyone awaits it.
    pub fn new<R, D>(id: SessionId, local_agent: Option<AgentRef>, result: R, dispose: D) -> Self
    where
        R: Future<Output = Result<SubagentResult>> + Send + 'static,
        D: FnOnce() -> BoxFuture<'static, Result<()>> + Send + 'static,
    {
        Self::from_parts(
            id,
            local_agent,
            Outcome::Shared(result.boxed().shared()),
            dispose,
        )
    }

    /// An in-process run of `agent`, whose own task settles `local.outcome`.
    pub(crate) fn local<D>(agent: AgentRef, local: LocalWiring, dispose: D) -> Self
    where
        D: FnOnce() -> BoxFuture<'static, Result<()>> + Send + 'static,
    {
        Self::from_parts(agent.id(), Some(agent), Outcome::Local(local), dispose)
    }

    fn from_parts<D>(
        id: SessionId,
        local_agent: Option<AgentRef>,
        outcome: Outcome,
        dispose: D,
    ) -> Self
    where
        D: FnOnce() -> BoxFuture<'static, Result<()>> + Send + 'static,
    {
        Self {
            inner: Arc::new(RunInner {
                id,
                local_agent,
                outcome,
                dispose: Mutex::new(Some(Box::new(dispose))),
                disposal: OnceTask::default(),
            }),
        }
    }

    /// The run id: for a local run, the child's session id (its header names the parent).
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The exact published in-process child, or `None` for a remote run.
    pub fn local_agent(&self) -> Option<&AgentRef> {
        self.inner.local_agent.as_ref()
    }

    /// Tells `observer` the run's outcome once it settles, without holding the run (an
    /// observer never keeps a dropped run, or its child, alive). An in-process run's own task
    /// tells it (or this call, when the run has settled already); any other run is watched by
    /// a task of its own.
    pub(crate) fn on_settled(&self, observer: SettleObserver) {
        match &self.inner.outcome {
            Outcome::Local(local) => {
                if let Some(late) = local.outcome.observe(observer) {
                    let outcome = Arc::clone(&local.outcome);
                    tokio::spawn(async move { late(&outcome.outcome().await) });
                }
            }
            Outcome::Shared(result) => {
                let result = result.clone();
                tokio::spawn(async move { observer(&result.await) });
            }
        }
    }

    /// The child's terminal result.
    ///
    /// # Errors
    /// Only an infrastructure fault the delegation API cannot represent as a stop reason; a child
    /// that failed resolves `Ok` with a non-`completed` stop reason.
    ///
    /// # Cancel safety
    /// Cancel safe: the run goes on, and a later call gets the same result.
    pub async fn result(&self) -> Result<SubagentResult> {
        match &self.inner.outcome {
            Outcome::Local(local) => local.outcome.outcome().await,
            Outcome::Shared(result) => result.clone().await,
        }
    }

    /// Cancels remaining work, waits for the child to be quiescent and released. Idempotent:
    /// every call returns the first call's outcome.
    ///
    /// # Errors
    /// Only a release failure (for example, the child's final drain).
    ///
    /// # Cancel safety
    /// Cancel safe: the caller drives the disposal; a call dropped before it finishes hands
    /// the rest to a task of its own, so it is never stranded, and every later call awaits the
    /// same outcome.
    pub async fn dispose(&self) -> Result<()> {
        let inner = Arc::clone(&self.inner);
        self.inner.disposal.run(move || inner.take_dispose()).await
    }
}
