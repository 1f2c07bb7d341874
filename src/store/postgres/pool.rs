//! The connection pool of a [`PostgresStore`](super::PostgresStore), whose connections live on
//! the runtime that opened the store, and the connections it checks out ([`Pooled`]): one whose
//! call outlived its deadline ([`by_deadline`]) is closed instead of being handed back.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use futures::future::BoxFuture;
use tokio_postgres::NoTls;
use tokio_util::task::AbortOnDropHandle;

use crate::error::{ErrorCode, Result, SubagentError};

/// How long opening a connection may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a store call waits for a free connection before failing (`STORE_IO`).
const POOL_WAIT: Duration = Duration::from_secs(30);

/// A pool of at most `size` connections, opened on `runtime` (see [`OnStoreRuntime`]).
pub(super) fn open_pool(
    pg: &tokio_postgres::Config,
    runtime: &tokio::runtime::Handle,
    size: usize,
) -> Result<Pool> {
    let manager = Manager::from_connect(
        pg.clone(),
        OnStoreRuntime {
            runtime: runtime.clone(),
        },
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                "the connection pool does not build",
            )
            .with_source(error)
        })
}

/// Opens the pool's connections on the runtime that opened the store, whichever thread asks
/// for one. A connection's socket and its driving task belong to the runtime they start on, and
/// agents run on worker threads that stop before the store is done with (a load run verifies
/// after its workers stopped): a connection opened there would die with its worker, and the
/// pool would hand it out dead.
struct OnStoreRuntime {
    runtime: tokio::runtime::Handle,
}

/// A connection of the pool: its client and the task driving it.
type Opened = (tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl deadpool_postgres::Connect for OnStoreRuntime {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, std::result::Result<Opened, tokio_postgres::Error>> {
        let config = config.clone();
        // Aborted when the pool stops waiting for it (its create timeout): the connect
        // timeout covers only the socket's connect, and a server that accepts it and never
        // answers the startup would otherwise hold the attempt, and its socket, forever.
        let opening = AbortOnDropHandle::new(
            self.runtime
                .spawn(open_on(config.clone(), self.runtime.clone())),
        );
        Box::pin(async move {
            match opening.await {
                Ok(opened) => opened,
                // The store's runtime has shut down: open it here, the best left to do.
                Err(_) => open_on(config, tokio::runtime::Handle::current()).await,
            }
        })
    }
}

/// Opens a connection and drives it on `runtime` (the one this runs on).
async fn open_on(
    config: tokio_postgres::Config,
    runtime: tokio::runtime::Handle,
) -> std::result::Result<Opened, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let driving = runtime.spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "a PostgreSQL connection failed");
        }
    });
    Ok((client, driving))
}

/// A connection checked out for one store call. Dropped after the deadline of a call it served
/// passed ([`by_deadline`]), it leaves the pool and closes rather than go back: the statement
/// it carries may still be running on a server that stopped answering (paused, partitioned,
/// stuck on its disk), and the connection's next user would wait behind it for as long again.
/// Closing it also ends, on the server, whatever transaction the call had open.
pub(super) struct Pooled {
    /// Present until dropped or closed.
    object: Option<Object>,
    /// The deadlines of the calls this connection was checked out under.
    deadline: Option<Deadline>,
}

impl Pooled {
    /// Takes the connection out of the pool and closes it (its driving task is aborted).
    pub(super) fn close(mut self) {
        self.detach();
    }

    fn detach(&mut self) {
        if let Some(object) = self.object.take() {
            drop(Object::take(object));
        }
    }
}

impl Deref for Pooled {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.object
            .as_ref()
            .expect("a pooled connection is present until it is dropped or closed")
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Object {
        self.object
            .as_mut()
            .expect("a pooled connection is present until it is dropped or closed")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.deadline.as_ref().is_some_and(Deadline::passed) {
            self.detach();
        }
    }
}

/// A connection from `pool`, closed on drop if the deadline of the call it is checked out
/// under passes first (see [`Pooled`]).
pub(super) async fn checkout(pool: &Pool) -> std::result::Result<Pooled, PoolError> {
    let object = pool.get().await?;
    Ok(Pooled {
        object: Some(object),
        deadline: CALL_DEADLINE.try_with(Deadline::clone).ok(),
    })
}

/// Whether a call's deadline passed, or that of a call it runs within.
#[derive(Clone)]
struct Deadline(Arc<DeadlineState>);

struct DeadlineState {
    passed: AtomicBool,
    outer: Option<Deadline>,
}

impl Deadline {
    fn passed(&self) -> bool {
        let mut deadline = Some(self);
        while let Some(Deadline(state)) = deadline {
            if state.passed.load(Ordering::Acquire) {
                return true;
            }
            deadline = state.outer.as_ref();
        }
        false
    }
}

tokio::task_local! {
    /// The deadline of the store call being polled: what [`checkout`] ties a connection to.
    static CALL_DEADLINE: Deadline;
}

/// `call`'s answer, or `None` once `deadline` passed without one. A connection the call checked
/// out and still holds then closes with it (see [`Pooled`]): the deadline is marked passed
/// before the call is dropped.
pub(super) async fn by_deadline<T>(deadline: Duration, call: impl Future<Output = T>) -> Option<T> {
    let state = Deadline(Arc::new(DeadlineState {
        passed: AtomicBool::new(false),
        outer: CALL_DEADLINE.try_with(Deadline::clone).ok(),
    }));
    let mut call = std::pin::pin!(CALL_DEADLINE.scope(state.clone(), call));
    match tokio::time::timeout(deadline, call.as_mut()).await {
        Ok(answer) => Some(answer),
        Err(_) => {
            state.0.passed.store(true, Ordering::Release);
            // `call` drops on return, and its connections with it.
            None
        }
    }
}
