//! Waiting for a continuable child is a first-class API (issue #17): `Subagents::settlements`
//! answers each epoch's stop reason and final output per child, without the host matching
//! lifecycle events, and never misses a settlement that happened before it was awaited.

use subagents::testing::{Gate, ScriptStep};
use subagents::{ContentBlock, StopReason};

use crate::support::{followup_child, Routed};

fn texts(output: Option<&Vec<ContentBlock>>) -> Vec<String> {
    output
        .into_iter()
        .flatten()
        .filter_map(ContentBlock::as_text)
        .map(str::to_owned)
        .collect()
}

#[actix_rt::test]
async fn each_epoch_of_a_child_settles_once_with_its_own_output() {
    let routed = Routed::new().await;
    routed.child_model.push_all([
        ScriptStep::text("first answer"),
        ScriptStep::text("second answer"),
    ]);
    let rt = &routed.rt;
    let mut settled = rt.subagents().settlements(routed.parent());
    let child = routed.start_child("worker", "work").await;
    let first = settled.next_of(child).await.unwrap();
    assert_eq!(first.stop_reason, StopReason::Completed);
    assert_eq!(
        texts(first.last_assistant_message.as_ref()),
        ["first answer"]
    );

    followup_child(rt, routed.parent(), child, "more")
        .await
        .unwrap();
    let second = settled.next_of(child).await.unwrap();
    assert_eq!(
        texts(second.last_assistant_message.as_ref()),
        ["second answer"]
    );
    assert_ne!(
        first.info.run_id, second.info.run_id,
        "one settlement per epoch"
    );
    rt.shutdown().await.unwrap();
}

// A settlement that happens before anyone awaits it is kept, and a wait for one child never
// consumes another's.
#[actix_rt::test]
async fn settlements_of_other_children_are_kept_for_their_own_waits() {
    let routed = Routed::new().await;
    let gate = Gate::new();
    routed
        .child_model
        .push(ScriptStep::text("held").gated(&gate));
    let rt = &routed.rt;
    let mut settled = rt.subagents().settlements(routed.parent());
    let mut watch = rt.subagents().settlements(routed.parent());
    let held = routed.start_child("held", "hold").await;
    gate.reached().await;
    let quick = routed.start_child("quick", "go").await;
    // The quick child settled while nobody waited on `settled`.
    watch.next_of(quick).await.unwrap();

    let (held_end, ()) = futures::join!(settled.next_of(held), async { gate.release() });
    let held_end = held_end.unwrap();
    assert_eq!(held_end.info.id, held);
    assert_eq!(texts(held_end.last_assistant_message.as_ref()), ["held"]);
    let quick_end = settled.next_of(quick).await.unwrap();
    assert_eq!(quick_end.info.id, quick);
    assert_eq!(
        texts(quick_end.last_assistant_message.as_ref()),
        ["child ok"]
    );
    rt.shutdown().await.unwrap();
}
