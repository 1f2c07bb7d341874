//! Provides [`Runtime`], the assembled host runtime, and its [`RuntimeBuilder`].
//!
//! A runtime lives inside a running actix `System`: building it starts the agent registry
//! actor on the current arbiter. Everything it hands out (`Agents`, `AgentRef`, handles) is a
//! cheap clone of actor addresses and shared configuration.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::actors::agents::Agents;
use crate::actors::service::Subagents;
use crate::actors::workers::WorkerPool;
use crate::cluster::{ClusterLink, NodeGuard};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::host::{AgentEnv, AgentEvent, DelegationPolicy, PreStepHook, PromptSection};
use crate::jobs::Jobs;
use crate::metrics::Metrics;
use crate::model::{LlmAdapter, ModelRouter};
use crate::projection::ProjectionRegistry;
use crate::store::metered::MeteredStore;
use crate::store::{LeaseHolder, NodeMembership, SessionPersistence, SharedStore};
use crate::tools::{Tool, ToolRegistry};

/// Assembles a [`Runtime`].
#[derive(Default)]
pub struct RuntimeBuilder {
    store: Option<SharedStore>,
    models: ModelRouter,
    tools: Vec<Tool>,
    sections: Vec<PromptSection>,
    variables: BTreeMap<String, String>,
    delegation: Option<Arc<dyn DelegationPolicy>>,
    pre_step: Vec<PreStepHook>,
    workers: usize,
    without_projections: bool,
    without_projection_cache: bool,
    holder: Option<LeaseHolder>,
    cluster: Option<Arc<NodeMembership>>,
    meter: Option<opentelemetry::metrics::Meter>,
    trace_content: bool,
}

impl RuntimeBuilder {
    /// Persists sessions in `store` (without one, everything is live-only).
    #[must_use]
    pub fn store(self, store: impl SessionPersistence) -> Self {
        self.shared_store(Arc::new(store))
    }

    /// Persists sessions in an already shared store.
    #[must_use]
    pub fn shared_store(mut self, store: SharedStore) -> Self {
        self.store = Some(store);
        self
    }

    /// Registers a model adapter under `provider`; the first one is the default route.
    #[must_use]
    pub fn model(mut self, provider: impl Into<String>, adapter: impl LlmAdapter) -> Self {
        self.models.register(provider, Arc::new(adapter));
        self
    }

    /// Registers a global tool.
    #[must_use]
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds a global system-prompt section.
    #[must_use]
    pub fn prompt_section(mut self, section: PromptSection) -> Self {
        self.sections.push(section);
        self
    }

    /// Registers a prompt variable for `{{name}}` interpolation in personas.
    #[must_use]
    pub fn prompt_variable(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.variables.insert(name.into(), value.into());
        self
    }

    /// Installs the deployment's delegation policy (sandbox override and approval pin).
    #[must_use]
    pub fn delegation_policy(mut self, policy: impl DelegationPolicy) -> Self {
        self.delegation = Some(Arc::new(policy));
        self
    }

    /// Adds a pre-step hook every agent runs before its own hooks (a plugin's `agent/pre-step`
    /// listener).
    #[must_use]
    pub fn pre_step_hook(mut self, hook: PreStepHook) -> Self {
        self.pre_step.push(hook);
        self
    }

    /// Builds the runtime without a session projection registry: durable listing then fails
    /// with `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE`, and no checkpoint is cached.
    #[must_use]
    pub fn without_projections(mut self) -> Self {
        self.without_projections = true;
        self
    }

    /// Keeps no projection checkpoints in the store: a listing refolds every cold child from
    /// its log.
    #[must_use]
    pub fn without_projection_cache(mut self) -> Self {
        self.without_projection_cache = true;
        self
    }

