//! Provides [`ScriptedProvider`]: a deterministic double of a provider, for testing consumers
//! of the delegation API (tools, job runners, listeners) without any child agent.
//!
//! Each start counts, fails when asked to or when the request is already cancelled, and otherwise
//! returns a remote-style run (`local_agent` is `None`) whose result is the scripted reply, held
//! behind an optional [`Gate`]. A cancel or a dispose before the gate opens settles the run
//! `aborted` with no output. Made [`ScriptedProvider::prepares_continuable`], it also prepares
//! fresh continuable children, behind the same start gate: a test holds a continuable start inside
//! its admitted creation window there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::content::ContentBlock;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, PrepareContinuable,
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentResult,
    SubagentRun,
};
use crate::stop_reason::StopReason;
use crate::testing::Gate;

/// A scripted provider. Clones share the start counter and the record of requests.
#[derive(Clone)]
pub struct ScriptedProvider {
    name: String,
    capabilities: SubagentCapabilities,
    inherits_parent_context: bool,
    reply: Vec<ContentBlock>,
    stop_reason: StopReason,
    structured: Option<Value>,
    diagnostic: Option<String>,
    gate: Option<Gate>,
    start_gate: Option<Gate>,
    continuable: bool,
    fixed_id: Option<SessionId>,
    start_failure: Option<SubagentError>,
    result_failure: Option<SubagentError>,
    dispose_failure: Option<SubagentError>,
    starts: Arc<AtomicUsize>,
    disposals: Arc<AtomicUsize>,
    requests: Arc<std::sync::Mutex<Vec<ResolvedSubagentStartRequest>>>,
}

