//! Durable listing: `list_children` and `list_descendants` over live sessions and the store, the
//! identity ladder (live snapshot, checkpoint cache, one inspection), its diagnostics, and its
//! cancellation.
//!
//! Most children here are authored straight into the store with crafted headers and logs (the
//! cold shapes a listing must survive); live ones are real agents, created delegated with or
//! without a descriptor, or real continuable and one-shot children that settled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::{self, BoxFuture};
use futures::TryStreamExt;
use serde_json::{json, Value};
use subagents::projection::{ProjectionUnit, CHECKPOINT_RECORD, IDENTITY_UNIT, TIMING_UNIT};
use subagents::seam::DelegationMode;
use subagents::session::SessionOrigin;
use subagents::store::{EncodedRow, ListedSession, OwnEvents, StoredSession};
use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentHandle, AgentScope, CancellationToken, ContinuableStartSpec, CreateAgent, ErrorCode,
    EventKind, EventScope, Lease, LeaseEpoch, LeaseHolder, MemoryStore, Runtime, SessionEvent,
    SessionHeader, SessionId, SessionLog, SessionPersistence, SharedStore, SledStore,
    SubagentActivity, SubagentDescendantListEntry, SubagentDescriptor, SubagentDiagnosticReason,
    SubagentError, SubagentForestEntry, SubagentForestTree, SubagentListEntry,
    SubagentStartRequest, TurnEndReason,
};

use crate::support::{
    author, root, seam_runtime_on, settled, start_run, text, within, SeamRecorder,
};

// ---------------------------------------------------------------------------------------------
// A store that shows what the listing read.

type InspectHook = Arc<
    dyn Fn(SessionId, subagents::Result<OwnEvents>) -> subagents::Result<OwnEvents> + Send + Sync,
>;

/// Delegates to a store, recording every `list` and listing read (`inspect_own`); it can fail the listing, hold it
/// until the caller drops it, fail every cache read, and rewrite what an inspection returns.
struct ProbeStore {
    inner: SharedStore,
    inspected: Mutex<Vec<SessionId>>,
    lists: AtomicUsize,
    list_failure: Mutex<Option<SubagentError>>,
    hold_list: AtomicBool,
    list_entered: tokio::sync::Notify,
    cache_reads_fail: AtomicBool,
    inspect_hook: Mutex<Option<InspectHook>>,
}

impl ProbeStore {
    /// A probe over a fresh in-memory store.
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(MemoryStore::new()),
            inspected: Mutex::default(),
            lists: AtomicUsize::new(0),
            list_failure: Mutex::default(),
            hold_list: AtomicBool::new(false),
            list_entered: tokio::sync::Notify::new(),
            cache_reads_fail: AtomicBool::new(false),
            inspect_hook: Mutex::default(),
        })
    }

    fn inspected(&self) -> Vec<SessionId> {
        self.inspected.lock().unwrap().clone()
    }

    fn inspections_of(&self, id: SessionId) -> usize {
        self.inspected().iter().filter(|seen| **seen == id).count()
    }

    /// Forgets the inspections so far, so a count covers one listing only.
    fn forget_inspections(&self) {
        self.inspected.lock().unwrap().clear();
    }

    fn list_calls(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    fn fail_list(&self, error: SubagentError) {
        *self.list_failure.lock().unwrap() = Some(error);
    }

    /// Makes every later `list` announce itself and then never resolve.
    fn hold_list(&self) {
        self.hold_list.store(true, Ordering::SeqCst);
    }

    /// Resolves once a held `list` was called.
    async fn list_entered(&self) {
        self.list_entered.notified().await;
    }

    fn fail_cache_reads(&self) {
        self.cache_reads_fail.store(true, Ordering::SeqCst);
    }

    /// Passes every inspection's outcome through `hook` before the caller sees it.
    fn on_inspect(
        &self,
        hook: impl Fn(SessionId, subagents::Result<OwnEvents>) -> subagents::Result<OwnEvents>
            + Send
            + Sync
            + 'static,
    ) {
        *self.inspect_hook.lock().unwrap() = Some(Arc::new(hook));
    }
}