    /// Spreads agents over `count` threads (actix arbiters) to use more than one core: the
    /// current arbiter (the one that builds the runtime) and `count - 1` worker threads started
    /// beside it, so one per core is `count` = the number of cores. The registry, the service and
    /// the providers always run on the current arbiter, so it starts with one agent for every
    /// two a started worker takes; then, measured every 10 ms from each thread's run and
    /// run-queue time, it takes fewer while its thread is saturated and busier than the
    /// workers', and more, up to every agent, while it has room (a few children in flight run
    /// fastest beside their caller). The started workers take the rest in turn. The default,
    /// 0 or 1, runs every agent on the current arbiter, which keeps a test's scheduling on one
    /// thread. [`RuntimeBuilder::build`] refuses (`INVALID_ARGS`) more workers than the
    /// process's file-descriptor limit holds.
    #[must_use]
    pub fn workers(mut self, count: usize) -> Self {
        self.workers = count;
        self
    }

    /// Leases every session this runtime drives in `holder`'s name, instead of a fresh
    /// holder's: the holder that joined a cluster as a node
    /// ([`crate::store::PostgresStore::join`]), whose leases then live while the node
    /// heartbeats. One holder per runtime: a store treats a session leased by the same holder
    /// as its own, so two runtimes sharing a holder would take each other's live sessions
    /// (their fencing epochs still keep one of them from writing).
    #[must_use]
    pub fn lease_holder(mut self, holder: LeaseHolder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Runs this runtime as a node of a cluster: `membership` is what
    /// [`crate::store::PostgresStore::join`] answered for this runtime's lease holder (set it
    /// with [`RuntimeBuilder::lease_holder`]). The runtime then serves its peers' deliveries:
    /// children placed here by parents on other nodes ([`crate::ContinuableStartSpec::on_node`]),
    /// and follow-ups, interrupts and releases for them; its own parents' children placed
    /// elsewhere are asked there, and a follow-up to a child resident on another node is
    /// routed to it. [`Runtime::shutdown`] leaves the cluster once everything is released;
    /// dropping the runtime's last handle without it makes the node go silent instead (no more
    /// heartbeats or deliveries served), so its peers see it expire as a dead node.
    #[must_use]
    pub fn cluster(mut self, membership: NodeMembership) -> Self {
        self.cluster = Some(Arc::new(membership));
        self
    }

    /// Records the runtime's metrics ([`crate::metrics`]: children resident, Activations
    /// starting and settling, follow-ups by outcome, cold resumes, drains, store latencies,
    /// lease takeovers, cluster deliveries) with `meter`, for example
    /// `opentelemetry::global::meter("subagents")` after the host installed its meter
    /// provider. Without one the runtime records no metrics and reads no clock for them.
    #[must_use]
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Records content on the runtime's spans ([`crate::trace`]): each model call's system
    /// prompt, input and output messages, and each tool call's arguments and result, as the
    /// OpenTelemetry GenAI conventions name them. Off by default, as the conventions advise:
    /// turn it on only where the trace backend may keep what agents read and write.
    #[must_use]
    pub fn trace_content(mut self, record: bool) -> Self {
        self.trace_content = record;
        self
    }

    /// Starts the runtime's actors on the current arbiter.
    ///
    /// # Errors
    /// `NO_ACTOR_SYSTEM` outside a running actix system; `DUPLICATE_TOOL` for two global tools
    /// with one name.
    pub fn build(self) -> Result<Runtime> {
        if actix::Arbiter::try_current().is_none() {
            return Err(SubagentError::new(
                ErrorCode::NoActorSystem,
                "a runtime must be built inside a running actix system",
            ));
        }
        if let Some(membership) = &self.cluster {
            let holder = self.holder.as_ref().map(LeaseHolder::id);
            if holder != Some(membership.node()) {
                return Err(SubagentError::new(
                    ErrorCode::InvalidArgs,
                    format!(
                        "a cluster node's runtime must lease in its node's name: set \
                         lease_holder to the holder that joined as node {}",
                        membership.node()
                    ),
                ));
            }
        }
        WorkerPool::admit(self.workers)?;
        let tools = Arc::new(ToolRegistry::new());
        for tool in self.tools {
            tools.register(tool)?;
        }
        let metrics = self
            .meter
            .as_ref()
            .map(|meter| Arc::new(Metrics::new(meter)));
        // A metered runtime's store is timed where the runtime calls it.
        let store = match (self.store, &metrics) {
            (Some(store), Some(metrics)) => Some(MeteredStore::wrap(store, Arc::clone(metrics))),
            (store, _) => store,
        };
        let env = Arc::new(AgentEnv {
            models: self.models,
            tools,
            sections: self.sections,
            events: EventBus::new(),
            store,
            variables: self.variables,
            delegation: self.delegation,
            pre_step: self.pre_step,
            projections: (!self.without_projections).then(ProjectionRegistry::with_seam_units),
            projection_cache: !self.without_projection_cache,
            metrics: metrics.clone(),
            trace_content: self.trace_content,
        });
        let cluster = self
            .cluster
            .map(|membership| ClusterLink::new(membership, metrics));
        let agents = Agents::start(
            Arc::clone(&env),
            (self.workers > 1).then(|| Arc::new(WorkerPool::new(self.workers))),
            self.holder.unwrap_or_default(),
        );
        let node = cluster.as_ref().map(|link| Arc::new(NodeGuard::new(link)));
        Ok(Runtime {
            subagents: Subagents::start_service(agents.clone(), cluster)?,
            agents,
            env,
            jobs: Jobs::default(),
            _node: node,
        })
    }
}

/// The host runtime: agents, models, tools, events and the store.
#[derive(Clone)]
pub struct Runtime {
    agents: Agents,
    subagents: Subagents,
    env: Arc<AgentEnv>,
    jobs: Jobs,
    /// On a cluster node: makes the node go silent once the last handle is dropped.
    _node: Option<Arc<NodeGuard>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("env", &self.env).finish()
    }
}

