//! Provides [`SubagentRun`]: the consumer-owned handle of one published one-shot child.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::actors::agent::AgentRef;
use crate::error::Result;
use crate::ids::SessionId;
use crate::seam::SubagentResult;

type SharedResult = Shared<BoxFuture<'static, Result<SubagentResult>>>;
type SharedDisposal = Shared<BoxFuture<'static, Result<()>>>;
type Dispose = Box<dyn FnOnce() -> BoxFuture<'static, Result<()>> + Send>;

/// One published one-shot child: one disposable foreground delegation with one result. It has
/// no steering and no resume. Cheap to clone; clones share the result and the disposal.
///
/// Consumers await [`SubagentRun::result`] and must always [`SubagentRun::dispose`] to cancel
/// remaining work and reach quiescence.
#[derive(Clone)]
pub struct SubagentRun {
    inner: Arc<RunInner>,
}

struct RunInner {
    id: SessionId,
    local_agent: Option<AgentRef>,
    result: SharedResult,
    dispose: Mutex<Option<Dispose>>,
    disposal: OnceLock<SharedDisposal>,
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
        Self {
            inner: Arc::new(RunInner {
                id,
                local_agent,
                result: result.boxed().shared(),
                dispose: Mutex::new(Some(Box::new(dispose))),
                disposal: OnceLock::new(),
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

    /// The child's terminal result.
    ///
    /// # Errors
    /// Only an infrastructure fault the seam cannot represent as a stop reason; a child that
    /// failed resolves `Ok` with a non-`completed` stop reason.
    ///
    /// # Cancel safety
    /// Cancel safe: the run goes on, and a later call gets the same result.
    pub async fn result(&self) -> Result<SubagentResult> {
        self.inner.result.clone().await
    }

    /// Cancels remaining work, waits for the child to be quiescent and released. Idempotent:
    /// every call returns the first call's outcome.
    ///
    /// # Errors
    /// Only a release failure (for example, the child's final drain).
    ///
    /// # Cancel safety
    /// Cancel safe: the disposal runs as its own task once started, so a dropped call never
    /// strands it, and every later call awaits the same outcome.
    pub async fn dispose(&self) -> Result<()> {
        if self.inner.disposal.get().is_none() && tokio::runtime::Handle::try_current().is_err() {
            // Nothing is taken: a later call from inside the actor system can still dispose.
            return Err(crate::error::SubagentError::new(
                crate::error::ErrorCode::NoActorSystem,
                "dispose must be called inside the actor system",
            ));
        }
        self.inner
            .disposal
            .get_or_init(|| {
                let dispose = self
                    .inner
                    .dispose
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                let task = tokio::spawn(async move {
                    match dispose {
                        Some(dispose) => dispose().await,
                        None => Ok(()),
                    }
                });
                async move {
                    task.await.map_err(|error| {
                        crate::error::SubagentError::bug(format!(
                            "the disposal task failed: {error}"
                        ))
                    })?
                }
                .boxed()
                .shared()
            })
            .clone()
            .await
    }
}
