//! Provides [`LifecycleInvariant`], the checker of the delegation lifecycle stream that a host or a
//! test harness can put on [`crate::Subagents::events`].
//!
//! The rules: a provider name is non-empty and unique while registered, and a removal names a
//! registered provider; a `subagent/start` names a provider and non-nil ids under a run id not
//! already open; a `subagent/end` closes an open start with the same identity. Provider
//! availability is not a precondition of a start: a cold resume names the provider recorded in
//! the child's descriptor, which may have left the registry. A rejected event changes nothing.

use std::collections::{HashMap, HashSet};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::RunId;
use crate::seam::{SubagentEvent, SubagentRunInfo};

/// The lifecycle state a stream of [`SubagentEvent`]s has built so far.
#[derive(Debug, Default)]
pub struct LifecycleInvariant {
    providers: HashSet<String>,
    runs: HashMap<RunId, SubagentRunInfo>,
}

impl LifecycleInvariant {
    /// A checker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A checker that already knows the registered `providers` (installed on a live runtime).
    pub fn with_providers(providers: impl IntoIterator<Item = String>) -> Self {
        Self {
            providers: providers.into_iter().collect(),
            runs: HashMap::new(),
        }
    }

    /// Checks `event` against what came before, and records it when it holds.
    ///
    /// # Errors
    /// `INVALID_EVENT` naming the broken rule; the state is unchanged.
    pub fn check(&mut self, event: &SubagentEvent) -> Result<()> {
        match event {
            SubagentEvent::ProviderAdded(name) => {
                if name.is_empty() {
                    return Err(violation("subagent provider names must be non-empty"));
                }
                if !self.providers.insert(name.clone()) {
                    return Err(violation(format!(
                        "subagent/provider-added repeated {name:?}"
                    )));
                }
            }
            SubagentEvent::ProviderRemoved(name) => {
                if !self.providers.remove(name) {
                    return Err(violation(format!(
                        "subagent/provider-removed names unknown provider {name:?}"
                    )));
                }
            }
            SubagentEvent::Start(info) => {
                if info.provider.is_empty()
                    || info.run_id.as_uuid().is_nil()
                    || info.id.as_uuid().is_nil()
                {
                    return Err(violation(
                        "subagent/start provider, runId, and child id must be non-empty",
                    ));
                }
                if self.runs.contains_key(&info.run_id) {
                    return Err(violation(format!(
                        "subagent/start repeated run id {}",
                        info.run_id
                    )));
                }
                self.runs.insert(info.run_id, info.clone());
            }
            SubagentEvent::End(end) => {
                let run = end.info.run_id;
                match self.runs.get(&run) {
                    None => {
                        return Err(violation(format!(
                            "subagent/end has no matching subagent/start for run {run}"
                        )))
                    }
                    Some(start) if *start != end.info => {
                        return Err(violation(format!(
                            "subagent/end identity diverges from subagent/start for run {run}"
                        )))
                    }
                    Some(_) => {
                        self.runs.remove(&run);
                    }
                }
            }
        }
        Ok(())
    }

    /// How many starts have not ended yet.
    pub fn open_runs(&self) -> usize {
        self.runs.len()
    }
}

fn violation(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidEvent, message)
}