impl std::fmt::Debug for ScriptedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ScriptedProvider {
    /// A provider named `name` with every capability, answering "scripted reply" `completed`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            capabilities: SubagentCapabilities::ALL,
            inherits_parent_context: false,
            reply: vec![ContentBlock::text("scripted reply")],
            stop_reason: StopReason::Completed,
            structured: None,
            diagnostic: None,
            gate: None,
            start_gate: None,
            continuable: false,
            fixed_id: None,
            start_failure: None,
            result_failure: None,
            dispose_failure: None,
            starts: Arc::default(),
            disposals: Arc::default(),
            requests: Arc::default(),
        }
    }

    /// Advertises `capabilities`.
    #[must_use]
    pub fn capabilities(mut self, capabilities: SubagentCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Answers `reply` with `stop_reason`.
    #[must_use]
    pub fn reply(mut self, reply: Vec<ContentBlock>, stop_reason: StopReason) -> Self {
        self.reply = reply;
        self.stop_reason = stop_reason;
        self
    }

    /// Adds a structured value to the result.
    #[must_use]
    pub fn structured(mut self, value: Value) -> Self {
        self.structured = Some(value);
        self
    }

    /// Adds a diagnostic to the result (bounded as [`SubagentResult::with_diagnostic`] bounds it).
    #[must_use]
    pub fn diagnostic(mut self, diagnostic: impl Into<String>) -> Self {
        let bounded = SubagentResult::empty(StopReason::Error).with_diagnostic(diagnostic);
        self.diagnostic = bounded.diagnostic;
        self
    }

    /// Holds every result until `gate` is released.
    #[must_use]
    pub fn gated(mut self, gate: &Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    /// Offers continuable children: `prepare_continuable` counts as a start, fails as one
    /// when asked to (or when the request is already cancelled), waits at the start gate, and
    /// answers a fresh child (no seed).
    #[must_use]
    pub fn prepares_continuable(mut self) -> Self {
        self.continuable = true;
        self
    }

    /// Holds every start (before publication) until `gate` is released.
    #[must_use]
    pub fn gated_start(mut self, gate: &Gate) -> Self {
        self.start_gate = Some(gate.clone());
        self
    }

    /// Returns `id` as every run's id.
    #[must_use]
    pub fn fixed_id(mut self, id: SessionId) -> Self {
        self.fixed_id = Some(id);
        self
    }

    /// Fails every start with `error`.
    #[must_use]
    pub fn fail_start(mut self, error: SubagentError) -> Self {
        self.start_failure = Some(error);
        self
    }

    /// Fails every result with `error` (an infrastructure fault).
    #[must_use]
    pub fn fail_result(mut self, error: SubagentError) -> Self {
        self.result_failure = Some(error);
        self
    }

    /// Fails every disposal with `error`.
    #[must_use]
    pub fn fail_dispose(mut self, error: SubagentError) -> Self {
        self.dispose_failure = Some(error);
        self
    }

    /// Describes the provider as seeding children with the parent's context.
    #[must_use]
    pub fn inherits_parent_context(mut self, inherits: bool) -> Self {
        self.inherits_parent_context = inherits;
        self
    }

    /// How many starts were attempted.
    pub fn start_count(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }

    /// How many of its runs were disposed (a run's disposal runs at most once).
    pub fn dispose_count(&self) -> usize {
        self.disposals.load(Ordering::SeqCst)
    }

    /// Every resolved request received, oldest first.
    pub fn requests(&self) -> Vec<ResolvedSubagentStartRequest> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn outcome(&self) -> Result<SubagentResult> {
        match &self.result_failure {
            Some(error) => Err(error.clone()),
            None => Ok(SubagentResult {
                output: self.reply.clone(),
                structured: self.structured.clone(),
                stop_reason: self.stop_reason.clone(),
                diagnostic: self.diagnostic.clone(),
            }),
        }
    }
}

impl SubagentProvider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        self.capabilities
    }

    fn inherits_parent_context(&self) -> bool {
        self.inherits_parent_context
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        self.continuable.then_some(self as &dyn PrepareContinuable)
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request.clone());
        let started = match (&self.start_failure, request.request.cancel.is_cancelled()) {
            (Some(error), _) => Err(error.clone()),
            (None, true) => Err(SubagentError::new(
                ErrorCode::AbortedBeforePublication,
                "subagent request was aborted before child publication",
            )),
            (None, false) => Ok(()),
        };
        let provider = self.clone();
        Box::pin(async move {
            started?;
            if let Some(gate) = &provider.start_gate {
                gate.pass().await;
            }
            let cancel = request.request.cancel.clone();
            let disposed = CancellationToken::new();
            let stop = disposed.clone();
            let gate = provider.gate.clone();
            let dispose_failure = provider.dispose_failure.clone();
            let disposals = Arc::clone(&provider.disposals);
            let id = provider.fixed_id.unwrap_or_default();
            let task = tokio::spawn(async move {
                let opened = async {
                    if let Some(gate) = gate {
                        gate.pass().await;
                    }
                };
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => Ok(SubagentResult::empty(StopReason::Aborted)),
                    () = stop.cancelled() => Ok(SubagentResult::empty(StopReason::Aborted)),
                    () = opened => provider.outcome(),
                }
            });
            let result = async move {
                task.await
                    .map_err(|error| SubagentError::bug(format!("scripted run failed: {error}")))?
            };
            Ok(SubagentRun::new(id, None, result, move || {
                Box::pin(async move {
                    disposals.fetch_add(1, Ordering::SeqCst);
                    disposed.cancel();
                    dispose_failure.map_or(Ok(()), Err)
                })
            }))
        })
    }
}

impl PrepareContinuable for ScriptedProvider {
    fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let refused = match (&self.start_failure, request.cancel.is_cancelled()) {
            (Some(error), _) => Some(error.clone()),
            (None, true) => Some(SubagentError::new(
                ErrorCode::Cancelled,
                "the continuable start was cancelled before its creation",
            )),
            (None, false) => None,
        };
        let gate = self.start_gate.clone();
        Box::pin(async move {
            if let Some(error) = refused {
                return Err(error);
            }
            if let Some(gate) = gate {
                gate.pass().await;
            }
            Ok(ContinuableCreateSpec::default())
        })
    }
}
