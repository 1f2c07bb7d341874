//! A cluster of runtimes under faults: an answer that came too late asked again under its id,
//! late notices from nodes declared dead or left behind, notices for parents no node has live,
//! nodes that died before answering or were restarted under their id, graceful hand-overs, and
//! drains that discard what a child left behind.

use std::sync::Arc;
use std::time::Duration;

use subagents::cluster::NodeId;
use subagents::store::{LeaseHolder, PostgresConfig, PostgresStore, SessionPersistence};
use subagents::testing::{resident_count, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    ErrorCode, FollowupOptions, MessageSource, ReportDelivery, ReportOptions, ResumeAgent, Runtime,
    SessionId,
};

use crate::cluster::{
    cluster_store, count, faulty_node, held_child_models, inserted, node, node_on, notices_reach,
    place, placed, sql, start_here, Placed,
};
use crate::support::postgres::{postgres_or_skip, raw_client};
use crate::support::{
    delivered, eventually, followup_child, notices, persisted, root, seam_runtime_on, text,
    turn_ends, within,
};

/// A store whose node waits a second for each answer of another node (and goes silent after
/// 2 s).
async fn impatient_store(url: &str) -> Arc<PostgresStore> {
    let mut config = PostgresConfig::new(url);
    config.node_ttl = Duration::from_secs(2);
    config.delivery_deadline = Duration::from_secs(1);
    Arc::new(PostgresStore::connect_with(config).await.unwrap())
}

/// A new process for node `id` (the one before it died), joining under that id as `name`, its
/// model answering `answer`.
async fn restarted_as(url: &str, id: NodeId, name: &str, answer: &str) -> Runtime {
    let store = cluster_store(url).await;
    let holder = LeaseHolder::with_id(id);
    let membership = within("the restart", store.join(&holder, name))
        .await
        .unwrap();
    let builder = Runtime::builder()
        .model(
            "scripted",
            ScriptedModel::repeating(ScriptStep::text(answer)),
        )
        .lease_holder(holder)
        .cluster(membership);
    seam_runtime_on(builder, store).await
}

/// Makes the next flush on the cluster's database take a second and a half (a node making what
/// it accepted durable before it answers).
async fn delay_the_next_flush(url: &str) {
    sql(
        url,
        "CREATE TABLE delayed (n integer);
         CREATE FUNCTION delay_a_flush() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NOT EXISTS (SELECT 1 FROM delayed) THEN
                 INSERT INTO delayed VALUES (1);
                 PERFORM pg_sleep(1.5);
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER delay_a_flush BEFORE INSERT ON subagents_flushes
             FOR EACH ROW EXECUTE FUNCTION delay_a_flush();",
    )
    .await;
}

/// How many times `events` insert message `id` into an inbox.
fn times_inserted<E: std::borrow::Borrow<subagents::SessionEvent>>(
    events: &[E],
    id: subagents::MessageId,
) -> usize {
    events
        .iter()
        .filter(|event| {
            matches!(&event.borrow().kind, subagents::EventKind::InboxSpliced { inserted, .. }
                if inserted.iter().any(|message| message.id == id))
        })
        .count()
}

