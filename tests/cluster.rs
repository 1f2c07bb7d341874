//! A cluster of runtimes on one PostgreSQL: continuable children placed on another node than
//! their parent's, asked across nodes (follow-ups in FIFO order, interrupts, reports, the
//! settled notice, child-first releases), and refused to a node that does not hold the parent.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use subagents::cluster::NodeId;
use subagents::store::{LeaseHolder, PostgresConfig, PostgresStore};
use subagents::testing::{
    resident_count, FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation,
};
use subagents::{
    CancelCause, ContinuableStartSpec, ErrorCode, InterruptAuthority, Message, MessageSource,
    ReportDelivery, ReportOptions, Runtime, SessionId,
};

use crate::support::postgres::{holding_session_row, postgres_or_skip, raw_client};
use crate::support::{
    delivered, eventually, followup_child, notices, persisted, root, seam_runtime_on, settled,
    text, turn_ends, within, SeamRecorder,
};

/// A store whose nodes go silent after 2 s (short enough for a test to outlive a node).
pub(crate) async fn cluster_store(url: &str) -> Arc<PostgresStore> {
    let mut config = PostgresConfig::new(url);
    config.node_ttl = Duration::from_secs(2);
    Arc::new(PostgresStore::connect_with(config).await.unwrap())
}

/// A parent's model, and a child's whose first answer holds at the returned gate.
pub(crate) fn held_child_models() -> (ScriptedModel, ScriptedModel, Gate) {
    let model_b = ScriptedModel::repeating(ScriptStep::text("child"));
    let gate = Gate::new();
    model_b.push(ScriptStep::text("held answer").gated(&gate));
    (
        ScriptedModel::repeating(ScriptStep::text("parent")),
        model_b,
        gate,
    )
}

/// A runtime joined to the cluster on `url` as node `name`, running `model`.
pub(crate) async fn node(url: &str, name: &str, model: &ScriptedModel) -> (Runtime, NodeId) {
    node_on(cluster_store(url).await, name, model).await
}

/// A runtime joined to the cluster `store` is on as node `name`, running `model`.
pub(crate) async fn node_on(
    store: Arc<PostgresStore>,
    name: &str,
    model: &ScriptedModel,
) -> (Runtime, NodeId) {
    let holder = LeaseHolder::new();
    let membership = store.join(&holder, name).await.unwrap();
    let id = membership.node();
    let builder = Runtime::builder()
        .model("scripted", model.clone())
        .lease_holder(holder)
        .cluster(membership);
    (seam_runtime_on(builder, store).await, id)
}

/// A runtime joined to the cluster on `url` as node `name`, running `model`, whose store fails
/// or holds operations on demand.
pub(crate) async fn faulty_node(
    url: &str,
    name: &str,
    model: &ScriptedModel,
) -> (Runtime, NodeId, Arc<FaultInjectingStore>) {
    let store = cluster_store(url).await;
    let holder = LeaseHolder::new();
    let membership = store.join(&holder, name).await.unwrap();
    let id = membership.node();
    let faults = Arc::new(FaultInjectingStore::new(store));
    let builder = Runtime::builder()
        .model("scripted", model.clone())
        .lease_holder(holder)
        .cluster(membership);
    (seam_runtime_on(builder, faults.clone()).await, id, faults)
}

/// Starts a `spawn` child of `parent` on the parent's own node; answers its id.
pub(crate) async fn start_here(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    prompt: &str,
) -> SessionId {
    rt.subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "local",
            parent,
            text(prompt),
        ))
        .await
        .unwrap()
        .child_id
}

/// Starts a `spawn` child of `parent` on `node`.
pub(crate) async fn place(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    node: NodeId,
    prompt: &str,
) -> subagents::Result<subagents::ContinuableStart> {
    rt.subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "placed", parent, text(prompt)).on_node(node),
        )
        .await
}

/// Waits until `agent`'s log holds `count` settled notices (they cross from another node).
pub(crate) async fn notices_reach(agent: &subagents::AgentRef, count: usize) -> Vec<String> {
    eventually("the settled notices", || notices(agent).len() >= count).await;
    notices(agent)
}

