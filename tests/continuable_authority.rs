//! Who may reach a continuable child, and who hears from it: only its parent reaches its inbox
//! (through the manager), the parent is the session (a parent disposed and resumed is the same
//! parent), and an interrupt is authorized whatever the child's residency.

use subagents::testing::{Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    CancelCause, ErrorCode, EventKind, EventScope, InboxPolicy, InterruptAuthority, MessageSource,
    ReportDelivery, ReportOptions, ResumeAgent, SessionId, TurnEndReason,
};

use crate::support::{
    delivered, faulty, followup_child, grandchild, notices, notices_inserted, persisted,
    resumed_with_the_notice_pending, root, seam_runtime, settled, start_continuable, text,
    turn_ends, within, SeamRecorder,
};

// The `AgentRef` anyone can look up is no back door: while the child is resident, a host's
// delivery or cancel through it is refused, and the child hears only its parent, through the
// manager's authority check and accepted-set bookkeeping.
#[actix_rt::test]
async fn a_resident_childs_inbox_is_reached_only_through_its_parent() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    let refusals = [
        child
            .followup(text("sneak"), MessageSource::User)
            .await
            .err(),
        child.steer(text("sneak"), MessageSource::User).await.err(),
        child.inject(text("sneak"), MessageSource::User).await.err(),
        child
            .cancel(CancelCause::User, InboxPolicy::Discard)
            .await
            .err(),
    ];
    for refusal in refusals {
        let error = refusal.expect("a host's call into a resident child is refused");
        assert_eq!(error.code(), ErrorCode::Unauthorized, "{error}");
    }
    followup_child(&rt, parent.agent(), started.child_id, "from the parent")
        .await
        .unwrap();
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["task", "from the parent"],
        "the turn ran whole, and only the parent's message reached the inbox"
    );
}

// The parent is the session: a parent disposed and resumed while its child runs is the same
// parent. Its follow-ups are accepted, the child's reports reach it, and it hears the child
// settle, once.
#[actix_rt::test]
async fn a_parent_disposed_and_resumed_while_its_child_runs_hears_it_once() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let parent_id = parent.agent().id();
    parent.dispose().await.unwrap();
    let resumed = rt
        .agents()
        .resume(ResumeAgent::new(parent_id))
        .await
        .unwrap();
    followup_child(
        &rt,
        resumed.agent(),
        started.child_id,
        "from the resumed parent",
    )
    .await
    .expect("the resumed parent is the parent");
    let child = rt.agents().get(started.child_id).await.unwrap();
    let report = rt
        .subagents()
        .report_from(
            &child,
            text("halfway"),
            ReportOptions::new(ReportDelivery::Quiet),
        )
        .await
        .expect("the report reaches the resumed parent");
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    within("the notice", async {
        while notices_inserted(&resumed.agent().log().events()) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    resumed.agent().when_idle().await;
    let events = resumed.agent().log().events();
    assert_eq!(notices_inserted(&events), 1, "the notice, once");
    assert!(
        events.iter().any(|event| matches!(&event.kind,
            EventKind::InboxSpliced { inserted, .. } if inserted.iter().any(|m| m.id == report))),
        "the report is in the resumed parent's inbox"
    );
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["task", "from the resumed parent"]
    );
}

// A parent away when its child settles (disposed, not resumed) hears it when it comes back:
// the notice waits in its stored inbox, delivered once, and runs with the parent's next
// waking send. A report needs a live parent: its sender hears PARENT_UNAVAILABLE.
#[actix_rt::test]
async fn a_parent_away_when_its_child_settles_hears_it_when_it_comes_back() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let parent_id = parent.agent().id();
    parent.dispose().await.unwrap();
    let child = rt.agents().get(started.child_id).await.unwrap();
    let error = rt
        .subagents()
        .report_from(
            &child,
            text("anyone?"),
            ReportOptions::new(ReportDelivery::Wakeup),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ParentUnavailable, "{error}");
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    let store = rt.store().unwrap().clone();
    within("the notice to be stored", async {
        while notices_inserted(&store.read_from(parent_id, 0).await.unwrap()) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let back = resumed_with_the_notice_pending(&rt, parent_id).await;
    back.agent()
        .followup(text("what happened?"), MessageSource::User)
        .await
        .unwrap();
    back.agent().when_idle().await;
    assert_eq!(notices(back.agent()).len(), 1, "read once");
    assert_eq!(notices_inserted(&back.agent().log().events()), 1);
}

// An interrupt of a child whose cold resume is in flight is not a no-op: it reaches the turn
// the resume opens.
#[actix_rt::test]
async fn an_interrupt_reaches_a_child_whose_cold_resume_is_in_flight() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, faults, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    let held = Gate::new();
    model.push(ScriptStep::text("the resumed turn").gated(&held));
    faults.hold(StoreOperation::Inspect);
    let followup = tokio::spawn({
        let (rt, parent) = (rt.clone(), parent.agent().clone());
        async move { followup_child(&rt, &parent, started.child_id, "again").await }
    });
    within("the cold resume to be under way", faults.held_calls(1)).await;
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .expect("the parent may interrupt its child");
    faults.release(StoreOperation::Inspect);
    within("the follow-up", followup)
        .await
        .unwrap()
        .expect("accepted by the resumed child");
    held.release();
    settled(&recorder, started.child_id, 2).await;
    assert_eq!(
        turn_ends(&persisted(&rt, started.child_id).await).last(),
        Some(&TurnEndReason::Aborted {
            reason: CancelCause::User
        }),
        "the resumed turn was interrupted"
    );
}

// Authority is checked whatever the residency: a settled child (and a settled grandchild)
// refuses a wrong parent and an unrelated caller, while its parent and ancestors are accepted
// (with nothing left to stop). An id no session has is still an accepted no-op.
#[actix_rt::test]
async fn an_interrupt_of_a_settled_child_checks_authority() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let stranger = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    let child_gate = Gate::new();
    model.push(ScriptStep::text("child").gated(&child_gate));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    child_gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    let grand = grandchild(&rt, &child).await;
    child_gate.release();
    settled(&recorder, grand.child_id, 1).await;
    settled(&recorder, started.child_id, 1).await;
    let interrupt = |target, authority| rt.subagents().interrupt(target, authority);
    for (target, authority) in [
        (
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: SessionId::new(),
            },
        ),
        (
            started.child_id,
            InterruptAuthority::Ancestor(stranger.agent().clone()),
        ),
        (
            grand.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        ),
        (
            grand.child_id,
            InterruptAuthority::Ancestor(stranger.agent().clone()),
        ),
    ] {
        let error = interrupt(target, authority).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::Unauthorized, "{error}");
    }
    for (target, authority) in [
        (
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        ),
        (
            started.child_id,
            InterruptAuthority::Ancestor(parent.agent().clone()),
        ),
        (
            grand.child_id,
            InterruptAuthority::User {
                parent_session_id: started.child_id,
            },
        ),
        (
            grand.child_id,
            InterruptAuthority::Ancestor(parent.agent().clone()),
        ),
        (
            SessionId::new(),
            InterruptAuthority::Ancestor(stranger.agent().clone()),
        ),
    ] {
        interrupt(target, authority)
            .await
            .expect("authorized: a no-op on a settled or unknown target");
    }
}
