//! `list_descendants`: the whole tree in stable pre-order, with positions.

use super::*;

// LIST-43
#[actix_rt::test]
async fn descendants_are_the_whole_tree_in_stable_pre_order_with_parent_and_depth() {
    let (store, rt, parent) = stored_parent().await;
    let child_a = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("branch a")),
    )
    .await;
    let grandchild = author(
        &*store,
        delegated(SessionId::new(), child_a, 2),
        child_events(continuable("under a")),
    )
    .await;
    let child_b = author(
        &*store,
        delegated(SessionId::new(), parent, 3),
        child_events(continuable("branch b")),
    )
    .await;
    assert_eq!(
        descendants(&rt, parent).await,
        [
            at(
                SubagentListEntry::Child {
                    id: child_a,
                    mode: DelegationMode::Continuable,
                    label: Some("branch a".into()),
                    activity: SubagentActivity::Inactive,
                    has_children: true,
                },
                parent,
                1
            ),
            at(inactive(grandchild, "under a"), child_a, 2),
            at(inactive(child_b, "branch b"), parent, 1),
        ]
    );
}

// LIST-45
#[actix_rt::test]
async fn a_live_node_in_its_creation_window_is_omitted_but_its_subtree_is_walked() {
    let (store, rt, parent) = stored_parent().await;
    let bare = live_child(&rt, parent, None).await;
    let bare_id = bare.agent().id();
    let below = author(
        &*store,
        delegated(SessionId::new(), bare_id, 2),
        child_events(continuable("below the creation window")),
    )
    .await;
    assert_eq!(
        descendants(&rt, parent).await,
        [at(inactive(below, "below the creation window"), bare_id, 2)]
    );
}

// LIST-46
#[actix_rt::test]
async fn a_parent_cycle_terminates_without_revisiting_the_root() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let (cycle_root, node) = (SessionId::new(), SessionId::new());
    // Each names the other as its parent: corrupt lineage the walk must survive.
    author(
        &*store,
        ordinary(cycle_root, node, 2),
        child_events(continuable("ordinary cycle root")),
    )
    .await;
    author(
        &*store,
        delegated(node, cycle_root, 1),
        child_events(continuable("cycle child")),
    )
    .await;
    assert_eq!(
        descendants(&rt, cycle_root).await,
        [at(inactive(node, "cycle child"), cycle_root, 1)]
    );
}

// LIST-47 (adapted: the ordinary chain is stored rather than live)
#[actix_rt::test]
async fn a_ten_thousand_deep_chain_of_ordinary_sessions_is_walked_without_recursion() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let top = SessionId::new();
    let depth = 10_000u64;
    let mut parent = top;
    for level in 1..depth {
        parent = author(
            &*store,
            ordinary(SessionId::new(), parent, level),
            completed_turn(1, vec![]),
        )
        .await;
    }
    let leaf = author(
        &*store,
        delegated(SessionId::new(), parent, depth),
        child_events(continuable("deep leaf")),
    )
    .await;
    assert_eq!(
        descendants(&rt, top).await,
        [at(inactive(leaf, "deep leaf"), parent, depth)]
    );
}

// LIST-48
#[actix_rt::test]
async fn continuable_descendants_below_ordinary_and_one_shot_intermediates_are_found() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await;
    let pid = parent.agent().id();
    // An ordinary fork: no row of its own, but its subtree is walked.
    let fork = author(
        &*store,
        ordinary(SessionId::new(), pid, 1),
        completed_turn(1, vec![]),
    )
    .await;
    let under_fork = author(
        &*store,
        delegated(SessionId::new(), fork, 2),
        child_events(continuable("under the fork")),
    )
    .await;
    // A real one-shot child, then a continuable stored below it.
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("one-shot task"))
                .label("one-shot intermediate"),
        )
        .await
        .expect("the run starts");
    within("the one-shot result", run.result()).await.unwrap();
    let one_shot = run.id();
    within("the one-shot disposal", run.dispose())
        .await
        .unwrap();
    let under_one_shot = author(
        &*store,
        delegated(SessionId::new(), one_shot, 9_999_999_999_999),
        child_events(continuable("under the one-shot")),
    )
    .await;

    assert_eq!(
        descendants(&rt, pid).await,
        [
            at(inactive(under_fork, "under the fork"), fork, 2),
            at(
                SubagentListEntry::Child {
                    id: one_shot,
                    mode: DelegationMode::OneShot,
                    label: Some("one-shot intermediate".into()),
                    activity: SubagentActivity::Inactive,
                    has_children: true,
                },
                pid,
                1
            ),
            at(inactive(under_one_shot, "under the one-shot"), one_shot, 2),
        ]
    );
}

// LIST-49
#[actix_rt::test]
async fn a_settled_node_without_a_descriptor_is_corrupt_and_its_subtree_still_listed() {
    let (store, rt, parent) = stored_parent().await;
    let bare = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        completed_turn(1, vec![]),
    )
    .await;
    let below = author(
        &*store,
        delegated(SessionId::new(), bare, 2),
        child_events(continuable("below the bare node")),
    )
    .await;
    assert_eq!(
        descendants(&rt, parent).await,
        [
            at(
                diagnostic(bare, SubagentDiagnosticReason::Corrupt),
                parent,
                1
            ),
            at(inactive(below, "below the bare node"), bare, 2),
        ]
    );
}

