//! Provides the model-facing `subagent` tool: one delegation tool per configured provider
//! ([`SubagentToolConfig`], installed with [`install_subagent_tool`]).
//!
//! # Mounting
//! The tool exists only while its provider is registered. The installation follows the delegation
//! API's `provider-added` / `provider-removed` events for its own provider name: a removal unmounts
//! the tool at once; an addition mounts it again, with its wording re-derived from the new
//! provider's `inherits_parent_context`. Every event bumps an epoch, and a mount that looked the
//! provider up under an older epoch is dropped, so a quick remove-then-add never leaves a stale
//! tool behind.
//!
//! # Routes
//! - **foreground** (the default for `one-shot` mode): `start`, await the result, then always
//!   dispose once; a non-`completed` stop reason is an `is_error` result;
//! - **continuable background** (the default for `continuable` mode): `start_continuable`,
//!   answered with the durable child id at inbox acceptance;
//! - **one-shot background**: a `subagent` job in the runtime's [`crate::jobs::Jobs`],
//!   answered with its job id at once; the job owns its own cancellation (`job_kill`), and
//!   without a job controller (the job tools) the call is refused before any child starts.
//!
//! Calls are concurrency-safe: several delegations in one model response run in parallel.

mod call;
mod wording;

pub use call::SUBAGENT_STOPPED;

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::actors::agents::Agents;
use crate::actors::service::Subagents;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::{EventScope, Subscription};
use crate::runtime::Runtime;
use crate::seam::{ChildAgentOptions, SubagentEvent, SubagentProvider};
use crate::tools::{Concurrency, Tool, ToolFilter, ToolRegistry};

use self::wording::Wording;

/// The largest depth cap a configuration may name (JavaScript's largest safe integer, as the
/// reference accepts).
const MAX_SAFE_DEPTH: u64 = (1 << 53) - 1;

/// Which route a background call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackgroundMode {
    /// A background call is a one-shot job; calls wait for the result by default.
    #[default]
    OneShot,
    /// A background call starts a continuable child; calls run in the background by default.
    Continuable,
}

/// The delegation-depth cap the tool sends with every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxDepthPolicy {
    /// An absolute cap the provider must enforce (it needs the `depth_limit` capability).
    Limit(u64),
    /// No cap is sent: the provider manages depth itself (out-of-process providers).
    ProviderManaged,
}

impl Default for MaxDepthPolicy {
    fn default() -> Self {
        Self::Limit(3)
    }
}

impl Serialize for MaxDepthPolicy {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Self::Limit(limit) => serializer.serialize_u64(*limit),
            Self::ProviderManaged => serializer.serialize_str("provider-managed"),
        }
    }
}

impl<'de> Deserialize<'de> for MaxDepthPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        match &value {
            serde_json::Value::String(text) if text == "provider-managed" => {
                Ok(Self::ProviderManaged)
            }
            serde_json::Value::Number(number) => number
                .as_u64()
                .filter(|limit| *limit <= MAX_SAFE_DEPTH)
                .map(Self::Limit)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "maxDepth must be a non-negative safe integer or 'provider-managed', not {value}"
                    ))
                }),
            _ => Err(serde::de::Error::custom(format!(
                "maxDepth must be a non-negative safe integer or 'provider-managed', not {value}"
            ))),
        }
    }
}

/// One `subagent` tool instance: which provider it delegates to and what it sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubagentToolConfig {
    /// The provider's registry name.
    pub provider: String,
    /// The tool's name; distinct per instance.
    #[serde(default = "default_tool_name")]
    pub tool_name: String,
    /// Whether the model may pass `run_in_background`.
    #[serde(default = "default_true")]
    pub enable_run_in_background: bool,
    /// The background route.
    #[serde(default)]
    pub background_mode: BackgroundMode,
    /// Model options for every child (omitted: the request carries none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_options: Option<ChildAgentOptions>,
    /// A persona for every child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    /// Global tools hidden from every child; it must name `allow` or `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_filter: Option<ToolFilter>,
    /// The depth cap sent with every request.
    #[serde(default)]
    pub max_depth: MaxDepthPolicy,
}

fn default_tool_name() -> String {
    "subagent".to_owned()
}

fn default_true() -> bool {
    true
}