/// Records `parent`'s children's lifecycle on the node `rt` they run on.
fn lifecycle(rt: &Runtime, parent: &subagents::AgentHandle) -> SeamRecorder {
    SeamRecorder::new(rt, subagents::EventScope::Key(parent.agent().id()))
}

/// Two nodes on a fresh database, a root on the first, and its child placed on the second,
/// holding its first turn at `gate`.
pub(crate) struct Placed {
    pub(crate) url: String,
    pub(crate) a: Runtime,
    pub(crate) a_id: NodeId,
    pub(crate) b: Runtime,
    pub(crate) b_id: NodeId,
    pub(crate) parent: subagents::AgentHandle,
    pub(crate) started: subagents::ContinuableStart,
    pub(crate) gate: Gate,
    /// The first node's model (the parent's, and a child's resumed there).
    pub(crate) model_a: ScriptedModel,
}

pub(crate) async fn placed(prompt: &str) -> Option<Placed> {
    let url = postgres_or_skip!(None).fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, a_id) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    let started = place(&a, parent.agent(), b_id, prompt).await.unwrap();
    gate.reached().await;
    Some(Placed {
        url,
        a,
        a_id,
        b,
        b_id,
        parent,
        started,
        gate,
        model_a,
    })
}

#[actix_rt::test]
async fn a_child_placed_on_another_node_runs_there_and_takes_its_parents_followups_in_order() {
    let Some(Placed {
        a,
        b,
        parent,
        started,
        gate,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let on_b = lifecycle(&b, &parent);
    // Resident on B alone: its agent and Activation live there, the parent's node has none.
    assert_eq!(resident_count(b.subagents()).await, 1);
    assert_eq!(resident_count(a.subagents()).await, 0);
    assert!(b.agents().get(started.child_id).await.is_some());
    assert!(a.agents().get(started.child_id).await.is_none());
    // Follow-ups from the parent's node cross while the first turn holds, in FIFO order.
    let second = followup_child(&a, parent.agent(), started.child_id, "second")
        .await
        .unwrap();
    let third = followup_child(&a, parent.agent(), started.child_id, "third")
        .await
        .unwrap();
    assert_ne!(second, third);
    gate.release();
    settled(&on_b, started.child_id, 1).await;
    let seen = notices_reach(parent.agent(), 1).await;
    assert_eq!(seen.len(), 1, "one settled notice: {seen:?}");
    let events = persisted(&a, started.child_id).await;
    assert_eq!(delivered(&events), ["first", "second", "third"]);
    let header = a.store().unwrap().header(started.child_id).await.unwrap();
    assert_eq!(header.parent_session, Some(parent.agent().id()));
    // Listed durably from the parent's node.
    let children = a
        .subagents()
        .list_children(parent.agent().id(), Default::default())
        .await
        .unwrap();
    assert_eq!(children.len(), 1);
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn an_interrupt_crosses_to_the_childs_node_and_its_report_comes_back() {
    let Some(Placed {
        a,
        b,
        parent,
        started,
        gate,
        ..
    }) = placed("work").await
    else {
        return;
    };
    // The child reports from its node; the report lands in the parent's log on the other.
    let child = b.agents().get(started.child_id).await.unwrap();
    let report = b
        .subagents()
        .report_from(
            &child,
            text("halfway"),
            ReportOptions::new(ReportDelivery::Wakeup),
        )
        .await
        .unwrap();
    eventually("the report", || {
        parent.agent().log().events().iter().any(|event| {
            matches!(&event.kind, subagents::EventKind::UserMessage(message) if message.id == report)
        })
    })
    .await;
    // A wrong parent is refused on the parent's node; the right one interrupts across.
    let wrong = a
        .subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: SessionId::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), ErrorCode::Unauthorized);
    a.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .unwrap();
    gate.release();
    notices_reach(parent.agent(), 1).await;
    let events = persisted(&b, started.child_id).await;
    assert_eq!(
        turn_ends(&events),
        [subagents::TurnEndReason::Aborted {
            reason: CancelCause::User
        }]
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// Two nodes on a fresh database, a root on the first, and its child placed on the second,
/// in its first turn (held at `gate`) while its creation is held: live on `b`, not stored.
struct UnstoredChild {
    a: Runtime,
    a_id: NodeId,
    b: Runtime,
    faults: Arc<FaultInjectingStore>,
    parent: subagents::AgentHandle,
    child: subagents::AgentRef,
    placing: actix_rt::task::JoinHandle<subagents::Result<subagents::ContinuableStart>>,
    gate: Gate,
}

async fn unstored_child() -> Option<UnstoredChild> {
    let url = postgres_or_skip!(None).fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, a_id) = node(&url, "a", &model_a).await;
    let (b, b_id, faults) = faulty_node(&url, "b", &model_b).await;
    // The child's session is not stored until this hold is released.
    faults.hold(StoreOperation::Create);
    let parent = root(&a).await;
    let placing = {
        let (a, parent) = (a.clone(), parent.agent().clone());
        actix_rt::spawn(async move { place(&a, &parent, b_id, "work").await })
    };
    gate.reached().await;
    faults.held_calls(1).await;
    // Not stored yet, so not listed: the one live agent on b is the child.
    let child = b
        .agents()
        .list()
        .await
        .into_iter()
        .next()
        .expect("the child is live on b");
    Some(UnstoredChild {
        a,
        a_id,
        b,
        faults,
        parent,
        child,
        placing,
        gate,
    })
}

impl UnstoredChild {
    /// Runs `ask` on `b` while the child's creation is held: it must not be answered then (sent,
    /// it was refused at once; the wait is the behaviour under test, and nothing announces a
    /// delivery that is not made). Then releases the hold and answers what `ask` answered.
    async fn ask_while_unstored<T: std::fmt::Debug + 'static>(
        &self,
        ask: impl std::future::Future<Output = T> + 'static,
    ) -> T {
        let mut asking = actix_rt::spawn(ask);
        let early = tokio::time::timeout(Duration::from_secs(2), &mut asking).await;
        assert!(
            early.is_err(),
            "answered before the child was stored: {early:?}"
        );
        self.faults.release(StoreOperation::Create);
        within("the ask", asking).await.unwrap()
    }

    /// The placement is answered with the child, and once its first turn goes on (released
    /// here if it was not), its settled notice crosses to its parent.
    async fn settle(self) {
        let started = within("the placement", self.placing)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(started.child_id, self.child.id());
        self.gate.release();
        notices_reach(self.parent.agent(), 1).await;
        self.b.shutdown().await.unwrap();
        self.a.shutdown().await.unwrap();
    }
}

// A continuable child's creation is written behind its prompt's acceptance, and its first turn
// runs meanwhile. A report from that turn to a parent on another node is taken there only for
// a child the store says is that parent's: sent before the child was stored, it was refused
// (`UNAUTHORIZED`, one run of `load --nodes 2` in about twelve). It now leaves once the child's
// session is stored.
#[actix_rt::test]
async fn a_report_from_a_child_not_yet_stored_waits_for_its_session_and_lands() {
    let Some(unstored) = unstored_child().await else {
        return;
    };
    let (b, child) = (unstored.b.clone(), unstored.child.clone());
    let report = unstored
        .ask_while_unstored(async move {
            b.subagents()
                .report_from(
                    &child,
                    text("halfway"),
                    ReportOptions::new(ReportDelivery::Wakeup),
                )
                .await
        })
        .await
        .unwrap();
    let parent = unstored.parent.agent().clone();
    eventually("the report", || {
        parent.log().events().iter().any(|event| {
            matches!(&event.kind, subagents::EventKind::UserMessage(message) if message.id == report)
        })
    })
    .await;
    unstored.settle().await;
}

// The same from the child's first turn as a parent: a start on another node is taken there only
// from the node holding the parent's lease, which the child takes when its creation is written.
// Asked before, it was refused (`UNAUTHORIZED`); it now leaves once the child is stored.
#[actix_rt::test]
async fn a_start_from_a_child_not_yet_stored_waits_for_its_session_and_lands() {
    let Some(unstored) = unstored_child().await else {
        return;
    };
    let (b, child, a_id) = (unstored.b.clone(), unstored.child.clone(), unstored.a_id);
    let grandchild = unstored
        .ask_while_unstored(async move { place(&b, &child, a_id, "deeper").await })
        .await
        .unwrap();
    // The grandchild ran on the first node, for its parent on the second: its settled notice
    // crossed back (the child hears it once its first turn goes on).
    unstored.gate.release();
    let settled = notices_reach(&unstored.child, 1).await;
    assert!(
        settled[0].contains(&grandchild.child_id.to_string()),
        "{settled:?}"
    );
    unstored.settle().await;
}

// An ancestor interrupts a grandchild it has no record of: its child, on another node, started
// it there. The grandchild is found by its lease and interrupted on its node, for the ancestor
// session the asking node holds.
#[actix_rt::test]
async fn an_ancestor_interrupts_a_grandchild_its_child_started_on_another_node() {
    let url = postgres_or_skip!().fresh_database();
    let model_a = ScriptedModel::repeating(ScriptStep::text("root"));
    let model_b = ScriptedModel::repeating(ScriptStep::text("below"));
    let (child_gate, grandchild_gate) = (Gate::new(), Gate::new());
    model_b.push(ScriptStep::text("child holds").gated(&child_gate));
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let root_agent = root(&a).await;
    let child = place(&a, root_agent.agent(), b_id, "delegate")
        .await
        .unwrap();
    child_gate.reached().await;
    let child = b.agents().get(child.child_id).await.unwrap();
    model_b.push(ScriptStep::text("grandchild holds").gated(&grandchild_gate));
    let grandchild = b
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "grandchild",
            &child,
            text("deep work"),
        ))
        .await
        .unwrap()
        .child_id;
    grandchild_gate.reached().await;
    // A stranger is still refused; the root, two levels up, interrupts across.
    let stranger = root(&a).await;
    let refused = a
        .subagents()
        .interrupt(
            grandchild,
            InterruptAuthority::Ancestor(stranger.agent().clone()),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Unauthorized);
    a.subagents()
        .interrupt(
            grandchild,
            InterruptAuthority::Ancestor(root_agent.agent().clone()),
        )
        .await
        .unwrap();
    grandchild_gate.release();
    let resident = b.agents().get(grandchild).await.unwrap();
    eventually("the grandchild's turn ends", || {
        !turn_ends(&resident.log().events()).is_empty()
    })
    .await;
    assert_eq!(
        turn_ends(&resident.log().events()),
        [subagents::TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
    child_gate.release();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn draining_a_parent_releases_its_child_on_the_other_node_first() {
    let Some(Placed {
        a,
        b,
        parent,
        started,
        ..
    }) = placed("work").await
    else {
        return;
    };
    a.subagents()
        .drain_continuable_descendants(&[parent.agent().clone()])
        .await
        .unwrap();
    // Released before the drain answered: nothing resident on the child's node.
    assert_eq!(resident_count(b.subagents()).await, 0);
    assert!(b.agents().get(started.child_id).await.is_none());
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn a_child_whose_node_left_is_resumed_on_its_parents_node() {
    let Some(Placed {
        a,
        b,
        parent,
        started,
        ..
    }) = placed("first").await
    else {
        return;
    };
    // B leaves: its child is released there, and its notice reaches the parent.
    b.shutdown().await.unwrap();
    notices_reach(parent.agent(), 1).await;
    // The next follow-up finds no record and no holder: the child resumes here.
    followup_child(&a, parent.agent(), started.child_id, "second")
        .await
        .unwrap();
    assert!(a.agents().get(started.child_id).await.is_some());
    notices_reach(parent.agent(), 2).await;
    let events = persisted(&a, started.child_id).await;
    assert_eq!(delivered(&events), ["first", "second"]);
    a.shutdown().await.unwrap();
}

// A node that holds neither the parent nor the child cannot act for them: not a follow-up, not
// a notice for the child, not a notice for a child that never existed.
#[actix_rt::test]
async fn a_node_that_does_not_hold_the_parent_cannot_act_for_it() {
    let Some(Placed {
        url,
        a,
        a_id,
        b,
        b_id,
        parent,
        started,
        gate,
        ..
    }) = placed("work").await
    else {
        return;
    };
    // A third node claims to be the parent: the child's node checks who holds the parent.
    let stranger = cluster_store(&url)
        .await
        .join(&LeaseHolder::new(), "stranger")
        .await
        .unwrap();
    let message = Message::user(text("not yours"), MessageSource::User);
    let refused = stranger
        .deliver(
            b_id,
            started.child_id,
            &json!({
                "op": "followup",
                "parent": parent.agent().id(),
                "child": started.child_id,
                "message": message,
                "raise": null,
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Unauthorized);
    // Nor can it speak for the child: a settled notice from a node that does not hold it.
    let notice = Message::user(text("settled, supposedly"), MessageSource::User);
    let forged = stranger
        .deliver(
            a_id,
            started.child_id,
            &json!({
                "op": "notify",
                "parent": parent.agent().id(),
                "child": started.child_id,
                "message": notice,
                "kind": "settled",
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(forged.code(), ErrorCode::Unauthorized);
    // Nor for a child nobody holds because it never existed: a made-up id is no one's child.
    let made_up = SessionId::new();
    let invented = stranger
        .deliver(
            a_id,
            made_up,
            &json!({
                "op": "notify",
                "parent": parent.agent().id(),
                "child": made_up,
                "message": Message::user(text("settled, invented"), MessageSource::User),
                "kind": "settled",
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(invented.code(), ErrorCode::Unauthorized, "{invented}");
    assert!(notices(parent.agent()).is_empty());
    gate.release();
    notices_reach(parent.agent(), 1).await;
    let events = persisted(&b, started.child_id).await;
    assert_eq!(delivered(&events), ["work"]);
    stranger.leave().await.unwrap();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A fork placed on another node inherits its parent's completed turns there: the parent's node
// flushes the prefix and sends only a reference; the child's node reads the prefix from the
// shared store, its model sees the parent's turns, and the child's stored seed is a reference
// again. A cold resume on the parent's node resolves it the same way.
#[actix_rt::test]
async fn a_fork_placed_on_another_node_inherits_its_parents_turns_by_reference() {
    let url = postgres_or_skip!().fresh_database();
    let model_a = ScriptedModel::repeating(ScriptStep::text("on a"));
    let model_b = ScriptedModel::repeating(ScriptStep::text("on b"));
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    parent
        .agent()
        .followup(text("hello"), MessageSource::User)
        .await
        .unwrap();
    parent.agent().when_idle().await;
    let (on_a, on_b) = (lifecycle(&a, &parent), lifecycle(&b, &parent));
    let started = a
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("fork", "forked", parent.agent(), text("go")).on_node(b_id),
        )
        .await
        .expect("a fork is placed on another node");
    let child = started.child_id;
    settled(&on_b, child, 1).await;
    notices_reach(parent.agent(), 1).await;
    let seen_on_b = model_b.requests();
    assert_eq!(seen_on_b.len(), 1, "the fork's turn ran on b");
    assert_eq!(
        seen_on_b[0].messages[0].text(),
        "hello",
        "with the parent's turn"
    );

    let store = a.store().unwrap();
    let reference = *store
        .header(child)
        .await
        .unwrap()
        .seed_reference
        .expect("the placed fork's seed is stored by reference");
    assert_eq!(reference.session, parent.agent().id());
    let own = store.read_stored(child, 0, u64::MAX).await.unwrap();
    assert_eq!(own.first().map(|event| event.seq), Some(reference.length));
    let n = usize::try_from(reference.length).unwrap();
    let parents = persisted(&a, parent.agent().id()).await;
    assert_eq!(persisted(&a, child).await[..n], parents[..n]);

    followup_child(&a, parent.agent(), child, "again")
        .await
        .unwrap();
    settled(&on_a, child, 1).await;
    let resumed: Vec<_> = model_a
        .requests()
        .into_iter()
        .filter(|request| request.session_id == Some(child))
        .collect();
    assert_eq!(resumed.len(), 1, "the fork was resumed on a");
    assert_eq!(resumed[0].messages[0].text(), "hello");
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A placement names what is wrong with the node before anything is sent (it spoke of a
// delivery whose node stopped before).
#[actix_rt::test]
async fn a_placement_on_an_unknown_or_departed_node_says_so() {
    let url = postgres_or_skip!().fresh_database();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (a, _) = node(&url, "a", &model).await;
    let (b, b_id) = node(&url, "b", &model).await;
    let parent = root(&a).await;
    let unknown = uuid::Uuid::new_v4();
    for (target, stopped) in [(unknown, false), (b_id, true)] {
        if stopped {
            b.shutdown().await.unwrap();
        }
        let error = place(&a, parent.agent(), target, "go").await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::SessionLeased, "{error}");
        assert!(
            error
                .message()
                .contains(&format!("placed on node {target}"))
                && error.message().contains("not a member of this cluster"),
            "{error}"
        );
    }
    assert!(notices(parent.agent()).is_empty(), "no child was recorded");
    a.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn a_placement_outside_a_cluster_is_refused() {
    let url = postgres_or_skip!().fresh_database();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (a, _) = node(&url, "a", &model).await;
    let (b, b_id) = node(&url, "b", &model).await;
    let lone = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        Arc::new(subagents::MemoryStore::new()),
    )
    .await;
    let lone_parent = root(&lone).await;
    let outside = place(&lone, lone_parent.agent(), b_id, "go")
        .await
        .unwrap_err();
    assert_eq!(outside.code(), ErrorCode::InvalidArgs);
    assert_eq!(resident_count(b.subagents()).await, 0);
    lone.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// Starts a continuable child of the root `parent` here, whose first turn holds at `gate`; the
/// child's agent once its turn reached the gate.
async fn held_child(
    rt: &Runtime,
    parent: &subagents::AgentHandle,
    model: &ScriptedModel,
    gate: &Gate,
) -> subagents::AgentRef {
    model.push(ScriptStep::text("middle holds").gated(gate));
    let started = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "middle",
            parent.agent(),
            text("coordinate"),
        ))
        .await
        .unwrap();
    gate.reached().await;
    rt.agents().get(started.child_id).await.unwrap()
}

#[actix_rt::test]
async fn a_continuable_parent_waits_for_its_child_on_another_node_and_hears_its_notice() {
    let url = postgres_or_skip!().fresh_database();
    let model_a = ScriptedModel::repeating(ScriptStep::text("parent"));
    let model_b = ScriptedModel::repeating(ScriptStep::text("leaf"));
    let (middle_gate, leaf_gate) = (Gate::new(), Gate::new());
    model_b.push(ScriptStep::text("leaf holds").gated(&leaf_gate));
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let root = root(&a).await;
    let middle = held_child(&a, &root, &model_a, &middle_gate).await;
    // The middle child (an Activation here) places its own child on B.
    let leaf = place(&a, &middle, b_id, "leaf work").await.unwrap();
    leaf_gate.reached().await;
    middle_gate.release();
    middle.when_idle().await;
    // Its turn is over, but it owns a child resident on B: it waits, resident.
    assert_eq!(resident_count(a.subagents()).await, 1);
    assert!(notices(root.agent()).is_empty());
    leaf_gate.release();
    // The leaf's notice wakes the middle child, which then settles and notifies the root.
    notices_reach(root.agent(), 1).await;
    let middle_log = persisted(&a, middle.id()).await;
    let heard: Vec<String> = delivered(&middle_log);
    assert_eq!(
        heard.len(),
        2,
        "its prompt and the leaf's notice: {heard:?}"
    );
    assert!(heard[1].contains(&leaf.child_id.to_string()), "{heard:?}");
    assert_eq!(resident_count(a.subagents()).await, 0);
    assert_eq!(resident_count(b.subagents()).await, 0);
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn releasing_a_parent_releases_its_child_on_the_other_node_first() {
    let url = postgres_or_skip!().fresh_database();
    let model_a = ScriptedModel::repeating(ScriptStep::text("parent"));
    let model_b = ScriptedModel::repeating(ScriptStep::text("leaf"));
    let (middle_gate, leaf_gate) = (Gate::new(), Gate::new());
    model_b.push(ScriptStep::text("leaf holds").gated(&leaf_gate));
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    // Every epoch's end on either node, in the order they happened.
    let ends = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _subscriptions: Vec<_> = [&a, &b]
        .into_iter()
        .map(|rt| {
            let ends = Arc::clone(&ends);
            rt.subagents().events().subscribe(
                subagents::EventScope::All,
                move |event: &subagents::SubagentEvent| {
                    if let subagents::SubagentEvent::End(end) = event {
                        ends.lock().unwrap().push(end.info.id);
                    }
                },
            )
        })
        .collect();
    let root = root(&a).await;
    let middle = held_child(&a, &root, &model_a, &middle_gate).await;
    let leaf = place(&a, &middle, b_id, "leaf work").await.unwrap();
    leaf_gate.reached().await;
    middle_gate.release();
    middle.when_idle().await;
    // Draining the root's descendants releases the middle child, and before it the leaf on B.
    a.subagents()
        .drain_continuable_descendants(&[root.agent().clone()])
        .await
        .unwrap();
    assert_eq!(resident_count(a.subagents()).await, 0);
    assert_eq!(resident_count(b.subagents()).await, 0);
    assert_eq!(
        *ends.lock().unwrap(),
        [leaf.child_id, middle.id()],
        "child first, across nodes"
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A cluster node's runtime dropped without `shutdown` stops heartbeating: its peers see it
/// expire as a dead node (before, the delivery server kept the membership, and so the
/// heartbeat, alive for as long as the process ran).
#[actix_rt::test]
async fn a_node_runtime_dropped_without_shutdown_goes_silent_and_expires() {
    let url = postgres_or_skip!().fresh_database();
    let model = ScriptedModel::repeating(ScriptStep::text("idle"));
    let (a, a_id) = node(&url, "a", &model).await;
    let observer = cluster_store(&url)
        .await
        .join(&LeaseHolder::new(), "observer")
        .await
        .unwrap();
    let live = observer.live_among(&[a_id]).await.unwrap();
    assert_eq!(
        live.iter().map(|live| live.node).collect::<Vec<_>>(),
        vec![a_id]
    );
    drop(a);
    // A bounded poll of the row's expiry, which nothing announces: a heartbeating node renews
    // its row every third of its 2 s time-to-live, so it would still be live at the deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while !observer.live_among(&[a_id]).await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped node's row is still renewed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The texts of the messages `events` insert into an inbox.
pub(crate) fn inserted<E: std::borrow::Borrow<subagents::SessionEvent>>(
    events: &[E],
) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.borrow().kind {
            subagents::EventKind::InboxSpliced { inserted, .. } => Some(inserted.clone()),
            _ => None,
        })
        .flatten()
        .map(|message| message.text())
        .collect()
}

// A follow-up is answered once stored wherever its child is resident: in a cluster, one
// accepted on the caller's own node waits for the store as one accepted on another node does.
// Before, it was answered at acceptance, and a driving node killed right after answering lost
// follow-ups to the children it had cold-resumed (the fault campaign's seed 9022).
#[actix_rt::test]
async fn in_a_cluster_a_followup_to_a_child_on_the_callers_own_node_is_answered_once_stored() {
    let url = postgres_or_skip!().fresh_database();
    let (_, model, gate) = held_child_models();
    let (a, _) = node(&url, "a", &model).await;
    let parent = root(&a).await;
    let child = start_here(&a, parent.agent(), "first").await;
    gate.reached().await;
    // Another connection holds the child's session row: its next append waits for it.
    let holder = holding_session_row(&url, child).await;
    let sent = tokio::spawn(a.subagents().followup(
        parent.agent(),
        child,
        text("second"),
        subagents::FollowupOptions::new(MessageSource::User),
    ));
    let resident = a.agents().get(child).await.unwrap();
    eventually("the follow-up is accepted", || {
        inserted(&resident.log().events()).contains(&"second".to_owned())
    })
    .await;
    // Bounded poll of the server (nothing announces a blocked statement): the append waits.
    within("the child's append to wait for the row", async {
        while count(
            &url,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
        )
        .await
            == 0
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        !sent.is_finished(),
        "answered while the accepted follow-up is not in the store"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    sent.await.unwrap().unwrap();
    assert!(
        inserted(&persisted(&a, child).await).contains(&"second".to_owned()),
        "the answered follow-up is in the store"
    );
    gate.release();
    a.shutdown().await.unwrap();
}

/// Runs `sql` on the cluster's database.
pub(crate) async fn sql(url: &str, statements: &str) {
    let client = raw_client(url).await;
    client.batch_execute(statements).await.unwrap();
}

/// The count `query` answers on the cluster's database.
pub(crate) async fn count(url: &str, query: &str) -> i64 {
    let client = raw_client(url).await;
    client.query_one(query, &[]).await.unwrap().get(0)
}
