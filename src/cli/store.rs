//! The `--store` value the commands share: a sled directory (`.subagents` unless a command is
//! told otherwise), `memory` (nothing kept after the command), or a PostgreSQL connection
//! string (`postgres://…`, `postgresql://…`, or libpq's `key=value` form).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use subagents::store::{PostgresStore, SharedStore};
use subagents::{ErrorCode, MemoryStore, SledStore, SubagentError};

/// Every command's store when none is named: a sled directory in the working directory, so
/// `subagents tree` shows what `load`, `demo` or `acp-agent` left there.
pub(crate) const DEFAULT_STORE: &str = ".subagents";

/// Where a command's sessions live. Its `Debug` and `Display` never show a password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum StoreLocation {
    /// A sled directory.
    Sled(PathBuf),
    /// An in-memory store: nothing outlives the command (`memory`; `./memory` names a
    /// directory).
    Memory,
    /// A PostgreSQL database.
    Postgres(String),
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreLocation({self})")
    }
}

/// Whether `text` is libpq's `key=value …` form: every word a known-looking `key=value`.
fn is_keyword_form(text: &str) -> bool {
    text.split_whitespace().all(|word| {
        word.split_once('=').is_some_and(|(key, _)| {
            !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
    })
}

impl FromStr for StoreLocation {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err("the store must be a directory, `memory` or a postgres:// URL".to_owned());
        }
        if text == "memory" {
            return Ok(Self::Memory);
        }
        let postgres = text.starts_with("postgres://")
            || text.starts_with("postgresql://")
            || is_keyword_form(text);
        Ok(if postgres {
            Self::Postgres(text.to_owned())
        } else {
            Self::Sled(PathBuf::from(text))
        })
    }
}

/// The directory, or the URL without its password.
impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sled(dir) => write!(f, "{}", dir.display()),
            Self::Memory => f.write_str("memory"),
            Self::Postgres(url) => match url.parse::<tokio_postgres::Config>() {
                Ok(config) => {
                    let hosts: Vec<String> = config
                        .get_hosts()
                        .iter()
                        .map(|host| match host {
                            tokio_postgres::config::Host::Tcp(name) => name.clone(),
                            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                        })
                        .collect();
                    write!(
                        f,
                        "PostgreSQL database {} on {}",
                        config.get_dbname().unwrap_or("postgres"),
                        hosts.join(",")
                    )
                }
                Err(_) => f.write_str("a PostgreSQL database"),
            },
        }
    }
}

/// The page cache of a sled store opened to be read through once. `tree` over 100,000 children
/// (sled, `load --roots 1 --children 100000`): 64 MiB held 209 MiB RSS in 1.9 s, 32 MiB 168–179
/// MiB in the same time, 16 MiB 151–154 MiB but 2.0 s: a listing reads each child once, so a
/// larger cache mostly holds what was already read.
const READER_CACHE_BYTES: u64 = 32 << 20;

impl StoreLocation {
    /// The value to pass back as `--store`: the directory, or, for a database whose URL may
    /// hold a password, a reminder to pass the same one.
    pub(crate) fn argument(&self) -> String {
        match self {
            Self::Sled(dir) => dir.display().to_string(),
            Self::Memory => "memory".to_owned(),
            Self::Postgres(_) => "<the same connection string>".to_owned(),
        }
    }

    /// Opens the store; with `must_exist`, a sled directory that is not there is an error (a
    /// reader must not create an empty store), and so is `memory` (it holds nothing yet).
    pub(crate) async fn open(&self, must_exist: bool) -> Result<SharedStore, SubagentError> {
        self.open_with(must_exist, None).await
    }

    /// Opens an existing store to read it through once (`tree`): a sled store keeps at most
    /// [`READER_CACHE_BYTES`] of its pages in memory, however large it is.
    pub(crate) async fn open_to_read(&self) -> Result<SharedStore, SubagentError> {
        match self {
            Self::Sled(dir) if dir.is_dir() => Ok(Arc::new(SledStore::open_with_cache_capacity(
                dir,
                READER_CACHE_BYTES,
            )?)),
            _ => self.open(true).await,
        }
    }

    /// [`StoreLocation::open`] with a lease time-to-live for a PostgreSQL store.
    ///
    /// # Errors
    /// `INVALID_ARGS` for a time-to-live on a sled store (its leases live in this process).
    pub(crate) async fn open_with(
        &self,
        must_exist: bool,
        lease_ttl: Option<std::time::Duration>,
    ) -> Result<SharedStore, SubagentError> {
        match (self, lease_ttl) {
            (Self::Sled(_) | Self::Memory, Some(_)) => {
                return Err(SubagentError::new(
                    ErrorCode::InvalidArgs,
                    "--lease-ttl-ms applies only to a PostgreSQL store",
                ))
            }
            (Self::Postgres(url), Some(ttl)) => {
                let mut config = subagents::store::PostgresConfig::new(url.clone());
                config.lease_ttl = ttl;
                return Ok(Arc::new(PostgresStore::connect_with(config).await?));
            }
            _ => {}
        }
        match self {
            Self::Sled(dir) => {
                if must_exist && !dir.is_dir() {
                    return Err(SubagentError::new(
                        ErrorCode::SessionNotFound,
                        format!("there is no store at {}", dir.display()),
                    ));
                }
                Ok(Arc::new(SledStore::open(dir)?))
            }
            Self::Memory if must_exist => Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                "a memory store holds nothing to read: name the directory or database to read",
            )),
            Self::Memory => Ok(Arc::new(MemoryStore::new())),
            Self::Postgres(url) if must_exist => {
                Ok(Arc::new(PostgresStore::connect_existing(url).await?))
            }
            Self::Postgres(url) => Ok(Arc::new(PostgresStore::connect(url).await?)),
        }
    }
}
