//! Provides the provider interface: [`SubagentProvider`], one named child-agent transport, and
//! [`PrepareContinuable`], the optional continuable-creation capability.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::error::Result;
use crate::ids::SessionId;
use crate::seam::{ResolvedSubagentStartRequest, SubagentCapabilities, SubagentRun};
use crate::session::Seed;

/// One registered transport for running child agents. Several coexist in one runtime, each
/// under a unique name. The service may call one provider concurrently for distinct children;
/// each start's cancellation, failure, settlement and disposal stay independent.
pub trait SubagentProvider: Send + Sync + 'static {
    /// The unique registry name (`spawn`, `fork`, `acp`, ...).
    fn name(&self) -> &str;

    /// The start-time features this provider supports.
    fn capabilities(&self) -> SubagentCapabilities;

    /// Whether the child sees the parent's completed-turn prefix. Descriptive only: it says
    /// nothing about tools, services or authority.
    fn inherits_parent_context(&self) -> bool;

    /// Establishes a one-shot child and returns its run once the child is published.
    ///
    /// The service already validated every requested capability and resolved the descriptor.
    /// Before the future resolves the provider owns setup and must clean up any unpublished
    /// resources before failing; from resolution on, failures settle through the run.
    ///
    /// # Cancel safety
    /// The future may be dropped before it resolves: a caller that drops
    /// [`Subagents::start`](crate::Subagents::start) drops it, and `request.request.cancel`
    /// fires with it. Whatever it has set up by then must be released by that drop, or its
    /// work run detached (as the in-process providers do) and abandon the child on the token.
    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>>;

    /// The continuable-creation capability; its presence is the capability.
    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        None
    }
}

/// What a continuable preparation receives.
#[derive(Debug, Clone)]
pub struct ContinuableCreateRequest {
    /// The reserved child session id.
    pub session_id: SessionId,
    /// The delegating parent.
    pub parent: AgentRef,
    /// The caller's cancellation.
    pub cancel: CancellationToken,
}

/// The provider's only contribution to a continuable child: whether it is seeded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContinuableCreateSpec {
    /// A balanced prefix of the parent's log, or `None` for a fresh child.
    pub seed: Option<Seed>,
}

/// Contributes the detached creation inputs of a continuable child.
pub trait PrepareContinuable: Send + Sync {
    /// Prepares the creation inputs for `request.session_id`.
    fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> BoxFuture<'static, Result<ContinuableCreateSpec>>;
}
