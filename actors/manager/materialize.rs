//! Materializing a continuable child: the fresh start, the Activation's setup, and the
//! install-then-submit sequence a start and a cold resume share (rolled back on any failure).

use super::*;
use crate::cluster::RemoteStart;
use crate::host::DelegatedPolicy;
use crate::session::log::CreationCommit;

/// The setup every Activation gets (fresh or resumed): its composition and the deployment's
/// setup contributions, whose batch is committed once the agent is published.
pub(super) fn activation_setup(
    composition: ChildComposition,
    descriptor: Option<SubagentDescriptor>,
    registry: Arc<SetupRegistry>,
    slot: Arc<std::sync::Mutex<Option<SetupBatch>>>,
) -> impl FnOnce(&mut AgentScope, &SessionLog) -> Result<Option<SetupCommit>> + Send + 'static {
    move |scope: &mut AgentScope, log: &SessionLog| {
        // The descriptor precedes the delegated policy and the first turn (fresh children).
        if let Some(descriptor) = descriptor {
            log.append(descriptor.event())?;
        }
        composition.apply(scope, log)?;
        let batch = registry.apply(scope)?;
        *slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(batch);
        Ok(None)
    }
}

/// Commits a published child's setup batch, or disposes the child when a contribution was
/// revoked while it was built.
pub(super) async fn commit_setup(
    handle: &AgentHandle,
    slot: &std::sync::Mutex<Option<SetupBatch>>,
) -> Result<()> {
    let batch = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(batch) = batch {
        if let Err(error) = batch.commit() {
            if let Err(release) = handle.dispose().await {
                tracing::warn!(%release, "a revoked child failed to dispose");
            }
            return Err(error);
        }
    }
    Ok(())
}

pub(super) fn map_cancelled(error: SubagentError) -> SubagentError {
    if error.code() == ErrorCode::Cancelled {
        cancelled()
    } else {
        error
    }
}

/// What is installed once a child's agent is published.
pub(super) struct Installing {
    pub(super) handle: AgentHandle,
    pub(super) parent: ParentLink,
    pub(super) lineage: Vec<SessionId>,
    pub(super) provider: String,
    pub(super) boundary: usize,
    pub(super) budget: BudgetMeter,
}

/// A message for a resident child, and the budget it raises (if it does).
#[derive(Clone)]
pub(crate) struct Delivery {
    pub(crate) message: Message,
    pub(crate) raise: Option<Budget>,
    /// Whether the child may have accepted this message already (a retried delivery, or a
    /// caller-chosen id): accepting it again answers the first acceptance, once.
    pub(crate) may_repeat: bool,
    /// The span it was sent from: the epoch it opens continues that trace.
    pub(crate) trace: tracing::Span,
}

/// Installs an Activation and submits its first message; rolls back on any failure.
pub(super) async fn install_and_submit(
    manager: Addr<ContinuationManager>,
    installing: Installing,
    delivery: Delivery,
    token: CancellationToken,
) -> Result<MessageId> {
    let handle = installing.handle.clone();
    let child = handle.agent().id();
    let parent = installing.parent.clone();
    // Two round trips through the manager, not one: `Install` announces the child
    // (`subagent/start`), and a drain its listeners ask for then must refuse the first message
    // (`DRAINING`, the child rolled back unseen); it is queued behind `Install` and ahead of
    // `Submit`. Both in one handler, the drain would come too late (CONT-43, CONT-83).
    let installed = manager
        .send(Install {
            installing,
            token: token.clone(),
        })
        .await
        .map_err(SubagentError::from)
        .and_then(|outcome| outcome);
    if let Err(error) = installed {
        // Never installed: no lifecycle edge, no notice; just release the agent.
        if let Err(release) = handle.dispose().await {
            tracing::warn!(%child, %release, "an uninstalled child failed to dispose");
        }
        return Err(error);
    }
    let accepted = match manager
        .send(Submit {
            child,
            parent,
            delivery,
            token,
        })
        .await
        .map_err(SubagentError::from)
        .and_then(|outcome| outcome)
    {
        // A fresh child's creation committed with this acceptance: it is answered only once
        // the store holds it, so a creation the store refused is rolled back, never answered.
        Ok(accepted) => match accepted.await {
            Ok(id) => handle.agent().log().inner().stored().await.map(|()| id),
            Err(error) => Err(error),
        },
        Err(error) => Err(error),
    };
    match accepted {
        Ok(id) => Ok(id),
        Err(error) => {
            // Installed and announced to listeners, never to the caller: a full disposal
            // (its `subagent/end`), but no settled notice.
            if let Ok(Some(disposal)) = manager.send(Rollback { child }).await {
                if let Err(teardown) = disposal.await {
                    tracing::warn!(%child, %teardown, "a rolled-back child failed to tear down");
                }
            }
            Err(error)
        }
    }
}

