//! A node's delivery server: what claims, serves and answers the deliveries sent to it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Delivery, DeliveryHandler, Inbound, PRUNE_EVERY, RECHECK, SERVED_AT_ONCE};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::store::postgres::{NodeMembership, PostgresStore};

tokio::task_local! {
    /// The slot of the delivery the current task serves.
    static SERVING: Arc<Slot>;
}

/// One served delivery's place among the [`SERVED_AT_ONCE`].
struct Slot {
    /// Whether the delivery gave its place up (see [`yield_slot`]).
    yielded: AtomicBool,
    /// How many deliveries of the server gave theirs up.
    server_yielded: Arc<AtomicUsize>,
    /// Woken when a place frees up: the server claims again.
    inbound: Arc<Inbound>,
}

/// Gives up the serving slot of the delivery the current task serves, for a handler about to
/// wait on another node (a release waiting for its child's release there): a node whose every
/// slot waited on a peer whose every slot waited on it would never serve again. The delivery's
/// session stays busy (its later deliveries still wait for its answer); the server claims
/// another in its place. Outside a served delivery, or a second time, it does nothing.
pub fn yield_slot() {
    let _ = SERVING.try_with(|slot| {
        if !slot.yielded.swap(true, Ordering::SeqCst) {
            slot.server_yielded.fetch_add(1, Ordering::SeqCst);
            slot.inbound.deliveries.notify_one();
        }
    });
}

impl NodeMembership {
    /// Serves this node's deliveries with `handler` until the membership is left, dropped or
    /// lost: those about one session one at a time in the order they were committed, those
    /// about different sessions at once (up to [`SERVED_AT_ONCE`]). A handler that panics
    /// answers its delivery with an error, and serving goes on.
    ///
    /// # Errors
    /// `INVALID_ARGS` when this node already serves.
    pub fn serve(&self, handler: DeliveryHandler) -> Result<()> {
        if self.inbound.serving.swap(true, Ordering::SeqCst) {
            return Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("node {} already serves its deliveries", self.node),
            ));
        }
        let server = Server {
            store: Arc::clone(&self.store),
            node: self.node,
            incarnation: self.incarnation,
            handler,
            stop: self.stop.clone(),
            busy: Arc::default(),
            yielded: Arc::default(),
            finished: Arc::default(),
            inbound: Arc::clone(&self.inbound),
        };
        tokio::spawn(server.run());
        Ok(())
    }
}

/// A node's delivery server: claims what it may serve, serves each delivery as a task of its
/// own, and keeps one delivery per session in flight.
struct Server {
    store: Arc<PostgresStore>,
    node: uuid::Uuid,
    /// The incarnation that serves: it claims only while its row is its own.
    incarnation: uuid::Uuid,
    handler: DeliveryHandler,
    stop: CancellationToken,
    /// The sessions a delivery is being served about.
    busy: Arc<Mutex<HashSet<SessionId>>>,
    /// How many of those gave their slot up (see [`yield_slot`]).
    yielded: Arc<AtomicUsize>,
    inbound: Arc<Inbound>,
    /// Woken when a delivery's service ended (its session may have more).
    finished: Arc<Notify>,
}