impl SessionPersistence for ProbeStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.create(header, events)
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.append(id, expected_next_seq, events, lease)
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.flush(id)
    }

    fn list(&self) -> BoxFuture<'_, subagents::Result<Vec<ListedSession>>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if let Some(error) = self.list_failure.lock().unwrap().clone() {
            return Box::pin(future::ready(Err(error)));
        }
        if self.hold_list.load(Ordering::SeqCst) {
            self.list_entered.notify_one();
            return Box::pin(future::pending::<subagents::Result<Vec<ListedSession>>>());
        }
        self.inner.list()
    }

    fn list_children(
        &self,
        parent: SessionId,
    ) -> BoxFuture<'_, subagents::Result<Vec<ListedSession>>> {
        self.inner.list_children(parent)
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, subagents::Result<SessionHeader>> {
        self.inner.header(id)
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, subagents::Result<Vec<Arc<SessionEvent>>>> {
        self.inner.read_stored(id, from_seq, before_seq)
    }

    fn acquire_lease(
        &self,
        id: SessionId,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, subagents::Result<Lease>> {
        self.inner.acquire_lease(id, holder)
    }

    fn renew_lease(
        &self,
        id: SessionId,
        epoch: LeaseEpoch,
    ) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.renew_lease(id, epoch)
    }

    fn release_lease(
        &self,
        id: SessionId,
        epoch: LeaseEpoch,
    ) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.release_lease(id, epoch)
    }

    fn cache_get(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, subagents::Result<Option<Value>>> {
        if self.cache_reads_fail.load(Ordering::SeqCst) {
            let error = SubagentError::new(ErrorCode::StoreIo, "injected cache read failure");
            return Box::pin(future::ready(Err(error)));
        }
        self.inner.cache_get(unit, id)
    }

    fn cache_put(
        &self,
        unit: &str,
        id: SessionId,
        row: Value,
        lease: Option<subagents::LeaseEpoch>,
    ) -> BoxFuture<'_, subagents::Result<()>> {
        self.inner.cache_put(unit, id, row, lease)
    }

    fn inspect_own(&self, id: SessionId) -> BoxFuture<'_, subagents::Result<OwnEvents>> {
        self.inspected.lock().unwrap().push(id);
        let hook = self.inspect_hook.lock().unwrap().clone();
        Box::pin(async move {
            let outcome = self.inner.inspect_own(id).await;
            match hook {
                Some(hook) => hook(id, outcome),
                None => outcome,
            }
        })
    }

    fn prepare(
        &self,
        id: SessionId,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, subagents::Result<StoredSession>> {
        self.inner.prepare(id, lease)
    }
}

// ---------------------------------------------------------------------------------------------
// A foreign projection unit that rejects one child.

/// Folds a `poisoned` flag from a descriptor labelled "poison me" and fails its view on that
/// state only: `apply` never fails, so only a listing's read of that one child trips it.
struct HostileProbe {
    /// Panic in the view instead of returning an error.
    panics: bool,
}

impl ProjectionUnit for HostileProbe {
    fn key(&self) -> &str {
        "subagentListHostileProbe"
    }

    fn state_version(&self) -> u32 {
        1
    }

    fn init(&self) -> Value {
        json!({})
    }

    fn apply(&self, _state: &Value, event: &SessionEvent) -> Option<Value> {
        let EventKind::Extension { event_type, data } = &event.kind else {
            return None;
        };
        (event_type == "subagent/descriptor" && data["label"] == "poison me")
            .then(|| json!({"poisoned": true}))
    }

