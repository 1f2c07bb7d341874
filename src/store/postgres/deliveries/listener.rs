//! A node's listener: the connection that hears its deliveries and their answers announced.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::store::postgres::reconnect::within;
use crate::store::postgres::{io, PostgresStore};

/// The channel a node listens on (an unquoted identifier: lowercase hex only).
pub(in crate::store::postgres) fn channel_of(node: uuid::Uuid) -> String {
    format!("subagents_node_{}", node.simple())
}

/// What a node's listener hands on.
#[derive(Default)]
pub(in crate::store::postgres) struct Inbound {
    /// Woken when a delivery for this node was committed.
    pub(in crate::store::postgres) deliveries: Notify,
    /// The senders waiting for an answer, by delivery id: told the stored answer when the
    /// announcement carried it.
    pub(in crate::store::postgres) answers:
        Mutex<HashMap<uuid::Uuid, oneshot::Sender<Option<Value>>>>,
    /// Whether a server runs: one per node, or a session's deliveries would no longer be
    /// served in order.
    pub(super) serving: AtomicBool,
}

impl std::fmt::Debug for Inbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbound").finish_non_exhaustive()
    }
}

impl Inbound {
    /// Routes one notification payload: `d` (a delivery for this node), or `a:<ticket>` or
    /// `a:<ticket>:<answer>` (the answer to one of its own, carried when it fits).
    fn route(&self, payload: &str) {
        if payload == "d" {
            self.deliveries.notify_one();
            return;
        }
        let Some(answer) = payload.strip_prefix("a:") else {
            return;
        };
        let (ticket, carried) = match answer.split_once(':') {
            Some((ticket, carried)) => (ticket, serde_json::from_str(carried).ok()),
            None => (answer, None),
        };
        let Ok(ticket) = ticket.parse::<uuid::Uuid>() else {
            return;
        };
        let waiting = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ticket);
        if let Some(waiting) = waiting {
            let _ = waiting.send(carried);
        }
    }
}

/// The first wait before a lost listener connection is opened again; it doubles up to
/// [`LISTENER_BACKOFF_MAX`] while the server stays out of reach.
const LISTENER_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between two attempts to open the listener connection again.
const LISTENER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Opens the connection that listens on `node`'s channel, driven until `stop`; notifications
/// go to `inbound`. A listener connection that fails (the server restarted, the backend was
/// terminated) is opened again with a bounded backoff; meanwhile, and for what was announced
/// while it was down, the rechecks find the deliveries.
///
/// # Errors
/// `STORE_IO` when the first connection cannot be opened or cannot listen.
pub(in crate::store::postgres) async fn listen(
    store: &PostgresStore,
    node: uuid::Uuid,
    inbound: Arc<Inbound>,
    stop: CancellationToken,
) -> Result<()> {
    let config = store.pg_config.clone();
    let deadline = store.call_deadline;
    let opening = "opening the cluster listener";
    let mut listening = within(
        opening,
        deadline,
        Listening::open(&config, node, &inbound, &stop),
    )
    .await?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                // First: a connection ended by the stop is no loss.
                biased;
                () = stop.cancelled() => return,
                _ = &mut listening.ended => {}
            }
            tracing::warn!(%node, "the cluster listener's connection was lost; opening it again");
            let mut backoff = LISTENER_BACKOFF;
            listening = loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                match within(
                    opening,
                    deadline,
                    Listening::open(&config, node, &inbound, &stop),
                )
                .await
                {
                    Ok(listening) => break listening,
                    Err(error) => {
                        tracing::warn!(%node, %error, ?backoff, "the cluster listener could not listen again; retrying");
                        backoff = (backoff * 2).min(LISTENER_BACKOFF_MAX);
                    }
                }
            };
            tracing::info!(%node, "the cluster listener listens again");
            // A delivery announced while it was down was not heard: look now.
            inbound.deliveries.notify_one();
        }
    });
    Ok(())
}

/// One listener connection: its client (the connection lives while it does) and the signal
/// that its connection ended.
struct Listening {
    _client: tokio_postgres::Client,
    ended: oneshot::Receiver<()>,
}

impl Listening {
    /// Connects, routes the connection's notifications to `inbound` until it ends or `stop`
    /// fires, and listens on `node`'s channel.
    async fn open(
        config: &tokio_postgres::Config,
        node: uuid::Uuid,
        inbound: &Arc<Inbound>,
        stop: &CancellationToken,
    ) -> Result<Self> {
        let (client, mut connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(io("opening the cluster listener"))?;
        let (ended_tx, ended) = oneshot::channel();
        let inbound = Arc::clone(inbound);
        let stop = stop.clone();
        tokio::spawn(async move {
            let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            futures::pin_mut!(messages);
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    message = futures::StreamExt::next(&mut messages) => message,
                };
                match message {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(notice))) => {
                        inbound.route(notice.payload());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(%node, %error, "the cluster listener's connection failed");
                        break;
                    }
                    None => break,
                }
            }
            let _ = ended_tx.send(());
        });
        client
            .batch_execute(&format!("LISTEN {}", channel_of(node)))
            .await
            .map_err(io("listening for deliveries"))?;
        Ok(Self {
            _client: client,
            ended,
        })
    }
}