impl Server {
    async fn run(self) {
        let inbound = Arc::clone(&self.inbound);
        let mut pruned = tokio::time::Instant::now();
        let mut claim = true;
        // Whether the last claim may have left pending deliveries behind (about a busy
        // session, or behind one it claimed). Only then does a served delivery's end call for
        // a new claim; otherwise what comes next is announced.
        let mut left_behind = false;
        // Set after a claim failed: it may have claimed rows whose answer it never read.
        let mut unclaim = false;
        loop {
            if claim {
                let busy: Vec<uuid::Uuid> = self
                    .busy
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .map(|session| *session.as_uuid())
                    .collect();
                let holding = busy
                    .len()
                    .saturating_sub(self.yielded.load(Ordering::SeqCst));
                let room = SERVED_AT_ONCE.saturating_sub(holding);
                // With no room, or nothing claimed, anything pending is behind a busy session.
                left_behind = !busy.is_empty();
                if unclaim {
                    let unclaimed = self.store.bounded(
                        "putting back lost claims",
                        self.store.unclaim_lost(self.node, self.incarnation, &busy),
                    );
                    match unclaimed.await {
                        Ok(put_back) => {
                            unclaim = false;
                            if put_back > 0 {
                                tracing::info!(node = %self.node, put_back, "put back deliveries whose claim was lost with its connection");
                            }
                        }
                        Err(error) => {
                            tracing::warn!(node = %self.node, %error, "putting back lost claims failed; retrying");
                        }
                    }
                }
                if room > 0 && !unclaim {
                    let claimed = tokio::select! {
                        () = self.stop.cancelled() => return,
                        claimed = self.store.bounded(
                            "claiming deliveries",
                            self.store.claim_deliveries(self.node, self.incarnation, &busy, room),
                        ) => claimed,
                    };
                    match claimed {
                        Ok((claimed, more)) => {
                            let full = claimed.len() == room;
                            if !claimed.is_empty() {
                                left_behind = more;
                            }
                            for delivery in claimed {
                                self.spawn_serving(delivery);
                            }
                            // A full batch may have left more behind.
                            if full {
                                continue;
                            }
                        }
                        Err(error) => {
                            unclaim = true;
                            tracing::warn!(node = %self.node, %error, "claiming deliveries failed; retrying");
                        }
                    }
                }
            }
            if pruned.elapsed() >= PRUNE_EVERY.min(self.store.delivery_retention) {
                pruned = tokio::time::Instant::now();
                // On its own: a slow pruning never holds up a claim or a stop.
                let store = Arc::clone(&self.store);
                let node = self.node;
                tokio::spawn(async move {
                    let pruned = store.bounded("pruning deliveries", store.prune_deliveries());
                    if let Err(error) = pruned.await {
                        tracing::debug!(%node, %error, "pruning old deliveries failed");
                    }
                    let pruned = store.bounded("pruning dead nodes", store.prune_dead_nodes());
                    if let Err(error) = pruned.await {
                        tracing::debug!(%node, %error, "pruning dead nodes' rows failed");
                    }
                });
            }
            claim = tokio::select! {
                () = self.stop.cancelled() => return,
                () = inbound.deliveries.notified() => true,
                () = self.finished.notified() => left_behind,
                () = tokio::time::sleep(RECHECK) => true,
            };
        }
    }

    /// Serves `delivery` as a task of its own and answers it; its session is busy meanwhile.
    fn spawn_serving(&self, delivery: Delivery) {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(delivery.session);
        let (store, handler, stop) = (
            Arc::clone(&self.store),
            Arc::clone(&self.handler),
            self.stop.clone(),
        );
        let (busy, finished, node, incarnation) = (
            Arc::clone(&self.busy),
            Arc::clone(&self.finished),
            self.node,
            self.incarnation,
        );
        let slot = Arc::new(Slot {
            yielded: AtomicBool::new(false),
            server_yielded: Arc::clone(&self.yielded),
            inbound: Arc::clone(&self.inbound),
        });
        tokio::spawn(async move {
            let answer = SERVING
                .scope(Arc::clone(&slot), handle(&handler, &delivery))
                .await;
            // Its sender waits for it: a passing fault is retried.
            while let Err(error) = store.answer_delivery(&delivery, &answer, incarnation).await {
                tracing::warn!(%node, delivery = delivery.id, %error, "a delivery's answer could not be stored; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RECHECK) => {}
                }
            }
            busy.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&delivery.session);
            if slot.yielded.load(Ordering::SeqCst) {
                slot.server_yielded.fetch_sub(1, Ordering::SeqCst);
            }
            finished.notify_one();
        });
    }
}

/// `handler`'s answer to `delivery`; a panic in it is the delivery's error, not the server's
/// end (its sender would otherwise wait on a claimed row for as long as the node lives).
async fn handle(handler: &DeliveryHandler, delivery: &Delivery) -> Result<Value> {
    use futures::FutureExt;
    let panicked =
        || SubagentError::bug(format!("the handler of delivery {} panicked", delivery.id));
    let answer =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(delivery.clone())))
            .map_err(|_| panicked())?;
    std::panic::AssertUnwindSafe(answer)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(panicked()))
}
