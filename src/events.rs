//! Provides [`EventBus`]: a typed event bus whose listeners are each called in isolation.
//!
//! One bad listener starves nobody: a listener that panics or returns an error is logged
//! through `tracing`, and every listener after it still runs. Listeners may be scoped to a key
//! (for delegation events, the delegating parent's session) and then see only events of that scope.
//!
//! The bus is observation only: emitting never waits on a listener's work and a listener's
//! failure never reaches the emitter.

use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};

/// An event that may belong to a scope.
pub trait ScopedEvent: Send + Sync + 'static {
    /// The scope key type.
    type Key: PartialEq + Clone + Send + Sync + 'static;

    /// The event's scope, when it has one; unscoped events reach only [`EventScope::All`]
    /// listeners.
    fn scope_key(&self) -> Option<Self::Key>;

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// Which events a listener receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventScope<K> {
    /// Every event.
    All,
    /// Only events of this scope.
    Key(K),
}

/// What a listener may return: `()` or a `Result` whose error is logged.
pub trait ListenerOutcome {
    /// The failure to log, if any.
    fn failure(self) -> Option<String>;
}

impl ListenerOutcome for () {
    fn failure(self) -> Option<String> {
        None
    }
}

impl<E: Display> ListenerOutcome for Result<(), E> {
    fn failure(self) -> Option<String> {
        self.err().map(|error| error.to_string())
    }
}

type Listener<E> = Arc<dyn Fn(&E) -> Option<String> + Send + Sync>;

struct Entry<E: ScopedEvent> {
    id: u64,
    scope: EventScope<E::Key>,
    listener: Listener<E>,
}

/// A typed event bus. Share it behind an `Arc`.
pub struct EventBus<E: ScopedEvent> {
    entries: RwLock<Vec<Entry<E>>>,
    next_id: AtomicU64,
}

impl<E: ScopedEvent> Default for EventBus<E> {
    fn default() -> Self {
        Self {
            entries: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(0),
        }
    }
}

/// Keeps a listener registered; dropping it unsubscribes.
#[must_use = "dropping a Subscription unsubscribes its listener"]
pub struct Subscription {
    unsubscribe: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Subscription {
    /// Keeps the listener for the bus's whole life.
    pub fn detach(mut self) {
        self.unsubscribe = None;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(unsubscribe) = self.unsubscribe.take() {
            unsubscribe();
        }
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl<E: ScopedEvent> EventBus<E> {
    /// An empty bus.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers `listener` for `scope`. Listeners run in registration order.
    pub fn subscribe<F, R>(self: &Arc<Self>, scope: EventScope<E::Key>, listener: F) -> Subscription
    where
        F: Fn(&E) -> R + Send + Sync + 'static,
        R: ListenerOutcome,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let listener: Listener<E> = Arc::new(move |event| listener(event).failure());
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Entry {
                id,
                scope,
                listener,
            });
        let bus: Weak<Self> = Arc::downgrade(self);
        Subscription {
            unsubscribe: Some(Box::new(move || {
                if let Some(bus) = bus.upgrade() {
                    bus.entries
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|entry| entry.id != id);
                }
            })),
        }
    }

    /// The listeners `event` reaches, in registration order. A snapshot, so a listener may
    /// subscribe or unsubscribe while being called without deadlocking.
    fn listeners_for(&self, event: &E) -> Vec<Listener<E>> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        if entries.is_empty() {
            return Vec::new();
        }
        let key = event.scope_key();
        entries
            .iter()
            .filter(|entry| match &entry.scope {
                EventScope::All => true,
                EventScope::Key(scope) => key.as_ref() == Some(scope),
            })
            .map(|entry| Arc::clone(&entry.listener))
            .collect()
    }

    /// Calls one listener, turning a panic into a failure.
    fn call(listener: &Listener<E>, event: &E) -> Option<String> {
        catch_unwind(AssertUnwindSafe(|| listener(event)))
            .unwrap_or_else(|_| Some(format!("a {} listener panicked", event.name())))
    }

    /// Calls every matching listener, each contained on its own: a failure or panic is logged
    /// and the next listener still runs.
    pub fn emit(&self, event: &E) {
        for listener in self.listeners_for(event) {
            if let Some(error) = Self::call(&listener, event) {
                tracing::warn!(event = event.name(), %error, "event listener failed");
            }
        }
    }

    /// Calls every matching listener in order, **uncontained**: the first one that fails or
    /// panics stops the dispatch, and its failure is returned. For events whose listeners may
    /// veto (a provider registration rolls back when a `provider-added` listener refuses it).
    ///
    /// # Errors
    /// The first listener failure, in words.
    pub fn emit_strict(&self, event: &E) -> Result<(), String> {
        for listener in self.listeners_for(event) {
            if let Some(error) = Self::call(&listener, event) {
                return Err(error);
            }
        }
        Ok(())
    }

    /// How many listeners are registered.
    pub fn listener_count(&self) -> usize {
        self.entries
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
