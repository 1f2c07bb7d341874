//! Provides the activation setup registry: deployment contributions installed into every
//! continuable child's unpublished scope, on fresh creation and on cold resume.
//!
//! The registry is ordered and transactional:
//! - `apply` installs every live contribution in registration order; if one installer fails,
//!   the batch's earlier installations are released and the installer's error propagates.
//! - An installation whose contribution is removed before the batch commits is released at once
//!   and the batch's commit fails with `ACTIVATION_SETUP_REVOKED`, so the unpublished Activation
//!   rolls back.
//! - Closing the child's scope releases that child's installations; removing a contribution
//!   releases every resident installation of it at once. Each installation is released exactly
//!   once, whichever comes first.
//! - A registration only affects Activations materialized after it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::AgentScope;

/// Undoes one installation; a failure is reported by the removal that released it.
pub type SetupDisposer = Box<dyn FnOnce() -> Result<()> + Send + Sync>;

/// A synchronous child-scope installer: it adds scope-local capabilities to one continuable
/// child and returns how to undo them.
pub type ContinuableSetupContribution =
    Arc<dyn Fn(&mut AgentScope) -> Result<SetupDisposer> + Send + Sync>;

struct Registration {
    contribution: ContinuableSetupContribution,
}

struct Installation {
    registration: u64,
    batch: u64,
    disposer: SetupDisposer,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Live registrations in registration order.
    registrations: BTreeMap<u64, Registration>,
    installations: HashMap<u64, Installation>,
    /// Batches whose installations were revoked before commit.
    revoked: std::collections::HashSet<u64>,
}

impl State {
    fn mint(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Takes the installations `select` picks, in installation order.
    fn take(&mut self, select: impl Fn(&Installation) -> bool) -> Vec<Installation> {
        let mut ids: Vec<u64> = self
            .installations
            .iter()
            .filter(|(_, installation)| select(installation))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| self.installations.remove(&id))
            .collect()
    }
}

/// The registry (one per runtime, shared by the continuation manager).
#[derive(Default)]
pub(crate) struct SetupRegistry {
    state: Mutex<State>,
}

/// Runs every disposer, then reports how many failed.
fn release(installations: Vec<Installation>) -> Result<()> {
    let mut failures = Vec::new();
    for installation in installations {
        if let Err(error) = (installation.disposer)() {
            failures.push(error.to_string());
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(SubagentError::new(
            ErrorCode::ActivationSetupReleaseFailed,
            format!(
                "failed to release {} installation(s): {}",
                failures.len(),
                failures.join("; ")
            ),
        ))
    }
}

impl SetupRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `contribution` for every later Activation.
    pub(crate) fn register(self: &Arc<Self>, contribution: ContinuableSetupContribution) -> u64 {
        let mut state = self.lock();
        let id = state.mint();
        state
            .registrations
            .insert(id, Registration { contribution });
        id
    }

    /// Removes a registration (idempotent) and releases every installation of it.
    ///
    /// # Errors
    /// `ACTIVATION_SETUP_RELEASE_FAILED` after every disposer ran, when any failed.
    pub(crate) fn remove(&self, registration: u64) -> Result<()> {
        let taken = {
            let mut state = self.lock();
            // Marked removed before releasing, so no later apply installs it.
            state.registrations.remove(&registration);
            let taken = state.take(|installation| installation.registration == registration);
            for installation in &taken {
                state.revoked.insert(installation.batch);
            }
            taken
        };
        release(taken)
    }

    /// Installs every live contribution into `scope`, in registration order; the child's scope
    /// disposal releases them. The returned batch must be committed at publication; dropping it
    /// uncommitted releases its installations.
    ///
    /// # Errors
    /// The first installer's error, after the batch's earlier installations were released.
    pub(crate) fn apply(self: &Arc<Self>, scope: &mut AgentScope) -> Result<SetupBatch> {
        let (batch, contributions) = {
            let mut state = self.lock();
            let batch = state.mint();
            let contributions: Vec<(u64, ContinuableSetupContribution)> = state
                .registrations
                .iter()
                .map(|(id, registration)| (*id, Arc::clone(&registration.contribution)))
                .collect();
            (batch, contributions)
        };
        let guard = SetupBatch {
            registry: Arc::downgrade(self),
            batch,
            committed: false,
        };
        for (registration, contribution) in contributions {
            // The installer runs unlocked: it may remove registrations, its own included.
            let disposer = contribution(scope)?;
            let mut state = self.lock();
            if state.registrations.contains_key(&registration) {
                let id = state.mint();
                state.installations.insert(
                    id,
                    Installation {
                        registration,
                        batch,
                        disposer,
                    },
                );
            } else {
                // Revoked inside its own installer (or concurrently): undone at once.
                state.revoked.insert(batch);
                drop(state);
                if let Err(error) = disposer() {
                    tracing::warn!(%error, "a revoked setup installation failed to release");
                }
            }
        }
        let registry = Arc::downgrade(self);
        scope.on_dispose(Box::new(move || {
            if let Some(registry) = registry.upgrade() {
                if let Err(error) = registry.release_batch(batch) {
                    tracing::warn!(%error, "a continuable child's setup failed to release");
                }
            }
        }));
        Ok(guard)
    }

    fn release_batch(&self, batch: u64) -> Result<()> {
        let taken = {
            let mut state = self.lock();
            state.revoked.remove(&batch);
            state.take(|installation| installation.batch == batch)
        };
        release(taken)
    }

    fn commit(&self, batch: u64) -> Result<()> {
        if self.lock().revoked.remove(&batch) {
            return Err(SubagentError::new(
                ErrorCode::ActivationSetupRevoked,
                "a setup contribution was revoked while this child was being built",
            ));
        }
        Ok(())
    }
}