/// Internal: installs a published child as a resident Activation (re-checking the token,
/// admission, the parent and its disposal), then emits `subagent/start`.
#[derive(Message)]
#[rtype(result = "Result<()>")]
struct Install {
    installing: Installing,
    token: CancellationToken,
}

impl Handler<Install> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: Install, ctx: &mut Context<Self>) -> Result<()> {
        let Installing {
            handle,
            parent,
            lineage,
            provider,
            boundary,
            budget,
        } = msg.installing;
        if msg.token.is_cancelled() {
            return Err(cancelled());
        }
        self.assert_admitting(&lineage)?;
        let child = handle.agent().clone();
        let id = child.id();
        if !parent.is_alive() {
            return Err(unauthorized(format!(
                "agent {} is no longer the exact live parent of continuable child {id}",
                parent.id()
            )));
        }
        if self.residents.contains_key(&id) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateAgent,
                format!("continuable child {id} already has an Activation"),
            ));
        }
        let local_parent = match &parent {
            ParentLink::Local(agent) => self.residents.get_mut(&agent.id()).map(|r| (r, agent)),
            ParentLink::Remote(_) => None,
        };
        let owned_by_parent = match local_parent {
            Some((resident, parent)) if resident.agent == *parent => {
                if resident.disposal.is_some() {
                    return Err(SubagentError::new(
                        ErrorCode::ActivationClosing,
                        format!("parent Activation {} is already settling", parent.id()),
                    ));
                }
                resident.own(id);
                true
            }
            _ => false,
        };
        if let (false, ParentLink::Local(agent)) = (owned_by_parent, &parent) {
            self.owner_node(agent.id(), ctx).residents += 1;
        }
        child.observe(self.activity_observer(ctx), budget.clone());
        let activation = Activation::start_beside(handle, boundary);
        let mut ancestry = Vec::with_capacity(lineage.len() + 1);
        ancestry.push(id);
        ancestry.extend(lineage);
        let resident = Box::new(Resident {
            agent: child,
            activation,
            parent,
            ancestry,
            owned_by_parent,
            owned: None,
            accepted: None,
            busy: false,
            armed: false,
            announced: false,
            handed_over: false,
            disposal: None,
            run_id: RunId::new(),
            provider: provider.into_boxed_str(),
            budget,
            epoch_trace: None,
        });
        self.events.emit(&SubagentEvent::Start(resident.run(id)));
        // Resumed: what it was handed over with is its own to run again.
        self.parked.remove(&id);
        self.residents.insert(id, resident);
        if let Some(metrics) = self.metrics() {
            metrics.residency(Residency::Resident);
        }
        Ok(())
    }
}

/// Internal: admits and posts a message to a resident child (see `submit`).
#[derive(Message)]
#[rtype(result = "Result<BoxFuture<'static, Result<MessageId>>>")]
struct Submit {
    child: SessionId,
    parent: ParentLink,
    delivery: Delivery,
    token: CancellationToken,
}

impl Handler<Submit> for ContinuationManager {
    type Result = Result<BoxFuture<'static, Result<MessageId>>>;

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) -> Self::Result {
        self.submit(msg.child, &msg.parent, msg.delivery, &msg.token, ctx)
    }
}

/// Internal: disposes a child whose first message was never accepted.
#[derive(Message)]
#[rtype(result = "Option<Disposal>")]
struct Rollback {
    child: SessionId,
}

impl Handler<Rollback> for ContinuationManager {
    type Result = Option<Disposal>;

    fn handle(&mut self, msg: Rollback, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(resident) = self.residents.get_mut(&msg.child) {
            resident.announced = false;
        }
        self.open_disposal(msg.child, ctx)
    }
}

