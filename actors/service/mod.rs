//! Provides [`SubagentService`], the actor that owns the provider registry and the delegation
//! lifecycle events, and [`Subagents`], its cheap public handle (the delegation API).
//!
//! # One-shot start
//! `start(name, request)` validates in the TypeScript runtime's order, all inside the service's
//! handler (so a removal that the service handled first is always seen): the provider
//! (`NO_PROVIDER`), each requested capability in the order output schema, max depth, tool filter,
//! persona (`UNSUPPORTED_CAPABILITY`, first missing wins), the depth cap (`INVALID_MAX_DEPTH`), the
//! schema (`UNSUPPORTED_SCHEMA`). It then snapshots the one-shot descriptor and hands the provider
//! a copy of the request. The provider's own work runs beside the mailbox.
//!
//! # Observing a run
//! A published run gets a fresh run id; `subagent/start` is emitted before `start` returns, and
//! `subagent/end` once its result settles (with the final output, or with `error` and no output
//! when the result failed as infrastructure). Both are scoped to the delegating parent and each
//! listener is contained on its own. A provider whose start fails emits nothing.
//!
//! # Registration
//! Providers are kept in insertion order under unique names (`DUPLICATE_PROVIDER`).
//! `subagent/provider-added` is dispatched uncontained: a listener that refuses it rolls the
//! registration back (`LISTENER_REJECTED`). Removal blocks new starts and never revokes runs
//! already returned to their holders; `subagent/provider-removed` is contained.

use std::sync::Arc;

use actix::prelude::*;
use futures::future::BoxFuture;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::ids::RunId;
use crate::schema::ObjectSchema;
use crate::seam::depth::check_max_depth;
use crate::seam::{
    ResolvedSubagentStartRequest, SubagentDescriptor, SubagentEvent, SubagentProvider, SubagentRun,
    SubagentRunEndInfo, SubagentRunInfo, SubagentStartRequest,
};
use crate::stop_reason::StopReason;

mod subagents;

pub use subagents::{ProviderRegistration, Subagents};

struct Registered {
    id: u64,
    name: String,
    provider: Arc<dyn SubagentProvider>,
}

/// The provider registry and lifecycle emitter.
pub struct SubagentService {
    providers: Vec<Registered>,
    next_registration: u64,
    events: Arc<EventBus<SubagentEvent>>,
}

impl Actor for SubagentService {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        crate::actors::unbounded_mailbox(ctx);
    }
}

impl SubagentService {
    fn register(&mut self, provider: Arc<dyn SubagentProvider>) -> Result<u64> {
        let name = provider.name().to_owned();
        if name.is_empty() {
            return Err(SubagentError::new(
                ErrorCode::NoProvider,
                "a provider name must be non-empty",
            ));
        }
        if self.providers.iter().any(|p| p.name == name) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateProvider,
                format!("a subagent provider named \"{name}\" is already registered"),
            ));
        }
        self.next_registration += 1;
        let id = self.next_registration;
        self.providers.push(Registered {
            id,
            name: name.clone(),
            provider,
        });
        if let Err(refusal) = self
            .events
            .emit_strict(&SubagentEvent::ProviderAdded(name.clone()))
        {
            self.providers.retain(|p| p.id != id);
            return Err(SubagentError::new(
                ErrorCode::ListenerRejected,
                format!("registering provider \"{name}\" was refused: {refusal}"),
            ));
        }
        Ok(id)
    }

    fn remove(&mut self, id: u64) {
        let Some(index) = self.providers.iter().position(|p| p.id == id) else {
            return;
        };
        let removed = self.providers.remove(index);
        self.events
            .emit(&SubagentEvent::ProviderRemoved(removed.name));
    }

    fn lookup(&self, name: &str) -> Option<Arc<dyn SubagentProvider>> {
        self.providers
            .iter()
            .find(|p| p.name == name)
            .map(|p| Arc::clone(&p.provider))
    }

    /// Validates a start and resolves the provider-facing request.
    fn resolve(
        &self,
        name: &str,
        request: SubagentStartRequest,
    ) -> Result<(Arc<dyn SubagentProvider>, ResolvedSubagentStartRequest)> {
        let provider = self.lookup(name).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::NoProvider,
                format!("no subagent provider named \"{name}\""),
            )
        })?;
        let capabilities = provider.capabilities();
        let requested = [
            (
                request.output_schema.is_some(),
                capabilities.output_schema,
                "outputSchema",
            ),
            (
                request.max_depth.is_some(),
                capabilities.depth_limit,
                "depthLimit",
            ),
            (
                request.tool_filter.is_some(),
                capabilities.tool_filter,
                "toolFilter",
            ),
            (request.persona.is_some(), capabilities.persona, "persona"),
        ];
        if let Some((_, _, option)) = requested
            .iter()
            .find(|(asked, supported, _)| *asked && !supported)
        {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "subagent provider \"{name}\" does not support the \"{option}\" capability"
                ),
            ));
        }
        check_max_depth(request.max_depth)?;
        let output_schema = request
            .output_schema
            .clone()
            .map(ObjectSchema::new)
            .transpose()?;
        let descriptor = SubagentDescriptor::one_shot(name, request.label.clone());
        Ok((
            provider,
            ResolvedSubagentStartRequest {
                request,
                descriptor,
                output_schema,
            },
        ))
    }
}