impl SubagentToolConfig {
    /// A `subagent` tool for `provider` with the defaults: background enabled in one-shot
    /// mode, no options, persona or filter, and a depth cap of 3.
    pub fn new(provider: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            tool_name: default_tool_name(),
            enable_run_in_background: true,
            background_mode: BackgroundMode::OneShot,
            agent_options: None,
            persona: None,
            tool_filter: None,
            max_depth: MaxDepthPolicy::default(),
        }
    }

    /// Checks what can be checked without the provider.
    ///
    /// # Errors
    /// `INVALID_ARGS` for an empty tool name, a tool filter naming neither `allow` nor `deny`,
    /// or a depth cap beyond the safe-integer range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(SubagentError::new(ErrorCode::InvalidArgs, message));
        if self.tool_name.trim().is_empty() {
            return invalid("tool-subagent: `toolName` must not be empty".to_owned());
        }
        if self
            .tool_filter
            .as_ref()
            .is_some_and(|filter| filter.allow.is_none() && filter.deny.is_empty())
        {
            return invalid(
                "tool-subagent: `toolFilter` is configured but names neither `allow` nor `deny`; \
                 remove it or name the tools to allow or deny"
                    .to_owned(),
            );
        }
        if let MaxDepthPolicy::Limit(limit) = self.max_depth {
            if limit > MAX_SAFE_DEPTH {
                return invalid("subagent maxDepth must be a non-negative safe integer".to_owned());
            }
        }
        Ok(())
    }

    /// Checks the configuration against the provider it mounts on.
    fn check_provider(&self, provider: &dyn SubagentProvider) -> Result<()> {
        if matches!(self.max_depth, MaxDepthPolicy::Limit(_))
            && !provider.capabilities().depth_limit
        {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "tool-subagent: provider \"{}\" cannot enforce maxDepth (no depthLimit \
                     capability) — set maxDepth: 'provider-managed' to let it manage depth",
                    self.provider
                ),
            ));
        }
        if self.background_mode == BackgroundMode::Continuable && provider.continuable().is_none() {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "tool-subagent: provider \"{}\" does not support `backgroundMode: continuable`",
                    self.provider
                ),
            ));
        }
        Ok(())
    }
}

/// What a mounted tool needs at call time.
#[derive(Clone)]
pub(crate) struct Services {
    pub(crate) agents: Agents,
    pub(crate) subagents: Subagents,
    pub(crate) jobs: crate::jobs::Jobs,
}

impl Services {
    pub(crate) fn of(rt: &Runtime) -> Self {
        Self {
            agents: rt.agents().clone(),
            subagents: rt.subagents().clone(),
            jobs: rt.jobs().clone(),
        }
    }
}

#[derive(Default)]
struct MountState {
    /// Bumped by every lifecycle event of the provider and by removal of the installation.
    epoch: u64,
    mounted: bool,
    removed: bool,
}

struct Mount {
    config: SubagentToolConfig,
    services: Services,
    registry: Arc<ToolRegistry>,
    state: Mutex<MountState>,
}

impl Mount {
    fn lock(&self) -> std::sync::MutexGuard<'_, MountState> {
        // Each change is a few field writes: a panic cannot leave them half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unmounts the tool and bumps the epoch, so a mount looked up before now is dropped.
    fn unmount(&self, state: &mut MountState) {
        state.epoch += 1;
        if state.mounted {
            self.registry.unregister(&self.config.tool_name);
            state.mounted = false;
        }
    }

    /// Looks the provider up and mounts the tool if nothing changed meanwhile. `Ok(false)`
    /// when there is nothing to mount (no provider, or a newer event won).
    async fn mount(self: &Arc<Self>, epoch: u64) -> Result<bool> {
        let Some(provider) = self
            .services
            .subagents
            .get_provider(&self.config.provider)
            .await
        else {
            return Ok(false);
        };
        self.config.check_provider(provider.as_ref())?;
        let wording = Wording {
            inherits_parent_context: provider.inherits_parent_context(),
            background_enabled: self.config.enable_run_in_background,
            mode: self.config.background_mode,
        };
        let tool = self.tool(wording);
        let mut state = self.lock();
        if state.removed || state.epoch != epoch {
            return Ok(false);
        }
        if state.mounted {
            self.registry.unregister(&self.config.tool_name);
        }
        self.registry.register(tool)?;
        state.mounted = true;
        Ok(true)
    }

