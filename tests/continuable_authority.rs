//! Who may reach a continuable child, and who hears from it: only its parent reaches its inbox
//! (through the manager), the parent is the session (a parent disposed and resumed is the same
//! parent), and an interrupt is authorized whatever the child's residency.

use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{CancelCause, ErrorCode, EventScope, InboxPolicy, MessageSource};

use crate::support::{
    delivered, followup_child, persisted, root, seam_runtime, settled, start_continuable, text,
    SeamRecorder,
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