/// One child's installations, until the child is published.
#[must_use = "an uncommitted setup batch is released when dropped"]
pub(crate) struct SetupBatch {
    registry: Weak<SetupRegistry>,
    batch: u64,
    committed: bool,
}

impl SetupBatch {
    /// Detaches the batch from rollback: the child's scope now owns its installations.
    ///
    /// # Errors
    /// `ACTIVATION_SETUP_REVOKED` when an installation was revoked while the child was built
    /// (the batch is then released).
    pub(crate) fn commit(mut self) -> Result<()> {
        self.committed = true;
        match self.registry.upgrade() {
            Some(registry) => {
                let outcome = registry.commit(self.batch);
                if outcome.is_err() {
                    self.committed = false;
                }
                outcome
            }
            None => Ok(()),
        }
    }
}

impl Drop for SetupBatch {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Some(registry) = self.registry.upgrade() {
            if let Err(error) = registry.release_batch(self.batch) {
                tracing::warn!(%error, "a rolled-back setup failed to release");
            }
        }
    }
}

/// Keeps a continuable setup contribution registered; [`SetupRegistration::remove`] revokes it
/// from every resident child, as does dropping it unless [`SetupRegistration::keep`] was called.
#[must_use = "dropping the registration revokes the contribution; call keep() to keep it"]
pub struct SetupRegistration {
    registry: Option<Arc<SetupRegistry>>,
    id: u64,
}

impl SetupRegistration {
    pub(crate) fn new(registry: Arc<SetupRegistry>, id: u64) -> Self {
        Self {
            registry: Some(registry),
            id,
        }
    }

    /// Revokes the contribution: no later Activation gets it, and every resident installation
    /// is released now.
    ///
    /// # Errors
    /// `ACTIVATION_SETUP_RELEASE_FAILED` after every installation was released, when any of
    /// their disposers failed.
    pub fn remove(mut self) -> Result<()> {
        match self.registry.take() {
            Some(registry) => registry.remove(self.id),
            None => Ok(()),
        }
    }

    /// Keeps the contribution for the runtime's whole life.
    pub fn keep(mut self) {
        self.registry = None;
    }
}

impl Drop for SetupRegistration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.take() {
            if let Err(error) = registry.remove(self.id) {
                tracing::warn!(%error, "a dropped setup registration failed to release");
            }
        }
    }
}