    fn tool(self: &Arc<Self>, wording: Wording) -> Tool {
        let call = Arc::new(call::SubagentCall {
            config: self.config.clone(),
            services: self.services.clone(),
        });
        let tool = Tool::new(
            self.config.tool_name.clone(),
            wording.description(),
            wording.parameters(),
            move |args, ctx| {
                let call = Arc::clone(&call);
                async move { call.run(args, ctx).await }
            },
        )
        .concurrency(Concurrency::Safe);
        match wording.guidance(&self.config.tool_name) {
            Some(section) => tool.with_guidance(section),
            None => tool,
        }
    }
}

/// A mounted (or waiting) `subagent` tool. Dropping it, or [`SubagentToolInstallation::remove`],
/// unmounts the tool and stops following the provider; [`SubagentToolInstallation::keep`]
/// keeps it for the runtime's whole life.
#[must_use = "dropping the installation removes the tool"]
pub struct SubagentToolInstallation {
    mount: Arc<Mount>,
    subscription: Option<Subscription>,
}

impl std::fmt::Debug for SubagentToolInstallation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentToolInstallation")
            .field("tool", &self.mount.config.tool_name)
            .field("provider", &self.mount.config.provider)
            .finish()
    }
}

impl SubagentToolInstallation {
    /// Whether the tool is mounted now (its provider is registered).
    pub fn is_mounted(&self) -> bool {
        self.mount.lock().mounted
    }

    /// Unmounts the tool and stops following its provider: a provider registered later no
    /// longer mounts it.
    pub fn remove(mut self) {
        self.release();
    }

    /// Keeps the tool (and its provider following) for the runtime's whole life.
    pub fn keep(mut self) {
        if let Some(subscription) = self.subscription.take() {
            subscription.detach();
        }
    }

    fn release(&mut self) {
        if self.subscription.take().is_none() {
            return;
        }
        let mut state = self.mount.lock();
        state.removed = true;
        self.mount.unmount(&mut state);
    }
}

impl Drop for SubagentToolInstallation {
    fn drop(&mut self) {
        self.release();
    }
}

/// Installs one `subagent` tool on `rt`'s global registry. It mounts now if its provider is
/// registered, and from then on follows the provider's registration.
///
/// # Errors
/// `INVALID_ARGS` for a bad configuration ([`SubagentToolConfig::validate`]);
/// `UNSUPPORTED_CAPABILITY` when the registered provider cannot serve it (a numeric
/// `max_depth` without `depth_limit`, continuable mode without `prepare_continuable`);
/// `DUPLICATE_TOOL` when a tool of that name is already registered. Nothing stays installed.
/// A provider registered later that cannot serve the configuration is logged and not mounted.
pub async fn install_subagent_tool(
    rt: &Runtime,
    config: SubagentToolConfig,
) -> Result<SubagentToolInstallation> {
    config.validate()?;
    let mount = Arc::new(Mount {
        config,
        services: Services::of(rt),
        registry: Arc::clone(rt.tools()),
        state: Mutex::default(),
    });
    // The listener holds the mount: a kept installation follows its provider for the bus's
    // whole life, and a removed one drops the listener, and with it the mount.
    let follower = Arc::clone(&mount);
    let subscription =
        rt.subagents()
            .events()
            .subscribe(EventScope::All, move |event: &SubagentEvent| {
                let mount = Arc::clone(&follower);
                match event {
                    SubagentEvent::ProviderAdded(name) if *name == mount.config.provider => {
                        let epoch = {
                            let mut state = mount.lock();
                            mount.unmount(&mut state);
                            state.epoch
                        };
                        // Looking the provider up is a message to the service that emits this
                        // event, so it runs as a task of its own.
                        tokio::spawn(async move {
                            if let Err(error) = mount.mount(epoch).await {
                                tracing::error!(
                                    tool = %mount.config.tool_name,
                                    provider = %mount.config.provider,
                                    %error,
                                    "the subagent tool cannot mount on its provider"
                                );
                            }
                        });
                    }
                    SubagentEvent::ProviderRemoved(name) if *name == mount.config.provider => {
                        let mut state = mount.lock();
                        mount.unmount(&mut state);
                    }
                    _ => {}
                }
            });
    let epoch = mount.lock().epoch;
    let installation = SubagentToolInstallation {
        mount: Arc::clone(&mount),
        subscription: Some(subscription),
    };
    mount.mount(epoch).await?;
    Ok(installation)
}