/// Starts a continuable child; answers at inbox acceptance of its prompt.
#[derive(Message)]
#[rtype(result = "Result<ContinuableStart>")]
pub(crate) struct StartContinuable(pub(crate) ContinuableStartSpec);

impl Handler<StartContinuable> for ContinuationManager {
    type Result = ResponseFuture<Result<ContinuableStart>>;

    fn handle(&mut self, msg: StartContinuable, ctx: &mut Context<Self>) -> Self::Result {
        let spec = msg.0;
        let admitted = self.admit_start(&spec, ctx);
        let manager = ctx.address();
        let service = self.service.clone();
        let agents = self.agents.clone();
        let registry = Arc::clone(&self.setup);
        Box::pin(async move {
            let (plan, _guard) = admitted?;
            let ContinuableStartSpec {
                provider,
                parent,
                prompt,
                cancel: token,
                trace,
                ..
            } = spec;
            if token.is_cancelled() {
                return Err(cancelled());
            }
            let prepared = service
                .send(LookupContinuable(provider.clone()))
                .await
                .map_err(SubagentError::from)??;
            let prepare = prepared
                .continuable()
                .ok_or_else(|| unsupported_continuable(&provider))?
                .prepare_continuable(ContinuableCreateRequest {
                    session_id: plan.child,
                    parent: parent.clone(),
                    cancel: token.clone(),
                });
            let created = prepare.await?;
            if token.is_cancelled() {
                return Err(cancelled());
            }
            let seed = created.seed.unwrap_or_default();
            let cwd = parent.header().cwd;
            if let Some(placement) = plan.placement {
                let seed = match (seed.is_empty(), seed.placement()) {
                    (true, _) => None,
                    (false, Some(prefix)) => {
                        // The child's node reads the prefix from the shared store, which this
                        // process does not order: it is there, durably, before the ask leaves.
                        seed.flush_source().await?;
                        Some(prefix)
                    }
                    (false, None) => {
                        return Err(SubagentError::new(
                            ErrorCode::UnsupportedCapability,
                            format!(
                                "subagent provider \"{provider}\" seeds its children with turns \
                                 the store does not hold, which cannot be placed on another node"
                            ),
                        ))
                    }
                };
                let start = RemoteStart {
                    child: plan.child,
                    parent: parent.id(),
                    lineage: plan.lineage,
                    depth: plan.depth,
                    options: plan.options,
                    descriptor: plan.descriptor.to_json(),
                    policy: plan.policy,
                    cwd: cwd.map(|cwd| cwd.to_string_lossy().into_owned()),
                    provider,
                    prompt,
                    seed,
                    traceparent: crate::trace::traceparent_of(&trace),
                };
                // The child's node takes a start only from the node holding the parent's
                // lease, which a fresh continuable child takes when its creation is written,
                // behind its prompt's acceptance: a parent starting from its first turn asks
                // once it is stored.
                parent.log().inner().stored().await?;
                return remote::place(manager, placement, parent, start).await;
            }
            let fresh = FreshChild {
                child: plan.child,
                depth: plan.depth,
                lineage: plan.lineage,
                options: plan.options,
                descriptor: plan.descriptor,
                composition: plan.composition,
                seed,
                cwd,
                provider,
                prompt,
                trace,
            };
            let parent = ParentLink::Local(parent);
            create_and_install(manager, agents, registry, parent, fresh, token).await
        })
    }
}

/// A fresh child's creation inputs, resolved by its parent's runtime.
pub(super) struct FreshChild {
    pub(super) child: SessionId,
    pub(super) depth: u64,
    pub(super) lineage: Vec<SessionId>,
    pub(super) options: AgentOptions,
    pub(super) descriptor: SubagentDescriptor,
    pub(super) composition: ChildComposition,
    pub(super) seed: crate::session::Seed,
    pub(super) cwd: Option<std::path::PathBuf>,
    pub(super) provider: String,
    pub(super) prompt: Vec<ContentBlock>,
    /// The span the start was called from: the child's first epoch continues that trace.
    pub(super) trace: tracing::Span,
}

