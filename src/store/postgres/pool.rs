//! The connection pool of a [`PostgresStore`](super::PostgresStore), whose connections live on
//! the runtime that opened the store.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::future::BoxFuture;
use tokio_postgres::NoTls;

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
        let opening = self
            .runtime
            .spawn(open_on(config.clone(), self.runtime.clone()));
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