impl Runtime {
    /// Starts assembling a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The agents service.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The delegation layer: providers, one-shot and continuable children, listing.
    pub fn subagents(&self) -> &Subagents {
        &self.subagents
    }

    /// The background-job registry (`ctx.jobs`): work starts only once a controller such as
    /// the job tools ([`crate::jobs::tools::install_job_tools`]) is attached.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// Agent lifecycle and inbox events.
    pub fn events(&self) -> &Arc<EventBus<AgentEvent>> {
        &self.env.events
    }

    /// The global tool registry.
    pub fn tools(&self) -> &Arc<ToolRegistry> {
        &self.env.tools
    }

    /// The session store, when configured.
    pub fn store(&self) -> Option<&SharedStore> {
        self.env.store.as_ref()
    }

    /// The session projection registry, unless built without one.
    pub fn projections(&self) -> Option<&Arc<ProjectionRegistry>> {
        self.env.projections.as_ref()
    }

    /// Drains every continuable forest (manager-wide: admission closed, admitted
    /// materializations awaited, Activations released child first), then refuses new agents
    /// (`DRAINING`), waits for creations in progress, and disposes the whole ownership forest
    /// child first (each root by [`crate::AgentHandle::dispose`], which
    /// releases its children before itself), then stops the worker threads.
    ///
    /// # Errors
    /// The first disposal error (a faulted session); every agent is released all the same.
    ///
    /// # Cancel safety
    /// Each disposal runs as its own task; a dropped shutdown leaves the rest undisposed but
    /// never half-disposes an agent.
    pub async fn shutdown(&self) -> Result<()> {
        let mut first_error = self.subagents.drain_all().await.err();
        // No new agent from here on, and none half-created left behind.
        self.agents.close().await;
        // Roots first; disposing a root releases its children before it. An agent whose owner
        // was released meanwhile becomes a root of the next round.
        loop {
            let roots = self.agents.roots().await;
            if roots.is_empty() {
                break;
            }
            let outcomes =
                futures::future::join_all(roots.iter().map(crate::AgentHandle::dispose)).await;
            for outcome in outcomes {
                if let Err(error) = outcome {
                    first_error.get_or_insert(error);
                }
            }
        }
        self.agents.stop_workers();
        // Everything this node held is released: once its last notices are sent, its peers
        // may take its sessions at once.
        if let Some(cluster) = self.subagents.cluster() {
            if let Err(error) = cluster.leave().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
