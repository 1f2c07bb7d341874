//! Provides [`ProjectionRegistry`]: the registered projection units, and their watermark cells
//! on every live session's log.
//!
//! A live session's snapshot folds only the events appended since the last one (the cell's
//! watermark) from the in-memory log: it reads nothing from the store. Cells live in the log's
//! memo, so they go when the log does. A cold session is folded whole from an inspected log.
//!
//! Every unit runs contained: a unit that panics, or whose view fails, fails the snapshot of
//! that one session (a listing then diagnoses that child `corrupt`), never the caller.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::native::{FoldState, Native};
use super::ProjectionUnit;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::header::now_ms;
use crate::session::{SessionEvent, SessionLog, SessionLogView};

/// The views of a session's client-visible units as of one event.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionSnapshot {
    /// The seq of the last event folded in (`None` for an empty log).
    pub as_of_seq: Option<u64>,
    /// Each visible unit's view, by key.
    pub values: BTreeMap<String, Value>,
}

/// One unit's state as of one event: what the checkpoint cache stores beside the log.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRow {
    /// The unit's key.
    pub key: String,
    /// The unit's state version when the row was taken.
    pub version: u32,
    /// The seq of the last event folded into `state`.
    pub seq: u64,
    /// The unit's state.
    pub state: Value,
}

/// One unit's state as of one event, as a checkpoint hands it to the store: the fold state
/// itself, written straight into the record (no JSON value is built for it).
pub(super) struct StateRow {
    pub(super) key: String,
    pub(super) version: u32,
    pub(super) seq: u64,
    pub(super) state: FoldState,
}

impl From<StateRow> for CheckpointRow {
    fn from(row: StateRow) -> Self {
        Self {
            state: row.state.to_json(),
            key: row.key,
            version: row.version,
            seq: row.seq,
        }
    }
}

struct Registered {
    unit: Arc<dyn ProjectionUnit>,
    registrations: usize,
    /// Which built-in unit this is, when the registry folds it decoded.
    native: Option<Native>,
}

/// A registered unit as a fold takes it.
type Folded = (Arc<dyn ProjectionUnit>, Option<Native>);

/// The registered projection units. Cheap to share; units are called without any lock held.
#[derive(Default)]
pub struct ProjectionRegistry {
    units: Mutex<Vec<Registered>>,
}

impl std::fmt::Debug for ProjectionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProjectionRegistry")
            .field(
                "units",
                &self
                    .units()
                    .iter()
                    .map(|unit| unit.key().to_owned())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A unit's registration; [`ProjectionRegistration::remove`] (or dropping it without
/// [`ProjectionRegistration::keep`]) releases it. Registrations of one key are counted: the unit
/// goes when the last one is released.
#[must_use = "dropping the registration removes the unit; call keep() to keep it"]
pub struct ProjectionRegistration {
    registry: Weak<ProjectionRegistry>,
    key: Option<String>,
}

impl ProjectionRegistration {
    /// Releases the registration now.
    pub fn remove(mut self) {
        self.release();
    }

    /// Keeps the unit registered for the registry's lifetime.
    pub fn keep(mut self) {
        self.key = None;
    }

    fn release(&mut self) {
        if let (Some(key), Some(registry)) = (self.key.take(), self.registry.upgrade()) {
            registry.release(&key);
        }
    }
}

impl Drop for ProjectionRegistration {
    fn drop(&mut self) {
        self.release();
    }
}

/// One unit's row of a stored checkpoint record, its state left encoded until the unit it is
/// of is known (see [`ProjectionRegistry::seed`]).
#[derive(serde::Deserialize)]
pub(crate) struct StoredRow<'a> {
    #[serde(rename = "ver")]
    version: u32,
    seq: u64,
    #[serde(rename = "val", borrow)]
    state: &'a serde_json::value::RawValue,
}

/// A unit's watermark cell on one live log.
struct Cell {
    version: u32,
    state: FoldState,
    /// How many events are folded into `state`.
    folded: usize,
    /// Set once the unit panicked on this log: its state can no longer be trusted.
    failed: bool,
}

