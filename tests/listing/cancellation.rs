//! Cancellation before, during and after the listing's reads.

use super::*;

// LIST-36 LIST-52
#[actix_rt::test]
async fn a_cancelled_token_stops_both_listings_before_any_store_read() {
    let (probe, rt, parent) = probed_parent().await;
    author(
        &*probe,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("never read")),
    )
    .await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let error = rt
        .subagents()
        .list_children(parent, cancel.clone())
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    let error = rt
        .subagents()
        .list_descendants(parent, cancel)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    assert_eq!(probe.list_calls(), 0);
    assert!(probe.inspected().is_empty());
}

// LIST-37 (adapted: the backend call is dropped on cancellation instead of receiving a signal)
#[actix_rt::test]
async fn cancelling_during_the_store_listing_is_cancelled() {
    let (probe, rt, parent) = probed_parent().await;
    probe.hold_list();
    let cancel = CancellationToken::new();
    let (outcome, ()) = within("the cancelled listing", async {
        tokio::join!(
            rt.subagents().list_children(parent, cancel.clone()),
            async {
                probe.list_entered().await;
                cancel.cancel();
            }
        )
    })
    .await;
    assert_eq!(outcome.unwrap_err().code(), ErrorCode::Cancelled);
    assert_eq!(probe.list_calls(), 1);
}

// LIST-38
#[actix_rt::test]
async fn cancelling_during_a_cold_inspection_is_cancelled_and_abandons_the_read() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = runtime_over(faults.clone()).await;
    let parent = root(&rt).await.agent().id();
    author(
        &*faults,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("cancelled cold read")),
    )
    .await;
    faults.hold(StoreOperation::Inspect);
    let cancel = CancellationToken::new();
    let (outcome, ()) = within("the cancelled listing", async {
        tokio::join!(
            rt.subagents().list_children(parent, cancel.clone()),
            async {
                faults.held_calls(1).await;
                cancel.cancel();
            }
        )
    })
    .await;
    assert_eq!(outcome.unwrap_err().code(), ErrorCode::Cancelled);
    assert_eq!(
        faults.abandoned_calls(),
        1,
        "the held inspection was dropped"
    );
    faults.release(StoreOperation::Inspect);
}

// LIST-39
#[actix_rt::test]
async fn a_cancellation_seen_after_an_inspection_resolved_is_never_a_success() {
    let (probe, rt, parent) = probed_parent().await;
    author(
        &*probe,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("cancelled mid-listing")),
    )
    .await;
    let cancel = CancellationToken::new();
    let fire = cancel.clone();
    probe.on_inspect(move |_, outcome| {
        fire.cancel();
        outcome
    });
    let error = within(
        "the cancelled listing",
        rt.subagents().list_children(parent, cancel),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
}

// LIST-40
#[actix_rt::test]
async fn an_inspection_failing_during_cancellation_is_cancelled_not_unavailable() {
    let (probe, rt, parent) = probed_parent().await;
    author(
        &*probe,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("aborted behind a failure")),
    )
    .await;
    let cancel = CancellationToken::new();
    let fire = cancel.clone();
    probe.on_inspect(move |_, _| {
        fire.cancel();
        Err(SubagentError::new(
            ErrorCode::StoreIo,
            "backend read failed",
        ))
    });
    let error = within(
        "the cancelled listing",
        rt.subagents().list_children(parent, cancel),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
}