/// Emits `subagent/start` for a published run and arranges `subagent/end` for its settlement.
fn observe_run(
    events: &Arc<EventBus<SubagentEvent>>,
    provider: String,
    parent: crate::ids::SessionId,
    run: &SubagentRun,
) {
    let info = SubagentRunInfo {
        run_id: RunId::new(),
        provider,
        id: run.id(),
        local: run.local_agent().is_some(),
        parent,
    };
    events.emit(&SubagentEvent::Start(info.clone()));
    let events = Arc::clone(events);
    run.on_settled(Box::new(move |outcome| {
        let (stop_reason, last_assistant_message) = match outcome {
            Ok(result) => {
                let output = (!result.output.is_empty()).then(|| result.output.clone());
                (result.stop_reason.clone(), output)
            }
            Err(error) => {
                tracing::warn!(child_id = %info.id, %error, "a subagent run failed as infrastructure");
                (StopReason::Error, None)
            }
        };
        events.emit(&SubagentEvent::End(SubagentRunEndInfo {
            info,
            stop_reason,
            last_assistant_message,
        }));
    }));
}

/// Registers a provider; replies with its registration id. Errors: `DUPLICATE_PROVIDER`,
/// `LISTENER_REJECTED`.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
struct Register(Arc<dyn SubagentProvider>);

impl Handler<Register> for SubagentService {
    type Result = Result<u64>;

    fn handle(&mut self, msg: Register, _: &mut Context<Self>) -> Self::Result {
        self.register(msg.0)
    }
}

/// Removes a registration (a no-op when it is already gone). Sent with `do_send`: safe to lose
/// only when the service itself is gone.
#[derive(Message)]
#[rtype(result = "()")]
struct Remove(u64);

impl Handler<Remove> for SubagentService {
    type Result = ();

    fn handle(&mut self, msg: Remove, _: &mut Context<Self>) {
        self.remove(msg.0);
    }
}

/// Looks a provider up by name.
#[derive(Message)]
#[rtype(result = "Option<Arc<dyn SubagentProvider>>")]
struct Lookup(String);

impl Handler<Lookup> for SubagentService {
    type Result = Option<Arc<dyn SubagentProvider>>;

    fn handle(&mut self, msg: Lookup, _: &mut Context<Self>) -> Self::Result {
        self.lookup(&msg.0)
    }
}

/// Lists provider names in insertion order.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
struct List;

impl Handler<List> for SubagentService {
    type Result = MessageResult<List>;

    fn handle(&mut self, _: List, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.providers.iter().map(|p| p.name.clone()).collect())
    }
}

/// Looks up a provider for a continuable start: `NO_PROVIDER`, or `UNSUPPORTED_CAPABILITY`
/// when it has no `prepare_continuable` (the one-shot capability flags are not consulted).
#[derive(Message)]
#[rtype(result = "Result<Arc<dyn SubagentProvider>>")]
pub(crate) struct LookupContinuable(pub(crate) String);

impl Handler<LookupContinuable> for SubagentService {
    type Result = Result<Arc<dyn SubagentProvider>>;

    fn handle(&mut self, msg: LookupContinuable, _: &mut Context<Self>) -> Self::Result {
        let name = msg.0;
        let provider = self.lookup(&name).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::NoProvider,
                format!("no subagent provider named \"{name}\""),
            )
        })?;
        if provider.continuable().is_none() {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!("subagent provider \"{name}\" does not support continuable children"),
            ));
        }
        Ok(provider)
    }
}

/// Resolves a one-shot start (see the module docs for the validation order) and hands the
/// provider's start back: the caller's own future drives it, so no task of the service's
/// waits on a provider.
#[derive(Message)]
#[rtype(result = "Result<ResolvedStart>")]
struct Start {
    name: String,
    request: SubagentStartRequest,
}

/// A start the service resolved: the provider's start, under way, and what observing it needs.
struct ResolvedStart {
    started: BoxFuture<'static, Result<SubagentRun>>,
    parent: crate::ids::SessionId,
}

impl Handler<Start> for SubagentService {
    type Result = Result<ResolvedStart>;

    fn handle(&mut self, msg: Start, _: &mut Context<Self>) -> Self::Result {
        let parent = msg.request.parent.id();
        let (provider, resolved) = self.resolve(&msg.name, msg.request)?;
        // Called here, in mailbox order: a provider enqueues its start before the reply.
        Ok(ResolvedStart {
            started: provider.start(resolved),
            parent,
        })
    }
}