/// The cells of one live log, by unit key (the log's memo).
#[derive(Default)]
struct Cells {
    /// A list, not a map: a registry holds a few units, and this is searched on every fold.
    by_key: Vec<(String, Cell)>,
    /// The seq of the last checkpoint handed out for writing.
    checkpointed: Option<u64>,
    /// When it was handed out.
    checkpointed_at: Option<Instant>,
    /// The seq of the newest checkpoint the store took.
    landed: Option<u64>,
}

impl crate::session::LogMemo for Cells {
    /// A log that pages out its events keeps those a unit has not folded yet (one already
    /// behind what the log holds catches up from the store: see
    /// [`ProjectionRegistry::catch_up`]).
    fn read_through(&self, first_resident: usize) -> usize {
        self.by_key
            .iter()
            .filter(|(_, cell)| !cell.failed && cell.folded >= first_resident)
            .map(|(_, cell)| cell.folded)
            .min()
            .unwrap_or(usize::MAX)
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn unit_failed(unit: &dyn ProjectionUnit, what: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::StoreCorrupt,
        format!("projection unit \"{}\" failed: {what}", unit.key()),
    )
}

/// A cell at the unit's initial state; a unit whose `init` panics gets a failed cell.
fn fresh_cell(unit: &dyn ProjectionUnit, native: Option<Native>) -> Cell {
    let init = FoldState::init(unit, native);
    Cell {
        version: unit.state_version(),
        failed: init.is_none(),
        state: init.unwrap_or_default(),
        folded: 0,
    }
}

/// The unit's view of `state`, contained.
pub(super) fn view_of(unit: &dyn ProjectionUnit, state: &Value) -> Result<Value> {
    catch_unwind(AssertUnwindSafe(|| unit.view(state)))
        .unwrap_or_else(|_| Err(unit_failed(unit, "its view panicked")))
}

fn rows_of(cells: &Cells, len: usize) -> Vec<StateRow> {
    let Some(seq) = seq_of(len) else {
        return Vec::new();
    };
    cells
        .by_key
        .iter()
        .filter(|(_, cell)| !cell.failed && cell.folded == len)
        .map(|(key, cell)| StateRow {
            key: key.clone(),
            version: cell.version,
            seq,
            state: cell.state.clone(),
        })
        .collect()
}

fn seq_of(folded: usize) -> Option<u64> {
    folded
        .checked_sub(1)
        .and_then(|last| u64::try_from(last).ok())
}

impl Cells {
    fn get(&self, key: &str) -> Option<&Cell> {
        self.by_key
            .iter()
            .find(|(cell_key, _)| cell_key == key)
            .map(|(_, cell)| cell)
    }