/// Waits (bounded) until `query` counts at least one row: a row another process writes.
async fn counted(what: &str, url: &str, query: &str) {
    within(what, async {
        while count(url, query).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

// A node declared dead while its process runs on (paused past its time-to-live, say) is a
// zombie: the parent's node accounted its child's epoch as ended with it (`node-stopped`), so
// the notice the zombie sends when that epoch settles there after all is the epoch's second,
// and it is refused: the parent hears one notice of the epoch. Before, a settled notice from
// any node was taken once no node held the child, and the parent heard the epoch end twice.
#[actix_rt::test]
async fn a_late_notice_from_a_node_declared_dead_is_not_heard_twice() {
    let Some(Placed {
        url,
        a,
        b,
        b_id,
        parent,
        started,
        gate,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let child = started.child_id;
    // B's row expires while its process runs on: A's sweep accounts the epoch.
    sql(
        &url,
        &format!("UPDATE subagents_nodes SET expires_at = now() - interval '1 second' WHERE node = '{b_id}'"),
    )
    .await;
    let heard = notices_reach(parent.agent(), 1).await;
    assert!(heard[0].contains("node-stopped"), "{heard:?}");
    // The zombie's turn ends there, its child settles, and its settled notice is sent and
    // answered.
    gate.release();
    let answered = format!(
        "SELECT count(*) FROM subagents_deliveries WHERE sender = '{b_id}'
         AND state = 'answered' AND convert_from(payload, 'UTF8') LIKE '%\"op\":\"notify\"%'"
    );
    counted("the zombie's notice answered", &url, &answered).await;
    assert_eq!(
        notices(parent.agent()).len(),
        1,
        "one notice of {child}'s epoch"
    );
    b.shutdown().await.ok();
    a.shutdown().await.unwrap();
}

// Conversely, a child's former node that settled it is still heard after the parent's node
// resumed the child: the child settles on B, its settled notice is held up on its way, and a
// follow-up resumes the child on A meanwhile (B answers that it is not resident there). The
// notice then arrives from a node that no longer holds the child, and it is the epoch before's:
// the parent hears it, and the resumed epoch's own. Before, it was refused (the child was
// resident here, leased by another node than its sender), and B's epoch went unheard.
#[actix_rt::test]
async fn a_former_nodes_late_notice_is_heard_after_the_child_was_resumed_elsewhere() {
    let Some(Placed {
        url,
        a,
        b,
        parent,
        started,
        gate,
        model_a,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let child = started.child_id;
    // The resumed epoch holds its turn until the late notice was heard.
    let resumed_turn = Gate::new();
    model_a.push(ScriptStep::text("resumed answer").gated(&resumed_turn));
    // Settled notices are held up in the database until released.
    sql(
        &url,
        "CREATE FUNCTION hold_notices() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF convert_from(NEW.payload, 'UTF8') LIKE '%\"op\":\"notify\"%' THEN
                 NEW.state := 'held';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER hold_notices BEFORE INSERT ON subagents_deliveries
             FOR EACH ROW EXECUTE FUNCTION hold_notices();",
    )
    .await;
    gate.release();
    let held = "SELECT count(*) FROM subagents_deliveries WHERE state = 'held'";
    counted("the held notice", &url, held).await;
    followup_child(&a, parent.agent(), child, "second")
        .await
        .unwrap();
    assert!(
        a.agents().get(child).await.is_some(),
        "resumed on the parent's node"
    );
    sql(
        &url,
        "DROP TRIGGER hold_notices ON subagents_deliveries;
         UPDATE subagents_deliveries SET state = 'pending' WHERE state = 'held';",
    )
    .await;
    resumed_turn.reached().await;
    let heard = notices_reach(parent.agent(), 1).await;
    assert!(
        heard[0].contains("held answer"),
        "B's epoch was heard of: {heard:?}"
    );
    resumed_turn.release();
    let heard = notices_reach(parent.agent(), 2).await;
    assert!(heard[1].contains("resumed answer"), "{heard:?}");
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A follow-up its child's node took and answered only after the delivery deadline may have
// been accepted there: the parent's node asks again under the message's id, the child's node
// serves that ask after the first (one session's deliveries in order) and answers it with the
// first acceptance, and the child runs the follow-up once. Before, the caller heard
// NODE_UNRESPONSIVE ("it may have been served") and could only guess.
#[actix_rt::test]
async fn a_followup_answered_after_the_deadline_is_asked_again_and_accepted_once() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    // The parent's node waits a second for each answer.
    let store_a = impatient_store(&url).await;
    let (a, _) = node_on(store_a, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    let child = place(&a, parent.agent(), b_id, "first")
        .await
        .unwrap()
        .child_id;
    gate.reached().await;
    // The next flush (the child's node making the follow-up durable before it answers) takes
    // a second and a half.
    delay_the_next_flush(&url).await;
    let accepted = within(
        "the follow-up",
        a.subagents().followup(
            parent.agent(),
            child,
            text("second"),
            FollowupOptions::new(MessageSource::User),
        ),
    )
    .await
    .expect("accepted, though answered late");
    let asked = count(
        &url,
        "SELECT count(*) FROM subagents_deliveries
         WHERE convert_from(payload, 'UTF8') LIKE '%\"op\":\"followup\"%'",
    )
    .await;
    assert!(asked >= 2, "asked again: {asked}");
    gate.release();
    let on_b = b.agents().get(child).await.unwrap();
    eventually("the follow-up's turn", || {
        delivered(&on_b.log().events()).contains(&"second".to_owned())
    })
    .await;
    assert_eq!(
        times_inserted(&on_b.log().events(), accepted),
        1,
        "accepted once"
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A start its child's node took and answered only after the parent's node stopped waiting may
// have created the child there: the parent's node asks again under the child's id, the child's
// node answers with the first start, and the child runs its prompt once and stays its
// parent's (a drain releases it). Before, the caller heard NODE_UNRESPONSIVE, the parent
// forgot the child, and the child ran on with no parent to release it.
#[actix_rt::test]
async fn a_start_answered_after_the_deadline_is_asked_again_and_the_child_stays_owned() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    // The parent's node waits a second for each answer.
    let store_a = impatient_store(&url).await;
    let (a, _) = node_on(store_a, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    // The child's node makes the child durable before it answers: that flush takes a second
    // and a half.
    delay_the_next_flush(&url).await;
    let started = within("the start", place(&a, parent.agent(), b_id, "work"))
        .await
        .expect("started, though answered late");
    let asked = count(
        &url,
        "SELECT count(*) FROM subagents_deliveries
         WHERE convert_from(payload, 'UTF8') LIKE '%\"op\":\"start\"%'",
    )
    .await;
    assert!(asked >= 2, "asked again: {asked}");
    gate.reached().await;
    let on_b = b.agents().get(started.child_id).await.unwrap();
    assert_eq!(
        times_inserted(&on_b.log().events(), started.message_id),
        1,
        "its prompt, accepted once"
    );
    within(
        "the drain",
        a.subagents()
            .drain_continuable_descendants(std::slice::from_ref(parent.agent())),
    )
    .await
    .unwrap();
    assert_eq!(
        resident_count(b.subagents()).await,
        0,
        "released by its parent's drain"
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A child settles while its parent's node is dead and no node holds the parent: the child's
// node puts the settled notice into the parent session's stored inbox, as a local parent's
// would be, and the parent hears it once with its first turn after it is resumed (here on a
// third node). Before,
// the notice was given up ("the child's session is the record") and the resumed parent never
// heard that its child's epoch ended.
#[actix_rt::test]
async fn a_notice_for_a_parent_whose_node_died_waits_in_its_stored_inbox() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    let parent_id = parent.agent().id();
    let child = place(&a, parent.agent(), b_id, "work")
        .await
        .unwrap()
        .child_id;
    gate.reached().await;
    // The parent's node dies: it stops heartbeating and serving (its actors linger, as a dead
    // process's would not, but they hold nothing once its row expired).
    drop(a);
    gate.release();
    let store = cluster_store(&url).await;
    within("the notice in the parent's stored inbox", async {
        loop {
            let events = store.read_from(parent_id, 0).await.unwrap();
            let stored = events.iter().any(|event| {
                matches!(&event.kind, subagents::EventKind::InboxSpliced { inserted, .. }
                    if inserted.iter().any(|message| matches!(message.source,
                        MessageSource::SubagentSettledNotice { sender_session_id, .. }
                            if sender_session_id == child)))
            });
            if stored {
                break;
            }
            // Nothing here announces another node's write: a bounded poll of the store.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (c, _) = node(&url, "c", &model_a).await;
    let resumed = c
        .agents()
        .resume(subagents::ResumeAgent::new(parent_id))
        .await
        .unwrap();
    assert_eq!(
        resumed.agent().status().await.unwrap().next_turn,
        1,
        "the notice waits in the resumed parent's inbox"
    );
    resumed
        .agent()
        .followup(text("what happened?"), MessageSource::User)
        .await
        .unwrap();
    resumed.agent().when_idle().await;
    let heard = notices(resumed.agent());
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert!(heard[0].contains(&child.to_string()), "{heard:?}");
    drop(parent);
    b.shutdown().await.unwrap();
    c.shutdown().await.unwrap();
}

// A parent's node that was restarted has no record of the children its predecessor placed
// (here: its runtime dropped, the parent resumed on another node): a drain of the parent finds
// them by their leases and releases them on their nodes. Before, the child stayed resident
// there; in the campaign (a driver killed while it drained, seeds 15007, 15010 and 15017 with
// CAMPAIGN_KILL_DURING_DRAIN) a child whose queue an interrupt had parked waited with its
// accepted follow-ups forever, its parent's admission closed.
#[actix_rt::test]
async fn a_drain_releases_a_child_placed_by_the_parents_node_before_it_restarted() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    let parent_id = parent.agent().id();
    place(&a, parent.agent(), b_id, "work").await.unwrap();
    gate.reached().await;
    drop(a);
    let (c, _) = node(&url, "c", &model_a).await;
    // Resumable once the dropped node's row expired: a bounded poll, as nothing announces it.
    let resumed = within("the parent's resume", async {
        loop {
            match c.agents().resume(ResumeAgent::new(parent_id)).await {
                Ok(resumed) => break resumed,
                Err(error) if error.code() == ErrorCode::SessionLeased => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("{error}"),
            }
        }
    })
    .await;
    assert_eq!(resident_count(b.subagents()).await, 1);
    within(
        "the drain",
        c.subagents()
            .drain_continuable_descendants(std::slice::from_ref(resumed.agent())),
    )
    .await
    .unwrap();
    assert_eq!(
        resident_count(b.subagents()).await,
        0,
        "released on its node"
    );
    drop(parent);
    b.shutdown().await.unwrap();
    c.shutdown().await.unwrap();
}

// A report its parent's node took and answered only after the child's node stopped waiting
// may have been accepted there: the child's node asks again under the report's id, the
// parent's node answers that ask with the first acceptance, and the parent hears the report
// once. Before, the report failed with NODE_UNRESPONSIVE ("it may have arrived"), and a report
// or notice asked again was inserted again.
#[actix_rt::test]
async fn a_report_answered_after_the_deadline_is_asked_again_and_heard_once() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, _) = node(&url, "a", &model_a).await;
    // The child's node waits a second for each answer.
    let store_b = impatient_store(&url).await;
    let (b, b_id) = node_on(store_b, "b", &model_b).await;
    let parent = root(&a).await;
    let child = place(&a, parent.agent(), b_id, "work")
        .await
        .unwrap()
        .child_id;
    gate.reached().await;
    // The parent's node asks who holds the child before it takes a report: for a second and
    // a half nobody can read the lease table.
    let locker = raw_client(&url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE subagents_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let unlock = tokio::spawn(async move {
        locker
            .batch_execute("SELECT pg_sleep(1.5); COMMIT")
            .await
            .unwrap();
    });
    let reporter = b.agents().get(child).await.unwrap();
    let report = within(
        "the report",
        b.subagents().report_from(
            &reporter,
            text("halfway"),
            ReportOptions::new(ReportDelivery::Quiet),
        ),
    )
    .await
    .expect("accepted, though answered late");
    unlock.await.unwrap();
    let asked = count(
        &url,
        "SELECT count(*) FROM subagents_deliveries
         WHERE convert_from(payload, 'UTF8') LIKE '%\"op\":\"notify\"%'",
    )
    .await;
    assert!(asked >= 2, "asked again: {asked}");
    assert_eq!(
        times_inserted(&parent.agent().log().events(), report),
        1,
        "heard once"
    );
    gate.release();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// The child's node accepts a follow-up, then dies before its answer lands: the parent's node
// hears "it may have been accepted", waits out the dead node's lease, resumes the child itself
// and sends the follow-up again under its id. The child accepted it once: it is
// answered with that acceptance and runs once, neither lost nor doubled.
#[actix_rt::test]
async fn a_followup_accepted_by_a_node_that_died_before_answering_runs_once() {
    let Some(Placed {
        url,
        a,
        b,
        b_id,
        parent,
        started,
        gate,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let child = started.child_id;
    // The child's node can no longer answer follow-ups: its answer fails in the database.
    sql(
        &url,
        "CREATE FUNCTION refuse_followup_answers() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.state = 'answered' AND convert_from(OLD.payload, 'UTF8') LIKE '%\"op\":\"followup\"%' THEN
                 RAISE EXCEPTION 'the answer never lands';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_followup_answers BEFORE UPDATE ON subagents_deliveries
             FOR EACH ROW EXECUTE FUNCTION refuse_followup_answers();",
    )
    .await;
    let sending = tokio::spawn(a.subagents().followup(
        parent.agent(),
        child,
        text("second"),
        FollowupOptions::new(MessageSource::User),
    ));
    // Accepted on the child's node (pending behind the held turn) and stored there.
    let on_b = b.agents().get(child).await.unwrap();
    eventually("the acceptance on the child's node", || {
        inserted(&on_b.log().events()).contains(&"second".to_owned())
    })
    .await;
    within("the acceptance stored", async {
        while !inserted(&persisted(&b, child).await).contains(&"second".to_owned()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The node dies before answering: its row expires.
    sql(
        &url,
        &format!("UPDATE subagents_nodes SET expires_at = now() - interval '1 second' WHERE node = '{b_id}'"),
    )
    .await;
    let accepted = within("the follow-up's answer", sending)
        .await
        .unwrap()
        .expect("the follow-up is accepted");
    // Resumed on the parent's node, which runs the follow-up once.
    let resumed = a
        .agents()
        .get(child)
        .await
        .expect("resumed on the parent's node");
    eventually("the follow-up's turn", || {
        delivered(&resumed.log().events())
            .iter()
            .filter(|text| *text == "second")
            .count()
            == 1
            && turn_ends(&resumed.log().events()).len() >= 2
    })
    .await;
    let events = persisted(&a, child).await;
    assert_eq!(times_inserted(&events, accepted), 1, "accepted once");
    gate.release();
    b.shutdown().await.ok();
    a.shutdown().await.unwrap();
}

// A node's process dies and a new one joins under the same node id within the time-to-live
// (a restart): the new incarnation fences its predecessor's leases at once. The child that ran
// on the dead process passes on: its parent hears that its epoch ended with its node, and a
// follow-up resumes it and runs. Before incarnations the restarted node renewed the dead
// process's leases: the follow-up bounced between "absent" and "leased" until it gave up, and
// the parent never heard of the epoch.
#[actix_rt::test]
async fn a_node_restarted_under_its_id_passes_its_predecessors_children_on_at_once() {
    let Some(Placed {
        url,
        a,
        b,
        b_id,
        parent,
        started,
        gate,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let child = started.child_id;
    // The child's node's process dies mid-turn (it stops heartbeating and serving)...
    drop(b);
    // ...and a new process joins under its id before its row expires.
    let restarted = restarted_as(&url, b_id, "b again", "child again").await;
    let heard = notices_reach(parent.agent(), 1).await;
    assert!(
        heard[0].contains("node-stopped") && heard[0].contains(&child.to_string()),
        "{heard:?}"
    );
    let accepted = within(
        "the follow-up",
        a.subagents().followup(
            parent.agent(),
            child,
            text("second"),
            FollowupOptions::new(MessageSource::User),
        ),
    )
    .await
    .expect("a follow-up resumes the child");
    eventually("the follow-up's turn", || {
        notices(parent.agent()).len() >= 2
    })
    .await;
    let events = persisted(&a, child).await;
    assert!(
        delivered(&events).contains(&"second".to_owned()),
        "the follow-up {accepted} ran: {:?}",
        delivered(&events)
    );
    assert_eq!(notices(parent.agent()).len(), 2, "one notice per epoch");
    gate.release();
    restarted.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A child placed on B holding its first turn, with "second" and "third" accepted behind it,
/// when B leaves: the turn ends there, the two wait in the child's log. Answers A, the parent
/// and the child.
async fn handed_over() -> Option<(Runtime, subagents::AgentHandle, SessionId)> {
    let Placed {
        a,
        b,
        parent,
        started,
        gate,
        ..
    } = placed("first").await?;
    let child = started.child_id;
    for text in ["second", "third"] {
        followup_child(&a, parent.agent(), child, text)
            .await
            .unwrap();
    }
    let leaving = tokio::spawn(async move { b.shutdown().await });
    notices_reach(parent.agent(), 1).await;
    within("the leave", leaving).await.unwrap().unwrap();
    gate.release();
    Some((a, parent, child))
}

// A node that leaves gracefully (a rolling restart) hands its children over: a child of a
// parent on another node, mid-turn with follow-ups accepted behind the turn, is released with
// those follow-ups still pending in its log; the parent's next follow-up resumes it, and it
// runs them first, in acceptance order, then the new one. Before, the leave discarded them:
// accepted, then lost, by an ordinary deploy.
#[actix_rt::test]
async fn a_node_that_leaves_hands_its_children_over_with_their_pending_followups() {
    let Some((a, parent, child)) = handed_over().await else {
        return;
    };
    followup_child(&a, parent.agent(), child, "fourth")
        .await
        .unwrap();
    let resumed = a.agents().get(child).await.expect("resumed here");
    eventually("the handed-over follow-ups' turns", || {
        delivered(&resumed.log().events()).len() >= 4
    })
    .await;
    // Stored behind the live log: written out before the store is read.
    resumed.log().flush().await.unwrap();
    let events = persisted(&a, child).await;
    assert_eq!(
        delivered(&events),
        ["first", "second", "third", "fourth"],
        "nothing accepted was lost, and all of it ran in order"
    );
    a.shutdown().await.unwrap();
}

// A drain of a handed-over child's lineage discards what it was handed over with: the drain
// refuses the follow-up that would resume the child, so its accepted, unclaimed follow-ups
// would otherwise wait in its log with nothing to run them. Before, the drain left them
// pending (the campaign's seed 8005: acknowledged, then neither run nor discarded).
#[actix_rt::test]
async fn a_drain_discards_what_a_handed_over_child_waits_with() {
    let Some((a, parent, child)) = handed_over().await else {
        return;
    };
    within(
        "the drain",
        a.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    only_the_first_ran_and_two_were_discarded(&a, child, "first").await;
    assert_eq!(resident_count(a.subagents()).await, 0);
    a.shutdown().await.unwrap();
}

// A drain whose release finds the child's node stopped discards, from the store, what the child
// accepted there and did not run, and its parent hears that the epoch ended with its node, once.
// Before, the release counted the child as released: its acknowledged follow-ups waited in its
// log with nothing to run them (the campaign's seed 9056: a node paused past its time-to-live
// under a drain).
#[actix_rt::test]
async fn a_drain_discards_what_a_child_left_behind_on_a_stopped_node() {
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
    let child = started.child_id;
    for text in ["second", "third"] {
        followup_child(&a, parent.agent(), child, text)
            .await
            .unwrap();
    }
    // The child's node dies mid-turn: its row expires, the two wait in the child's log.
    drop(b);
    within(
        "the drain",
        a.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    only_the_first_ran_and_two_were_discarded(&a, child, "first").await;
    // Heard while its parent's lineage drains: put in its inbox, without a wake.
    let stopped = || {
        inserted(&parent.agent().log().events())
            .iter()
            .filter(|text| text.contains("node-stopped") && text.contains(&child.to_string()))
            .count()
    };
    eventually("the node-stopped notice", || stopped() >= 1).await;
    assert_eq!(resident_count(a.subagents()).await, 0);
    gate.release();
    a.shutdown().await.unwrap();
    assert_eq!(stopped(), 1, "one notice of the epoch");
}

// The same when the child's node was restarted under its id before the drain: the new
// incarnation answers the release that it does not hold the child, and the release discards
// what the child left behind with the predecessor. Before, that answer counted as released
// (the campaign's seeds 10021, 10043, 10063: a kill and restart under a drain).
#[actix_rt::test]
async fn a_drain_discards_what_a_child_left_behind_on_a_restarted_node() {
    let Some(Placed {
        url,
        a,
        b,
        b_id,
        parent,
        started,
        gate,
        ..
    }) = placed("first").await
    else {
        return;
    };
    let child = started.child_id;
    for text in ["second", "third"] {
        followup_child(&a, parent.agent(), child, text)
            .await
            .unwrap();
    }
    // The child's node's process dies, and a new one joins under its id.
    drop(b);
    let restarted = restarted_as(&url, b_id, "b again", "again").await;
    within(
        "the drain",
        a.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    only_the_first_ran_and_two_were_discarded(&a, child, "first").await;
    gate.release();
    restarted.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

// A drain whose release reaches the child's node while that node leaves and hands the child
// over: the release finds the child still resident, its hand-over open, and the parent's node
// had not yet heard of the hand-over when the drain looked for handed-over children. The
// release is answered "not released here" (the child kept what it accepted), and the parent's
// node discards it from the store. Before, it was answered "released": the two follow-ups the
// child was handed over with were never run nor discarded (the campaign's seed 3: a leave
// under a drain).
#[actix_rt::test]
async fn a_drain_that_meets_a_hand_over_discards_what_the_child_was_handed_over_with() {
    let url = postgres_or_skip!().fresh_database();
    let (model_a, model_b, gate) = held_child_models();
    let (a, _) = node(&url, "a", &model_a).await;
    let (b, b_id, faults) = faulty_node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    let child = place(&a, parent.agent(), b_id, "first")
        .await
        .unwrap()
        .child_id;
    gate.reached().await;
    for text in ["second", "third"] {
        followup_child(&a, parent.agent(), child, text)
            .await
            .unwrap();
    }
    // The hand-over cannot end while the child's lease release is held: the child stays
    // resident on b, its disposal open, and its parent's node has not heard of it.
    faults.hold(StoreOperation::ReleaseLease);
    let leaving = tokio::spawn(async move { b.shutdown().await });
    faults.held_calls(1).await;
    let draining = {
        let (a, parent) = (a.clone(), parent.agent().clone());
        tokio::spawn(async move { a.subagents().drain_continuable_descendants(&[parent]).await })
    };
    // The drain's release is served on b, under the open hand-over.
    counted(
        "the release served on b",
        &url,
        "SELECT count(*) FROM subagents_deliveries
             WHERE state <> 'pending' AND convert_from(payload, 'UTF8') LIKE '%\"op\":\"release\"%'",
    )
    .await;
    faults.release(StoreOperation::ReleaseLease);
    within("the drain", draining).await.unwrap().unwrap();
    within("the leave", leaving).await.unwrap().unwrap();
    only_the_first_ran_and_two_were_discarded(&a, child, "first").await;
    assert_eq!(resident_count(a.subagents()).await, 0);
    gate.release();
    a.shutdown().await.unwrap();
}

// A node killed while one of its roots' children ran on it, with follow-ups accepted behind
// the child's turn, and restarted under its id: the root is resumed there and drained. The
// drain refuses the follow-ups that would resume the child, so what it accepted and did not run
// is discarded from the store. Before, the new process had no record of the child and its lease
// was its predecessor's: nothing found it, and its follow-ups were neither run nor discarded
// (the campaign's seed 45: the driver killed while it ran a child resumed there, then a drain).
#[actix_rt::test]
async fn a_node_restarted_under_its_id_drains_what_its_predecessor_left_behind() {
    let url = postgres_or_skip!().fresh_database();
    let (_, child_model, gate) = held_child_models();
    let (a, a_id) = node(&url, "a", &child_model).await;
    let parent = root(&a).await;
    let parent_id = parent.agent().id();
    // On the parent's own node: its first turn holds at the gate.
    let child = start_here(&a, parent.agent(), "first").await;
    gate.reached().await;
    for text in ["second", "third"] {
        followup_child(&a, parent.agent(), child, text)
            .await
            .unwrap();
    }
    // The node's process dies, and a new one joins under its id and resumes the root.
    drop(a);
    let (restarted, _resumed) = restarted_and_drained(&url, a_id, parent_id).await;
    only_the_first_ran_and_two_were_discarded(&restarted, child, "first").await;
    assert_eq!(resident_count(restarted.subagents()).await, 0);
    gate.release();
    restarted.shutdown().await.unwrap();
}

// The same with a grandchild: the killed node ran the root's child and the child's own child,
// each held mid-turn with follow-ups accepted behind it. The restarted node's drain finds the
// child by its dead lease and discards what it left, and, before it, what the grandchild left:
// a child discarded from the drain's node releases its own children first. Before, the child
// was resumed as a plain agent and disposed, and nothing looked below it: the grandchild's
// follow-ups were neither run nor discarded.
#[actix_rt::test]
async fn a_restarted_node_s_drain_discards_what_a_grandchild_its_predecessor_ran_left_behind() {
    let url = postgres_or_skip!().fresh_database();
    let (_, child_model, gate) = held_child_models();
    let below = Gate::new();
    // The grandchild's first turn holds too (the child's took the first held step).
    child_model.push(ScriptStep::text("held below").gated(&below));
    let (a, a_id) = node(&url, "a", &child_model).await;
    let parent = root(&a).await;
    let parent_id = parent.agent().id();
    let child = start_here(&a, parent.agent(), "first").await;
    gate.reached().await;
    let child_agent = a.agents().get(child).await.unwrap();
    let grandchild = start_here(&a, &child_agent, "below first").await;
    below.reached().await;
    two_behind_each(&a, (parent.agent(), child), (&child_agent, grandchild)).await;
    drop((child_agent, a));
    let (restarted, _resumed) = restarted_and_drained(&url, a_id, parent_id).await;
    for (session, first) in [(child, "first"), (grandchild, "below first")] {
        only_the_first_ran_and_two_were_discarded(&restarted, session, first).await;
    }
    assert_eq!(resident_count(restarted.subagents()).await, 0);
    gate.release();
    below.release();
    restarted.shutdown().await.unwrap();
}

// The same, with the grandchild on a third node: the dead node's child placed it on B, where it
// is live, mid-turn, with two follow-ups accepted behind the turn. The restarted node's drain
// finds the child by its dead lease and, before discarding what it left, releases the
// grandchild on B by its live lease: B ends its turn and discards the two follow-ups, and
// holds it no more. The child's two follow-ups are discarded before the grandchild is released:
// its settled notice may wake the child before the disposal, and that turn runs the notice
// alone. Before, they were discarded with the disposal, so the notice could wake a turn that
// ran them.
#[actix_rt::test]
async fn a_restarted_node_s_drain_releases_a_grandchild_live_on_a_third_node() {
    let url = postgres_or_skip!().fresh_database();
    let (_, child_model, gate) = held_child_models();
    let (_, grandchild_model, below) = held_child_models();
    let (a, a_id) = node(&url, "a", &child_model).await;
    let (b, b_id) = node(&url, "b", &grandchild_model).await;
    let parent = root(&a).await;
    let parent_id = parent.agent().id();
    let child = start_here(&a, parent.agent(), "first").await;
    gate.reached().await;
    let child_agent = a.agents().get(child).await.unwrap();
    let grandchild = place(&a, &child_agent, b_id, "below first")
        .await
        .unwrap()
        .child_id;
    below.reached().await;
    two_behind_each(&a, (parent.agent(), child), (&child_agent, grandchild)).await;
    assert_eq!(resident_count(b.subagents()).await, 1);
    drop((child_agent, a));
    let (restarted, _resumed) = restarted_and_drained(&url, a_id, parent_id).await;
    only_the_first_ran_and_two_were_discarded(&restarted, grandchild, "below first").await;
    let events = persisted(&restarted, child).await;
    let prompts: Vec<String> = events
        .iter()
        .filter_map(|event| match &event.kind {
            subagents::EventKind::UserMessage(message)
                if !matches!(
                    message.source,
                    subagents::MessageSource::Plugin { .. }
                        | subagents::MessageSource::SubagentSettledNotice { .. }
                ) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        prompts,
        ["first"],
        "nothing else ran in the child's session"
    );
    // The two follow-ups are discarded first, in one splice; the grandchild's notice, when it
    // arrived before the disposal, after them.
    assert_eq!(
        discards(&events).first(),
        Some(&2),
        "both follow-ups behind the child's turn were discarded before anything else"
    );
    assert_eq!(
        resident_count(b.subagents()).await,
        0,
        "the grandchild was released on the node that held it"
    );
    assert!(b.agents().get(grandchild).await.is_none());
    gate.release();
    below.release();
    restarted.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Accepts "second" and "third" behind the child's held turn and "below second" and "below
/// third" behind the grandchild's, each sent through `rt` by its parent.
async fn two_behind_each(
    rt: &Runtime,
    (parent, child): (&subagents::AgentRef, SessionId),
    (child_agent, grandchild): (&subagents::AgentRef, SessionId),
) {
    for (sender, target, texts) in [
        (parent, child, ["second", "third"]),
        (child_agent, grandchild, ["below second", "below third"]),
    ] {
        for text in texts {
            followup_child(rt, sender, target, text).await.unwrap();
        }
    }
}

/// A new process for node `id` (the one before it died) that resumed root `parent` (its
/// handle) and drained its continuable descendants.
async fn restarted_and_drained(
    url: &str,
    id: NodeId,
    parent: SessionId,
) -> (Runtime, subagents::AgentHandle) {
    let restarted = restarted_as(url, id, "a again", "again").await;
    let resumed = restarted
        .agents()
        .resume(ResumeAgent::new(parent))
        .await
        .unwrap();
    within(
        "the drain",
        restarted
            .subagents()
            .drain_continuable_descendants(&[resumed.agent().clone()]),
    )
    .await
    .unwrap();
    (restarted, resumed)
}

/// Asserts that in `session`'s stored log (read through `rt`) only the prompt `first` ran, and
/// that the two follow-ups accepted behind it were discarded.
async fn only_the_first_ran_and_two_were_discarded(rt: &Runtime, session: SessionId, first: &str) {
    let events = persisted(rt, session).await;
    assert_eq!(
        delivered(&events),
        [first],
        "nothing else ran in {first:?}'s session"
    );
    assert_eq!(
        discarded(&events),
        2,
        "both follow-ups behind {first:?} were discarded"
    );
}

/// How many messages `events` discarded from the inbox (splices whose outcome is `canceled`).
fn discarded(events: &[subagents::SessionEvent]) -> u64 {
    discards(events).iter().sum()
}

/// How many messages each discard in `events` removed from the inbox, in order.
fn discards(events: &[subagents::SessionEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            subagents::EventKind::InboxSpliced {
                removed_count: Some(removed),
                outcome: Some(subagents::session::SpliceOutcome::Canceled),
                ..
            } => Some(*removed),
            _ => None,
        })
        .collect()
}

// A release waits for its child's release, which may wait on a release on the other node. A
// forest alternating A → B → A → B → A: the middles on B drain their descendants, so B asks A
// to release each low child, whose release asks B to release its child, whose release waits
// for B's own release of the leaf on A, with more releases at once than a node serves
// deliveries at once. It is released whole, child first, and only the middles stay resident: a
// served release gives its serving slot up while it waits (`deliveries::yield_slot`). Before,
// A's slots all held releases of low children waiting (through B) for leaf releases queued
// behind them on A, and the drain hung until the delivery deadline.
#[actix_rt::test]
async fn a_forest_alternating_between_nodes_releases_more_children_than_slots() {
    const WIDE: usize = subagents::store::deliveries::SERVED_AT_ONCE + 16;
    let url = postgres_or_skip!().fresh_database();
    // Every turn holds until the release cancels it.
    let (hold_a, hold_b) = (Gate::new(), Gate::new());
    let model_a = ScriptedModel::repeating(ScriptStep::text("a").gated(&hold_a));
    let model_b = ScriptedModel::repeating(ScriptStep::text("b").gated(&hold_b));
    let (a, a_id) = node(&url, "a", &model_a).await;
    let (b, b_id) = node(&url, "b", &model_b).await;
    let parent = root(&a).await;
    // Each level placed on the other node by the level above: (the runtime it runs on, its
    // agents there).
    let mut level = Vec::new();
    for _ in 0..WIDE {
        let middle = place(&a, parent.agent(), b_id, "middle").await.unwrap();
        level.push(b.agents().get(middle.child_id).await.unwrap());
    }
    let middles = level.clone();
    for (on, to, to_id) in [(&b, &a, a_id), (&a, &b, b_id), (&b, &a, a_id)] {
        let mut next = Vec::new();
        for parent in &level {
            let child = place(on, parent, to_id, "below").await.unwrap();
            next.push(to.agents().get(child.child_id).await.unwrap());
        }
        level = next;
    }
    assert_eq!(resident_count(a.subagents()).await, 2 * WIDE);
    assert_eq!(resident_count(b.subagents()).await, 2 * WIDE);
    within(
        "the forest's release",
        b.subagents().drain_continuable_descendants(&middles),
    )
    .await
    .unwrap();
    // Released child first before the drain answered: only the middles stay.
    assert_eq!(resident_count(a.subagents()).await, 0);
    assert_eq!(resident_count(b.subagents()).await, WIDE);
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}