    fn view(&self, state: &Value) -> subagents::Result<Value> {
        if state["poisoned"] != true {
            return Ok(Value::Null);
        }
        if self.panics {
            panic!("the hostile unit panics on the poisoned log");
        }
        Err(SubagentError::new(
            ErrorCode::StoreCorrupt,
            "the hostile unit rejects the poisoned log",
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn model() -> ScriptedModel {
    ScriptedModel::repeating(ScriptStep::text("done"))
}

/// A seam runtime over `store`.
async fn runtime_over(store: SharedStore) -> Runtime {
    seam_runtime_on(Runtime::builder().model("scripted", model()), store).await
}

/// A runtime over a fresh memory store, and the id of a live root parent.
async fn stored_parent() -> (Arc<MemoryStore>, Runtime, SessionId) {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await.agent().id();
    (store, rt, parent)
}

/// A runtime over a fresh probe store, and the id of a live root parent.
async fn probed_parent() -> (Arc<ProbeStore>, Runtime, SessionId) {
    let probe = ProbeStore::new();
    let rt = runtime_over(probe.clone()).await;
    let parent = root(&rt).await.agent().id();
    (probe, rt, parent)
}

/// A seam runtime over `store` that never reads the projection cache.
async fn uncached_runtime_over(store: SharedStore) -> Runtime {
    seam_runtime_on(
        Runtime::builder()
            .model("scripted", model())
            .without_projection_cache(),
        store,
    )
    .await
}

/// The header of a delegated child of `parent`.
fn delegated(id: SessionId, parent: SessionId, created_at: u64) -> SessionHeader {
    SessionHeader {
        created_at,
        parent_session: Some(parent),
        origin: Some(SessionOrigin::Subagent),
        delegation_depth: Some(1),
        ..SessionHeader::new(id)
    }
}

/// The header of an ordinary session (a plain fork) naming `parent`: no subagent origin.
fn ordinary(id: SessionId, parent: SessionId, created_at: u64) -> SessionHeader {
    SessionHeader {
        created_at,
        parent_session: Some(parent),
        ..SessionHeader::new(id)
    }
}

fn descriptor(payload: Value) -> EventKind {
    EventKind::Extension {
        event_type: "subagent/descriptor".into(),
        data: payload,
    }
}

fn continuable(label: &str) -> Value {
    SubagentDescriptor::continuable("spawn", label).to_json()
}

/// One completed turn around `inside`.
fn completed_turn(turn: u64, inside: Vec<EventKind>) -> Vec<EventKind> {
    let mut kinds = vec![EventKind::TurnStart { turn }];
    kinds.extend(inside);
    kinds.push(EventKind::TurnEnd {
        turn,
        reason: TurnEndReason::Completed,
        traceparent: None,
    });
    kinds
}

/// A minimal settled child log: one completed turn holding one descriptor (at seq 1).
fn child_events(payload: Value) -> Vec<EventKind> {
    completed_turn(1, vec![descriptor(payload)])
}

/// A checkpoint record for `header`'s lifecycle holding `rows` (unit key → row).
fn record(header: &SessionHeader, rows: Value) -> Value {
    json!({"identity": {"createdAt": header.created_at, "cwd": header.cwd}, "rows": rows})
}

/// Writes a checkpoint record holding only the identity unit's row for `header`'s lifecycle.
async fn cache_identity(
    store: &dyn SessionPersistence,
    header: &SessionHeader,
    seq: u64,
    val: Value,
) {
    store
        .cache_put(
            CHECKPOINT_RECORD,
            header.id,
            record(
                header,
                json!({IDENTITY_UNIT: {"ver": 2, "seq": seq, "val": val}}),
            ),
            None,
        )
        .await
        .expect("the cache record is written");
}

// A store that writes only values (as a host's own store may) still takes the runtime's
// encoded checkpoint records: the default decodes them. Bytes that are not JSON never reach a
// store: they are refused with `INVALID_PROJECTION` before they are a row.
#[actix_rt::test]
async fn a_store_without_encoded_rows_decodes_them_and_bytes_that_are_not_json_are_no_row() {
    let store = ProbeStore::new();
    let id = SessionId::new();
    let row = EncodedRow::from_json(br#"{"rows": {}}"#.to_vec()).expect("JSON");
    store
        .cache_put_encoded(CHECKPOINT_RECORD, id, row, None)
        .await
        .expect("an encoded row is written");
    assert_eq!(
        store.cache_get(CHECKPOINT_RECORD, id).await.unwrap(),
        Some(json!({"rows": {}}))
    );
    let refused = EncodedRow::from_json(b"{rows".to_vec()).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidProjection);
}

/// Waits until `id` is no longer live.
async fn released(rt: &Runtime, id: SessionId) {
    within("the child's release", async {
        while rt.agents().get(id).await.is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Starts a real continuable child labelled `label`, and waits until it settled and was released.
async fn settled_child(rt: &Runtime, parent: &AgentHandle, label: &str) -> SessionId {
    let recorder = SeamRecorder::new(rt, EventScope::Key(parent.agent().id()));
    let started = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            label,
            parent.agent(),
            text(label),
        ))
        .await
        .expect("the child starts");
    settled(&recorder, started.child_id, 1).await;
    released(rt, started.child_id).await;
    started.child_id
}

/// A live agent delegated by `parent` (no Activation): it appends `descriptor` in its setup, or
/// stays inside its creation window without one.
async fn live_child(
    rt: &Runtime,
    parent: SessionId,
    descriptor: Option<SubagentDescriptor>,
) -> AgentHandle {
    rt.agents()
        .create(CreateAgent::new().delegated_by(parent, 1).setup(
            move |_: &mut AgentScope, log: &SessionLog| {
                if let Some(descriptor) = descriptor {
                    log.append(descriptor.event())?;
                }
                Ok(None)
            },
        ))
        .await
        .expect("the live child is created")
}

async fn children(rt: &Runtime, parent: SessionId) -> Vec<SubagentListEntry> {
    within(
        "the listing",
        rt.subagents()
            .list_children(parent, CancellationToken::new()),
    )
    .await
    .expect("the listing succeeds")
}

async fn descendants(rt: &Runtime, root: SessionId) -> Vec<SubagentDescendantListEntry> {
    within(
        "the descendant listing",
        rt.subagents()
            .list_descendants(root, CancellationToken::new()),
    )
    .await
    .expect("the descendant listing succeeds")
}

fn inactive(id: SessionId, label: &str) -> SubagentListEntry {
    SubagentListEntry::Child {
        id,
        mode: DelegationMode::Continuable,
        label: Some(label.to_owned()),
        activity: SubagentActivity::Inactive,
        has_children: false,
    }
}

fn running(id: SessionId, label: &str) -> SubagentListEntry {
    SubagentListEntry::Child {
        id,
        mode: DelegationMode::Continuable,
        label: Some(label.to_owned()),
        activity: SubagentActivity::Running,
        has_children: false,
    }
}

fn diagnostic(id: SessionId, reason: SubagentDiagnosticReason) -> SubagentListEntry {
    SubagentListEntry::Diagnostic { id, reason }
}

fn at(entry: SubagentListEntry, parent_id: SessionId, depth: u64) -> SubagentDescendantListEntry {
    SubagentDescendantListEntry {
        entry,
        parent_id,
        depth,
    }
}

/// A fork seed holding an ancestor's descriptor (seq 1) and its end marker (seq 3).
fn ancestor_seed() -> Vec<EventKind> {
    let mut seed = child_events(continuable("ancestor label"));
    seed.push(EventKind::EndSeed {});
    seed
}

mod cached;
mod cancellation;
mod children;
mod descendants;
