//! The store a load run writes to: in memory, a sled directory (temporary unless named), or a
//! PostgreSQL database (the cluster's, with several nodes), and how verification reopens it.

use std::sync::Arc;

use super::scenario::{LoadStore, Scenario};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::store::{MemoryStore, SharedStore, SledStore};

/// The store of a run, and the temporary directory it lives in (removed when dropped).
pub(super) struct RunStore {
    pub(super) store: SharedStore,
    /// The PostgreSQL store the first node joins, when the run is a cluster.
    pub(super) cluster: Option<Arc<crate::store::PostgresStore>>,
    pub(super) reopen: Option<Reopen>,
    pub(super) _temporary: Option<tempfile::TempDir>,
}

/// How verification reopens a run's store.
pub(crate) enum Reopen {
    /// The sled directory itself, once the run closed it.
    Sled(std::path::PathBuf),
    /// A second connection to the database.
    Postgres(String),
}

/// Opens the store `scenario` names.
///
/// # Errors
/// `INVALID_ARGS` for PostgreSQL without a url; the store's error when it cannot be opened.
pub(super) async fn open_store(scenario: &Scenario) -> Result<RunStore> {
    match (scenario.store, &scenario.store_url) {
        (LoadStore::Memory, _) => Ok(RunStore {
            store: Arc::new(MemoryStore::new()),
            cluster: None,
            reopen: None,
            _temporary: None,
        }),
        (LoadStore::Postgres, url) => {
            let url = url.clone().ok_or_else(|| {
                SubagentError::new(ErrorCode::InvalidArgs, "the postgres store needs store_url")
            })?;
            let store = Arc::new(crate::store::PostgresStore::connect(&url).await?);
            Ok(RunStore {
                cluster: (scenario.nodes > 1).then(|| Arc::clone(&store)),
                store,
                reopen: Some(Reopen::Postgres(url)),
                _temporary: None,
            })
        }
        (LoadStore::Sled, _) => {
            let (dir, temporary) = match &scenario.store_dir {
                Some(dir) => (dir.clone(), None),
                None => {
                    let temporary = tempfile::tempdir().map_err(|error| {
                        SubagentError::store_io("creating a temporary store directory", error)
                    })?;
                    (temporary.path().to_path_buf(), Some(temporary))
                }
            };
            Ok(RunStore {
                store: Arc::new(SledStore::open_with_cache_capacity(
                    &dir,
                    scenario.store_cache_bytes(),
                )?),
                cluster: None,
                reopen: Some(Reopen::Sled(dir.clone())),
                _temporary: temporary,
            })
        }
    }
}