    /// The cell of `unit`, fresh when it has none or one of another state version.
    fn of(&mut self, unit: &dyn ProjectionUnit, native: Option<Native>) -> &mut Cell {
        let index = match self.by_key.iter().position(|(key, _)| key == unit.key()) {
            Some(index) => index,
            None => {
                self.by_key
                    .push((unit.key().to_owned(), fresh_cell(unit, native)));
                self.by_key.len() - 1
            }
        };
        let cell = &mut self.by_key[index].1;
        if cell.version != unit.state_version() {
            *cell = fresh_cell(unit, native);
        }
        cell
    }
}

impl ProjectionRegistry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A registry with the delegation API's two units: the subagent identity and its timing.
    /// On a live log this registry keeps both states decoded, as the structs their JSON
    /// encodes, and writes JSON only for a checkpoint row or a view (the same JSON their own
    /// folds reach).
    pub fn with_seam_units() -> Arc<Self> {
        let registry = Self::new();
        for (unit, native) in [
            (
                Arc::new(super::SubagentIdentityUnit) as Arc<dyn ProjectionUnit>,
                Native::Identity,
            ),
            (Arc::new(super::SubagentTimingUnit), Native::Timing),
        ] {
            // Two distinct keys into an empty registry cannot conflict.
            if let Ok(registration) = registry.register_as(unit, Some(native)) {
                registration.keep();
            }
        }
        registry
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Registered>> {
        self.units.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `unit` under its key. Registering a key again counts one more registration of
    /// the unit already there.
    ///
    /// # Errors
    /// `INVALID_PROJECTION` when the key is registered with another state version.
    pub fn register(
        self: &Arc<Self>,
        unit: Arc<dyn ProjectionUnit>,
    ) -> Result<ProjectionRegistration> {
        self.register_as(unit, None)
    }

    fn register_as(
        self: &Arc<Self>,
        unit: Arc<dyn ProjectionUnit>,
        native: Option<Native>,
    ) -> Result<ProjectionRegistration> {
        let key = unit.key().to_owned();
        let mut units = self.lock();
        match units.iter_mut().find(|entry| entry.unit.key() == key) {
            Some(entry) if entry.unit.state_version() != unit.state_version() => {
                return Err(SubagentError::new(
                    ErrorCode::InvalidProjection,
                    format!(
                        "projection unit \"{key}\" is registered with state version {}, not {}",
                        entry.unit.state_version(),
                        unit.state_version()
                    ),
                ));
            }
            Some(entry) => entry.registrations += 1,
            None => units.push(Registered {
                unit,
                registrations: 1,
                native,
            }),
        }
        Ok(ProjectionRegistration {
            registry: Arc::downgrade(self),
            key: Some(key),
        })
    }

    fn release(&self, key: &str) {
        let mut units = self.lock();
        if let Some(index) = units.iter().position(|entry| entry.unit.key() == key) {
            units[index].registrations -= 1;
            if units[index].registrations == 0 {
                units.remove(index);
            }
        }
    }

    /// The registered units, in registration order.
    pub fn units(&self) -> Vec<Arc<dyn ProjectionUnit>> {
        self.lock()
            .iter()
            .map(|entry| Arc::clone(&entry.unit))
            .collect()
    }

    /// The registered units with how each folds, in registration order.
    fn folded(&self) -> Vec<Folded> {
        self.lock()
            .iter()
            .map(|entry| (Arc::clone(&entry.unit), entry.native))
            .collect()
    }

    /// The registered unit under `key`.
    pub fn unit(&self, key: &str) -> Option<Arc<dyn ProjectionUnit>> {
        self.lock()
            .iter()
            .find(|entry| entry.unit.key() == key)
            .map(|entry| Arc::clone(&entry.unit))
    }

    /// Brings `log`'s cells up to its last event and runs `read` over them (under the log's
    /// lock, so the cells match the events).
    fn with_cells<R>(
        &self,
        log: &SessionLog,
        units: &[Folded],
        read: impl FnOnce(&mut Cells, usize) -> R,
    ) -> R {
        log.with_memo(|cells: &mut Cells, events| {
            cells
                .by_key
                .retain(|(key, _)| units.iter().any(|(unit, _)| unit.key() == key));
            for (unit, native) in units {
                let cell = cells.of(unit.as_ref(), *native);
                if cell.failed || cell.folded >= events.len() {
                    continue;
                }
                if cell.folded < events.first_resident() {
                    // Behind what the log holds (a fork child whose inherited prefix is paged
                    // out, or a unit registered after the log paged out): it waits for
                    // `catch_up`, which reads the rest from the store.
                    continue;
                }
                let state = std::mem::take(&mut cell.state);
                match state.fold(unit.as_ref(), events.iter_from(cell.folded)) {
                    Some(state) => {
                        cell.state = state;
                        cell.folded = events.len();
                    }
                    None => cell.failed = true,
                }
            }
            read(cells, events.len())
        })
    }

    /// Folds every registered unit over what `log` appended since the last fold: before the
    /// log pages out its settled events, so that none is dropped before a unit folded it.
    pub(crate) fn fold_live(&self, log: &SessionLog) {
        self.with_cells(log, &self.folded(), |_, _| ());
    }

    /// Brings the cells of a live log that are behind what it holds in memory (its events
    /// below [`crate::EventList::first_resident`] paged out, or inherited paged out by a fork)
    /// up to date, reading the paged-out events from the store once. Nothing to do, and no
    /// read, for a log that holds every event.
    ///
    /// # Errors
    /// The store's.
    pub(crate) async fn catch_up(
        &self,
        log: &SessionLogView,
        store: &dyn crate::store::SessionPersistence,
    ) -> Result<()> {
        let log = log.inner();
        let Some(paged) = log.paged_prefix() else {
            return Ok(());
        };
        let units = self.folded();
        let behind = self.with_cells(log, &units, |cells, _| {
            cells
                .by_key
                .iter()
                .any(|(_, cell)| !cell.failed && cell.folded < paged.len)
        });
        if !behind {
            return Ok(());
        }
        let before = u64::try_from(paged.len).unwrap_or(u64::MAX);
        let prefix = store.read_between(paged.session, 0, before).await?;
        log.with_memo(|cells: &mut Cells, events| {
            // Paged out further meanwhile: the next call reads again.
            if events.first_resident() != paged.len || prefix.len() != paged.len {
                return;
            }
            for (unit, native) in &units {
                let cell = cells.of(unit.as_ref(), *native);
                if cell.failed || cell.folded >= paged.len {
                    continue;
                }
                let state = std::mem::take(&mut cell.state);
                let unread = prefix[cell.folded..].iter().chain(events.iter());
                match state.fold(unit.as_ref(), unread) {
                    Some(state) => {
                        cell.state = state;
                        cell.folded = events.len();
                    }
                    None => cell.failed = true,
                }
            }
        });
        Ok(())
    }

    /// Starts `log`'s cells from the checkpoint `rows` its store holds (of the same session
    /// lifecycle, as [`super::cache::seed_at_resume`] reads them) instead of its first event: a
    /// unit whose row is at its current state version, decodes, and covers a prefix of the log
    /// folds only the events after it. A row ahead of the log, one that does not decode, and a
    /// unit already folding on this log are left to the fold of the log itself.
    ///
    /// A resumed long-lived child's first checkpoint then folds its new epoch, not its whole
    /// transcript again.
    pub(crate) fn seed<'a>(
        &self,
        log: &SessionLog,
        rows: impl IntoIterator<Item = (&'a str, &'a StoredRow<'a>)>,
    ) {
        let units = self.folded();
        log.with_memo(|cells: &mut Cells, events| {
            for (key, row) in rows {
                let Some((unit, native)) = units.iter().find(|(unit, _)| unit.key() == key) else {
                    continue;
                };
                let covered = row
                    .seq
                    .checked_add(1)
                    .and_then(|covered| usize::try_from(covered).ok());
                let Some(covered) = covered.filter(|covered| *covered <= events.len()) else {
                    continue;
                };
                if row.version != unit.state_version() || cells.get(key).is_some() {
                    continue;
                }
                let Some(state) = FoldState::from_row(*native, row.state) else {
                    continue;
                };
                let cell = Cell {
                    version: row.version,
                    state,
                    folded: covered,
                    failed: false,
                };
                cells.by_key.push((key.to_owned(), cell));
            }
        });
    }

    /// The views of a live session's visible units, folding only what was appended since the
    /// last call (no store read: a unit behind a paged-out log's held events has no view
    /// until the listing catches it up from the store).
    ///
    /// # Errors
    /// When any visible unit panicked on this log or cannot render its view.
    pub fn snapshot(&self, log: &SessionLogView) -> Result<ProjectionSnapshot> {
        let log = log.inner();
        // One list for the fold and the read: a unit registered in between cannot look failed.
        let units = self.folded();
        let states = self.with_cells(log, &units, |cells, len| {
            let states: Vec<(Arc<dyn ProjectionUnit>, Option<FoldState>)> = units
                .iter()
                .filter(|(unit, _)| unit.visible())
                .map(|(unit, _)| {
                    let state = cells
                        .get(unit.key())
                        .filter(|cell| !cell.failed && cell.folded == len)
                        .map(|cell| cell.state.clone());
                    (Arc::clone(unit), state)
                })
                .collect();
            (states, len)
        });
        let (states, len) = states;
        let mut values = BTreeMap::new();
        for (unit, state) in states {
            let state = state.ok_or_else(|| {
                unit_failed(
                    unit.as_ref(),
                    "its fold panicked, or the log paged out events it had not folded",
                )
            })?;
            values.insert(unit.key().to_owned(), state.view(unit.as_ref())?);
        }
        Ok(ProjectionSnapshot {
            as_of_seq: seq_of(len),
            values,
        })
    }

    /// Every unit's state on a live log, as checkpoint rows (none for an empty log, and none
    /// for a unit that failed on it).
    pub fn checkpoint(&self, log: &SessionLogView) -> Vec<CheckpointRow> {
        self.with_cells(log.inner(), &self.folded(), |cells, len| {
            rows_of(cells, len)
        })
        .into_iter()
        .map(CheckpointRow::from)
        .collect()
    }

    /// As [`ProjectionRegistry::checkpoint`], but empty when the log has not grown since the
    /// last rows this returned: a turn end and the disposal right after it write once.
    pub(super) fn fresh_checkpoint(&self, log: &SessionLog) -> Vec<StateRow> {
        self.handed_out(log, false)
    }

    /// Every unit's state on a log being disposed, marked as the newest checkpoint; empty when
    /// the store already took a checkpoint of the whole log (the turn end's, usually).
    pub(super) fn final_checkpoint(&self, log: &SessionLog) -> Vec<StateRow> {
        self.handed_out(log, true)
    }

    /// Records that the store took the checkpoint of `seq`.
    pub(crate) fn checkpoint_landed(&self, log: &SessionLog, seq: u64) {
        log.with_memo(|cells: &mut Cells, _| {
            cells.landed = cells.landed.max(Some(seq));
        });
    }

    /// The rows to write, marked as the newest checkpoint handed out; empty when the store
    /// holds a checkpoint of the whole log, or when `always` is false and the log has not grown
    /// since the last one handed out (which may still be on its way to the store).
    fn handed_out(&self, log: &SessionLog, always: bool) -> Vec<StateRow> {
        self.with_cells(log, &self.folded(), |cells, len| {
            let last = seq_of(len);
            if last.is_none() || cells.landed == last || (!always && cells.checkpointed == last) {
                return Vec::new();
            }
            cells.checkpointed = seq_of(len);
            cells.checkpointed_at = Some(Instant::now());
            rows_of(cells, len)
        })
    }

    /// Whether a long turn's log is due a checkpoint: `every_events` appended since the last
    /// one, or `interval` passed since it (without folding anything to find out).
    pub(crate) fn checkpoint_due(
        &self,
        log: &SessionLog,
        every_events: u64,
        interval: Duration,
    ) -> bool {
        log.with_memo(|cells: &mut Cells, events| {
            let len = u64::try_from(events.len()).unwrap_or(u64::MAX);
            let since = cells.checkpointed.map_or(0, |seq| seq + 1);
            let grown = len.saturating_sub(since);
            // Before the first checkpoint, the interval runs from the log's first event held.
            let waited = match cells.checkpointed_at {
                Some(at) => at.elapsed(),
                None => events.iter().next().map_or(Duration::ZERO, |first| {
                    Duration::from_millis(now_ms().saturating_sub(first.time))
                }),
            };
            grown >= every_events || (grown > 0 && waited >= interval)
        })
    }

    /// Whether `seq` is still the newest checkpoint handed out for `log`: a slower write of an
    /// older one must not overwrite a newer one.
    pub(crate) fn is_latest_checkpoint(&self, log: &SessionLog, seq: u64) -> bool {
        log.with_memo(|cells: &mut Cells, _| cells.checkpointed.is_none_or(|latest| latest <= seq))
    }

    /// The views of every visible unit folded over a whole stored log (a cold session).
    ///
    /// # Errors
    /// When any visible unit panicked or cannot render its view.
    pub fn fold(&self, events: &[Arc<SessionEvent>]) -> Result<ProjectionSnapshot> {
        let mut values = BTreeMap::new();
        for (unit, native) in self.folded().iter().filter(|(unit, _)| unit.visible()) {
            let state = FoldState::init(unit.as_ref(), *native)
                .and_then(|init| init.fold(unit.as_ref(), events))
                .ok_or_else(|| unit_failed(unit.as_ref(), "its fold panicked"))?;
            values.insert(unit.key().to_owned(), state.view(unit.as_ref())?);
        }
        Ok(ProjectionSnapshot {
            as_of_seq: seq_of(events.len()),
            values,
        })
    }

    /// The view of a checkpoint row, with no log read: `None` when the row is not usable (its
    /// unit is not registered or not visible, or the row is of another state version).
    ///
    /// # Errors
    /// When the unit cannot render the row's state.
    pub fn view_row(&self, row: &CheckpointRow) -> Option<Result<Value>> {
        let unit = self.unit(&row.key)?;
        if unit.state_version() != row.version || !unit.visible() {
            return None;
        }
        Some(view_of(unit.as_ref(), &row.state))
    }
}