impl std::fmt::Debug for SetupRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetupRegistration")
            .field("id", &self.id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::tools::ToolRegistry;

    type Trace = Arc<Mutex<Vec<String>>>;

    fn scope() -> AgentScope {
        AgentScope::new(Arc::new(ToolRegistry::new()))
    }

    /// Closes a child scope the way an agent's retirement does.
    fn close(mut scope: AgentScope) {
        for disposer in scope.take_disposers().into_iter().rev() {
            disposer();
        }
    }

    fn recording(trace: &Trace, name: &'static str) -> ContinuableSetupContribution {
        let trace = Arc::clone(trace);
        Arc::new(move |_: &mut AgentScope| {
            trace.lock().unwrap().push(format!("install {name}"));
            let trace = Arc::clone(&trace);
            Ok(Box::new(move || {
                trace.lock().unwrap().push(format!("release {name}"));
                Ok(())
            }) as SetupDisposer)
        })
    }

    fn trace() -> Trace {
        Arc::new(Mutex::new(Vec::new()))
    }

    fn entries(trace: &Trace) -> Vec<String> {
        trace.lock().unwrap().clone()
    }

    // SETUP-01
    #[test]
    fn installs_in_registration_order_and_commits() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        registry.register(recording(&log, "first"));
        registry.register(recording(&log, "second"));
        let mut child = scope();
        registry.apply(&mut child).unwrap().commit().unwrap();
        assert_eq!(entries(&log), ["install first", "install second"]);
    }

    // SETUP-02
    #[test]
    fn repeated_removal_then_scope_close_releases_once() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let id = registry.register(recording(&log, "a"));
        let mut child = scope();
        registry.apply(&mut child).unwrap().commit().unwrap();
        registry.remove(id).unwrap();
        registry.remove(id).unwrap();
        close(child);
        assert_eq!(entries(&log), ["install a", "release a"]);
    }

    // SETUP-03
    #[test]
    fn scope_close_then_removal_releases_once() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let id = registry.register(recording(&log, "a"));
        let mut child = scope();
        registry.apply(&mut child).unwrap().commit().unwrap();
        close(child);
        registry.remove(id).unwrap();
        assert_eq!(entries(&log), ["install a", "release a"]);
    }

    // SETUP-04
    #[test]
    fn a_removed_contribution_is_never_installed() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let gone = registry.register(recording(&log, "gone"));
        registry.register(recording(&log, "kept"));
        registry.remove(gone).unwrap();
        let mut child = scope();
        registry.apply(&mut child).unwrap().commit().unwrap();
        assert_eq!(entries(&log), ["install kept"]);
    }

    // SETUP-05
    #[test]
    fn a_batch_revoked_before_commit_fails_its_commit() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let id = registry.register(recording(&log, "a"));
        let mut child = scope();
        let batch = registry.apply(&mut child).unwrap();
        registry.remove(id).unwrap();
        let error = batch.commit().unwrap_err();
        assert_eq!(error.code(), ErrorCode::ActivationSetupRevoked);
        assert!(error
            .message()
            .contains("revoked while this child was being built"));
        close(child);
        assert_eq!(entries(&log), ["install a", "release a"]);
    }

    // SETUP-06
    #[test]
    fn a_contribution_revoked_inside_its_installer_is_caught() {
        let registry = Arc::new(SetupRegistry::default());
        let released = Arc::new(AtomicUsize::new(0));
        let own_id = Arc::new(Mutex::new(0u64));
        let contribution: ContinuableSetupContribution = {
            let registry = Arc::downgrade(&registry);
            let released = Arc::clone(&released);
            let own_id = Arc::clone(&own_id);
            Arc::new(move |_: &mut AgentScope| {
                let id = *own_id.lock().unwrap();
                registry.upgrade().unwrap().remove(id).unwrap();
                let released = Arc::clone(&released);
                Ok(Box::new(move || {
                    released.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }) as SetupDisposer)
            })
        };
        *own_id.lock().unwrap() = registry.register(contribution);
        let mut child = scope();
        let batch = registry.apply(&mut child).unwrap();
        assert_eq!(released.load(Ordering::SeqCst), 1);
        assert_eq!(
            batch.commit().unwrap_err().code(),
            ErrorCode::ActivationSetupRevoked
        );
        close(child);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    // SETUP-07
    #[test]
    fn removal_attempts_every_disposer_before_reporting() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let count = Arc::new(AtomicUsize::new(0));
        let contribution: ContinuableSetupContribution = {
            let log = Arc::clone(&log);
            let count = Arc::clone(&count);
            Arc::new(move |_: &mut AgentScope| {
                let n = count.fetch_add(1, Ordering::SeqCst);
                let log = Arc::clone(&log);
                Ok(Box::new(move || {
                    log.lock().unwrap().push(format!("release {n}"));
                    if n == 0 {
                        Err(SubagentError::new(ErrorCode::InvalidArgs, "boom"))
                    } else {
                        Ok(())
                    }
                }) as SetupDisposer)
            })
        };
        let id = registry.register(contribution);
        let mut children = Vec::new();
        for _ in 0..3 {
            let mut child = scope();
            registry.apply(&mut child).unwrap().commit().unwrap();
            children.push(child);
        }
        let error = registry.remove(id).unwrap_err();
        assert_eq!(error.code(), ErrorCode::ActivationSetupReleaseFailed);
        assert!(error
            .message()
            .contains("failed to release 1 installation(s)"));
        assert_eq!(entries(&log), ["release 0", "release 1", "release 2"]);
    }

    // SETUP-08
    #[test]
    fn a_scope_close_attempts_every_disposer() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        for name in ["a", "b"] {
            let log = Arc::clone(&log);
            registry.register(Arc::new(move |_: &mut AgentScope| {
                let log = Arc::clone(&log);
                Ok(Box::new(move || {
                    log.lock().unwrap().push(format!("release {name}"));
                    if name == "a" {
                        Err(SubagentError::new(ErrorCode::InvalidArgs, "boom"))
                    } else {
                        Ok(())
                    }
                }) as SetupDisposer)
            }));
        }
        let mut child = scope();
        registry.apply(&mut child).unwrap().commit().unwrap();
        close(child);
        assert_eq!(entries(&log), ["release a", "release b"]);
    }

    // SETUP-09
    #[test]
    fn a_failing_installer_rolls_back_the_earlier_ones() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        registry.register(recording(&log, "first"));
        registry.register(Arc::new(|_: &mut AgentScope| {
            Err(SubagentError::new(ErrorCode::InvalidArgs, "boom"))
        }));
        registry.register(recording(&log, "third"));
        let mut child = scope();
        let error = registry.apply(&mut child).err().unwrap();
        assert_eq!(error.message(), "boom");
        assert_eq!(entries(&log), ["install first", "release first"]);
    }

    // SETUP-10
    #[test]
    fn revocation_before_rollback_releases_once() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        let first = registry.register(recording(&log, "first"));
        {
            let registry = Arc::downgrade(&registry);
            let outer = Arc::clone(&registry.upgrade().unwrap());
            outer.register(Arc::new(move |_: &mut AgentScope| {
                registry.upgrade().unwrap().remove(first).unwrap();
                Err(SubagentError::new(ErrorCode::InvalidArgs, "boom"))
            }));
        }
        let mut child = scope();
        assert!(registry.apply(&mut child).is_err());
        assert_eq!(entries(&log), ["install first", "release first"]);
    }

    // SETUP-11
    #[test]
    fn closing_one_child_leaves_the_other_installed() {
        let registry = Arc::new(SetupRegistry::default());
        let log = trace();
        registry.register(recording(&log, "a"));
        let mut one = scope();
        registry.apply(&mut one).unwrap().commit().unwrap();
        let mut two = scope();
        registry.apply(&mut two).unwrap().commit().unwrap();
        close(one);
        assert_eq!(entries(&log), ["install a", "install a", "release a"]);
        close(two);
        assert_eq!(
            entries(&log),
            ["install a", "install a", "release a", "release a"]
        );
    }
}