/// Creates a fresh child under `parent`, installs its Activation and submits its prompt.
pub(super) async fn create_and_install(
    manager: Addr<ContinuationManager>,
    agents: Agents,
    registry: Arc<SetupRegistry>,
    parent: ParentLink,
    fresh: FreshChild,
    token: CancellationToken,
) -> Result<ContinuableStart> {
    let FreshChild {
        child,
        depth,
        lineage,
        options,
        descriptor,
        composition,
        seed,
        cwd,
        provider,
        prompt,
        trace,
    } = fresh;
    let descriptor_budget = descriptor.budget;
    let inherited = u64::try_from(seed.len()).map_err(|_| SubagentError::bug("seed too long"))?;
    let slot = Arc::default();
    let mut create = CreateAgent::new()
        .id(child)
        .delegated_by(parent.id(), depth)
        .seed(seed, inherited)
        .options(options)
        .setup(activation_setup(
            composition,
            Some(descriptor),
            registry,
            Arc::clone(&slot),
        ))
        .cancel(token.clone())
        .below(&lineage)
        // Stored only once its prompt is accepted: a start refused or rolled back before
        // then (or cut short by a crash) leaves no child in the store to be listed or resumed.
        .stored_on(CreationCommit::FirstAcceptance);
    if let Some(cwd) = cwd {
        create = create.cwd(cwd);
    }
    let handle = agents.create(create).await.map_err(map_cancelled)?;
    commit_setup(&handle, &slot).await?;
    let boundary = usize::try_from(handle.agent().log().len()).unwrap_or(usize::MAX);
    let installing = Installing {
        handle,
        parent,
        lineage,
        provider,
        boundary,
        budget: BudgetMeter::new(
            descriptor_budget.unwrap_or_default(),
            BudgetSpent::default(),
        ),
    };
    let delivery = Delivery {
        message: Message::user(prompt, MessageSource::User),
        raise: None,
        may_repeat: false,
        trace,
    };
    let message_id = install_and_submit(manager, installing, delivery, token).await?;
    Ok(ContinuableStart {
        child_id: child,
        message_id,
    })
}

fn unsupported_continuable(provider: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::UnsupportedCapability,
        format!("subagent provider \"{provider}\" does not support continuable children"),
    )
}

/// What a continuable start resolved before its first await.
struct StartPlan {
    child: SessionId,
    depth: u64,
    lineage: Vec<SessionId>,
    options: AgentOptions,
    descriptor: SubagentDescriptor,
    composition: ChildComposition,
    policy: DelegatedPolicy,
    /// The node the child is placed on, when it is not this one.
    placement: Option<(ClusterLink, NodeId)>,
}

impl ContinuationManager {
    /// The synchronous part of a start: admission, persistence, depth, the descriptor
    /// snapshot and the composition (policy captured at the call), then the materialization
    /// is registered so drains wait for it.
    fn admit_start(
        &mut self,
        spec: &ContinuableStartSpec,
        ctx: &Context<Self>,
    ) -> Result<(StartPlan, MaterializationGuard)> {
        let parent = &spec.parent;
        let lineage = self.lineage_of(parent);
        self.assert_admitting(&lineage)?;
        let env = Arc::clone(self.agents.env());
        if env.store.is_none() {
            return Err(SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "continuable children require session persistence",
            ));
        }
        let depth = resolve_child_depth(parent, spec.max_depth)?;
        if !parent.is_alive() {
            return Err(unauthorized(format!(
                "agent {} is not live and cannot delegate",
                parent.id()
            )));
        }
        let options = child_options(parent, spec.agent_options.clone(), depth);
        let mut descriptor = SubagentDescriptor::continuable(&spec.provider, &spec.label);
        descriptor.agent_provider.clone_from(&options.provider);
        descriptor.agent_model = (!options.model.is_empty()).then(|| options.model.clone());
        descriptor.persona.clone_from(&spec.persona);
        descriptor.tool_filter.clone_from(&spec.tool_filter);
        descriptor.budget = spec.budget.map(budget::normalize).transpose()?;
        let policy = spec.policy.clone().unwrap_or_default();
        let composition = ChildComposition::new(
            &env,
            Some(policy.clone()),
            spec.persona.as_deref(),
            spec.tool_filter.clone(),
        )?;
        let placement = self.placement(spec.node)?;
        let materialization = self.register_materialization(lineage.clone(), None, ctx);
        Ok((
            StartPlan {
                child: SessionId::new(),
                depth,
                lineage,
                options,
                descriptor,
                composition,
                policy,
                placement,
            },
            materialization,
        ))
    }
}