// LIST-50
#[actix_rt::test]
async fn the_walk_continues_below_a_corrupt_node_and_positions_its_diagnostic() {
    let (store, rt, parent) = stored_parent().await;
    let corrupt = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(json!({
            "version": 999, "mode": "continuable", "provider": "spawn",
            "label": "unsupported descriptor"
        })),
    )
    .await;
    let below = author(
        &*store,
        delegated(SessionId::new(), corrupt, 2),
        child_events(continuable("below the corrupt node")),
    )
    .await;
    assert_eq!(
        descendants(&rt, parent).await,
        [
            at(
                diagnostic(corrupt, SubagentDiagnosticReason::Corrupt),
                parent,
                1
            ),
            at(inactive(below, "below the corrupt node"), corrupt, 2),
        ]
    );
}

// LIST-51
#[actix_rt::test]
async fn a_descendant_whose_inspection_names_another_parent_is_corrupt_in_place() {
    let (probe, rt, parent) = probed_parent().await;
    let child = author(
        &*probe,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("lineage checked")),
    )
    .await;
    // The exact read reports another durable parent than the enumeration did.
    probe.on_inspect(|_, outcome| {
        let mut stored = outcome?;
        stored.header.parent_session = Some(SessionId::new());
        Ok(stored)
    });
    assert_eq!(
        descendants(&rt, parent).await,
        [at(
            diagnostic(child, SubagentDiagnosticReason::Corrupt),
            parent,
            1
        )]
    );
}

// The whole forest from one read of the store: every root with delegated descendants, oldest
// first (a parent the store holds no header of dates from its oldest child), each listed as
// `list_descendants` lists it; a root without delegated children is left out.
#[actix_rt::test]
async fn the_forest_is_every_root_with_descendants_from_one_read_of_the_store() {
    let (probe, rt, parent) = probed_parent().await;
    let child = author(
        &*probe,
        delegated(SessionId::new(), parent, 10),
        child_events(continuable("the live root's child")),
    )
    .await;
    let absent = SessionId::new();
    let orphan = author(
        &*probe,
        delegated(SessionId::new(), absent, 5),
        child_events(continuable("an absent parent's child")),
    )
    .await;
    // A root without delegated children.
    let _childless = root(&rt).await;
    let lists = probe.list_calls();
    let forest = within(
        "the forest",
        rt.subagents().list_forest(CancellationToken::new()),
    )
    .await
    .unwrap();
    assert_eq!(probe.list_calls() - lists, 1, "one read for every root");
    let roots: Vec<SessionId> = forest.iter().map(|tree| tree.root).collect();
    assert_eq!(
        roots,
        [absent, parent],
        "oldest first; the childless root left out"
    );
    assert_eq!(
        forest[0].descendants,
        [at(inactive(orphan, "an absent parent's child"), absent, 1)]
    );
    assert_eq!(forest[1].descendants, descendants(&rt, parent).await);
    assert_eq!(
        forest[1].descendants,
        [at(inactive(child, "the live root's child"), parent, 1)]
    );
}

// The forest streams: root by root, in pre-order within a root, each entry as soon as it is
// identified, with at most `COLD_READS` children read ahead of the caller; gathered, the
// entries are the forest `list_forest` lists.
#[actix_rt::test]
async fn the_forest_streams_root_by_root_in_pre_order_and_holds_no_entry() {
    let (probe, rt, parent) = probed_parent().await;
    for index in 0..12u64 {
        author(
            &*probe,
            delegated(SessionId::new(), parent, 10 + index),
            child_events(continuable(&format!("child {index}"))),
        )
        .await;
    }
    let absent = SessionId::new();
    let orphan = author(
        &*probe,
        delegated(SessionId::new(), absent, 5),
        child_events(continuable("an absent parent's child")),
    )
    .await;
    let inspected_before = probe.inspected().len();
    let mut entries = within(
        "the corpus",
        rt.subagents().stream_forest(CancellationToken::new()),
    )
    .await
    .unwrap();
    let first = within("the first entry", entries.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.root, absent, "the oldest root first");
    assert_eq!(
        first.entry,
        at(inactive(orphan, "an absent parent's child"), absent, 1)
    );
    let read_ahead = probe.inspected().len() - inspected_before;
    assert!(
        read_ahead <= subagents::projection::COLD_READS,
        "{read_ahead} children read before the first entry was taken"
    );
    let rest: Vec<SubagentForestEntry> = within("the rest", entries.try_collect()).await.unwrap();
    assert!(rest.iter().all(|entry| entry.root == parent));
    let rest: Vec<SubagentDescendantListEntry> =
        rest.into_iter().map(|entry| entry.entry).collect();
    assert_eq!(rest.len(), 12);
    assert_eq!(rest, descendants(&rt, parent).await);
    let forest = within(
        "the forest",
        rt.subagents().list_forest(CancellationToken::new()),
    )
    .await
    .unwrap();
    assert_eq!(
        forest,
        [
            SubagentForestTree {
                root: absent,
                descendants: vec![first.entry],
            },
            SubagentForestTree {
                root: parent,
                descendants: rest,
            },
        ]
    );
}
