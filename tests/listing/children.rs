//! `list_children`: what is listed, in what order, and how a damaged child is diagnosed.

use super::*;

// LIST-01 (adapted: "without persistence" is a runtime built without a store)
#[actix_rt::test]
async fn a_runtime_without_a_store_lists_its_live_children() {
    let rt = Runtime::builder()
        .model("scripted", model())
        .build()
        .expect("the runtime builds");
    let parent = root(&rt).await;
    let child = live_child(
        &rt,
        parent.agent().id(),
        Some(SubagentDescriptor::continuable("spawn", "live-only child")),
    )
    .await;
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [running(child.agent().id(), "live-only child")]
    );
}

// LIST-02 LIST-42 LIST-53
#[actix_rt::test]
async fn listing_without_a_projection_registry_fails_loud_before_any_read() {
    let probe = ProbeStore::new();
    let rt = seam_runtime_on(
        Runtime::builder()
            .model("scripted", model())
            .without_projections(),
        probe.clone(),
    )
    .await;
    assert!(rt.projections().is_none());
    let parent = root(&rt).await.agent().id();
    // Even with no children at all: the failure is about the runtime, not the tree.
    let error = rt
        .subagents()
        .list_children(parent, CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::SubagentControlProjectionsUnavailable
    );
    assert_eq!(
        error.code().as_str(),
        "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    );
    let error = rt
        .subagents()
        .list_descendants(parent, CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::SubagentControlProjectionsUnavailable
    );
    assert_eq!(probe.list_calls(), 0, "nothing was read from the store");
}

// LIST-04
#[actix_rt::test]
async fn a_settled_continuable_child_is_listed_inactive_with_its_durable_label() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "summarize the doc").await;
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [inactive(child, "summarize the doc")]
    );
}

// LIST-05
#[actix_rt::test]
async fn one_shot_and_continuable_children_are_listed_under_the_same_parent() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "finish once").await;
    within("the one-shot result", run.result()).await.unwrap();
    let one_shot = run.id();
    within("the one-shot disposal", run.dispose())
        .await
        .unwrap();
    let continuable = settled_child(&rt, &parent, "continuable child").await;

    let entries = children(&rt, parent.agent().id()).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    // Started without a label, the one-shot row carries none.
    assert!(entries.contains(&SubagentListEntry::Child {
        id: one_shot,
        mode: DelegationMode::OneShot,
        label: None,
        activity: SubagentActivity::Inactive,
        has_children: false,
    }));
    assert!(entries.contains(&inactive(continuable, "continuable child")));
}

// LIST-06
#[actix_rt::test]
async fn a_parent_that_exists_only_in_the_store_is_a_valid_target() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    // The restart shape: the parent was never live in this runtime.
    let cold_parent = author(
        &*store,
        SessionHeader {
            created_at: 1,
            ..SessionHeader::new(SessionId::new())
        },
        completed_turn(1, vec![]),
    )
    .await;
    let child = author(
        &*store,
        delegated(SessionId::new(), cold_parent, 1),
        child_events(continuable("persisted parent case")),
    )
    .await;
    assert_eq!(
        children(&rt, cold_parent).await,
        [inactive(child, "persisted parent case")]
    );
}

// LIST-07 (adapted: createdAt can be pinned only on stored headers, so the ordered children are cold)
#[actix_rt::test]
async fn children_are_ordered_by_creation_then_id_and_ordinary_forks_are_left_out() {
    let (store, rt, parent) = stored_parent().await;
    let mut ids = [SessionId::new(), SessionId::new(), SessionId::new()];
    ids.sort();
    // The smallest id is created last, and the store enumerates by id: only the (createdAt, id)
    // sort can produce the expected order.
    let [late, tie_a, tie_b] = ids;
    for (id, created_at, label) in [
        (late, 9, "late child"),
        (tie_b, 5, "tie b"),
        (tie_a, 5, "tie a"),
    ] {
        author(
            &*store,
            delegated(id, parent, created_at),
            child_events(continuable(label)),
        )
        .await;
    }
    // An ordinary fork shares the parent but has no subagent origin.
    let fork = author(
        &*store,
        ordinary(SessionId::new(), parent, 1),
        completed_turn(1, vec![]),
    )
    .await;

    let entries = children(&rt, parent).await;
    assert_eq!(
        entries,
        [
            inactive(tie_a, "tie a"),
            inactive(tie_b, "tie b"),
            inactive(late, "late child")
        ]
    );
    assert!(!entries.iter().any(|entry| entry.id() == fork));
}

// LIST-08
#[actix_rt::test]
async fn a_live_child_without_its_descriptor_yet_is_omitted() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await.agent().id();
    // The creation window: the child is live and delegated, but its identity is not written yet.
    let _pending = live_child(&rt, parent, None).await;
    let entries = children(&rt, parent).await;
    assert!(entries.is_empty(), "{entries:?}");
}

// LIST-09
#[actix_rt::test]
async fn a_one_shot_child_is_listed_with_its_durable_creation_label() {
    let (store, rt, parent) = stored_parent().await;
    let labeled = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(
            SubagentDescriptor::one_shot("spawn", Some("labeled one-shot".into())).to_json(),
        ),
    )
    .await;
    assert_eq!(
        children(&rt, parent).await,
        [SubagentListEntry::Child {
            id: labeled,
            mode: DelegationMode::OneShot,
            label: Some("labeled one-shot".into()),
            activity: SubagentActivity::Inactive,
            has_children: false,
        }]
    );
}

// LIST-10
#[actix_rt::test]
async fn a_live_child_is_running_beside_a_settled_sibling_that_is_inactive() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await;
    let settled_id = settled_child(&rt, &parent, "settled child").await;
    let live = live_child(
        &rt,
        parent.agent().id(),
        Some(SubagentDescriptor::continuable("spawn", "live child")),
    )
    .await;
    let entries = children(&rt, parent.agent().id()).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert!(entries.contains(&inactive(settled_id, "settled child")));
    assert!(entries.contains(&running(live.agent().id(), "live child")));
}

// LIST-11
#[actix_rt::test]
async fn the_last_of_several_descriptors_names_the_child() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await;
    let healthy = settled_child(&rt, &parent, "healthy sibling").await;
    let doubled = author(
        &*store,
        delegated(SessionId::new(), parent.agent().id(), 1),
        completed_turn(
            1,
            vec![
                descriptor(continuable("twice")),
                descriptor(continuable("twice again")),
            ],
        ),
    )
    .await;
    // Last wins, and a repeated descriptor is no corruption.
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [
            inactive(doubled, "twice again"),
            inactive(healthy, "healthy sibling")
        ]
    );
}

// LIST-12
#[actix_rt::test]
async fn a_later_invalid_descriptor_turns_a_live_identity_into_a_serializable_null() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await.agent().id();
    // The setup's log is the live log: keeping a clone lets the test append after publication,
    // as a provider writing a second descriptor would.
    let slot: Arc<Mutex<Option<(SessionLog, u64)>>> = Arc::default();
    let keep = Arc::clone(&slot);
    let live = rt
        .agents()
        .create(CreateAgent::new().delegated_by(parent, 1).setup(
            move |_: &mut AgentScope, log: &SessionLog| {
                let seq =
                    log.append(SubagentDescriptor::continuable("spawn", "was valid").event())?;
                *keep.lock().unwrap() = Some((log.clone(), seq));
                Ok(None)
            },
        ))
        .await
        .unwrap();
    let (log, seq) = slot.lock().unwrap().clone().unwrap();
    let registry = rt.projections().expect("the runtime has projections");
    assert_eq!(
        registry.snapshot(live.agent().log()).unwrap().values[IDENTITY_UNIT],
        json!({"mode": "continuable", "label": "was valid", "seq": seq})
    );

    log.append(descriptor(
        json!({"version": 2, "mode": "continuable", "provider": 7}),
    ))
    .unwrap();
    let values = registry.snapshot(live.agent().log()).unwrap().values;
    assert_eq!(values[IDENTITY_UNIT], Value::Null);
    // A present null, not a missing key: a consumer of the wire form drops the stale identity.
    let wired: Value = serde_json::from_str(&serde_json::to_string(&values).unwrap()).unwrap();
    assert!(wired.as_object().unwrap().contains_key(IDENTITY_UNIT));
    assert!(wired[IDENTITY_UNIT].is_null());
    // Live with no identity reads as the creation window: omitted.
    let entries = children(&rt, parent).await;
    assert!(entries.is_empty(), "{entries:?}");
}

// LIST-13
#[actix_rt::test]
async fn a_settled_child_whose_later_descriptor_is_invalid_is_corrupt() {
    let (store, rt, parent) = stored_parent().await;
    let invalidated = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        completed_turn(
            1,
            vec![
                descriptor(continuable("was valid")),
                descriptor(json!({"version": 2, "mode": "continuable", "provider": 7})),
            ],
        ),
    )
    .await;
    assert_eq!(
        children(&rt, parent).await,
        [diagnostic(invalidated, SubagentDiagnosticReason::Corrupt)]
    );
}

// LIST-16
#[actix_rt::test]
async fn an_inspection_returning_another_lifecycle_is_corrupt_for_every_pinned_field() {
    /// Changes one pinned field of a header.
    type HeaderMutation = fn(&mut SessionHeader);
    let probe = ProbeStore::new();
    let rt = runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let healthy = settled_child(&rt, &parent, "healthy sibling").await;
    let reborn = author(
        &*probe,
        delegated(SessionId::new(), parent.agent().id(), 1),
        child_events(continuable("reborn child")),
    )
    .await;
    let mutations: [(&str, HeaderMutation); 7] = [
        ("version", |header: &mut SessionHeader| header.version += 1),
        ("id", |header: &mut SessionHeader| {
            header.id = SessionId::new()
        }),
        ("createdAt", |header: &mut SessionHeader| {
            header.created_at += 1
        }),
        ("cwd", |header: &mut SessionHeader| {
            header.cwd = Some(PathBuf::from("/elsewhere"));
        }),
        ("parentSession", |header: &mut SessionHeader| {
            header.parent_session = Some(SessionId::new());
        }),
        ("seedLength", |header: &mut SessionHeader| {
            header.seed_length = Some(header.seed_len() + 1);
        }),
        ("delegationDepth", |header: &mut SessionHeader| {
            header.delegation_depth = Some(header.delegation_depth.unwrap_or(0) + 1);
        }),
    ];
    for (field, mutate) in mutations {
        // The id was republished as another lifecycle between enumeration and inspection.
        probe.on_inspect(move |id, outcome| {
            let mut stored = outcome?;
            if id == reborn {
                mutate(&mut stored.header);
            }
            Ok(stored)
        });
        assert_eq!(
            children(&rt, parent.agent().id()).await,
            [
                diagnostic(reborn, SubagentDiagnosticReason::Corrupt),
                inactive(healthy, "healthy sibling"),
            ],
            "a different {field}"
        );
    }
}

/// Opens a closed store's directory as a raw sled database, waiting out the dropped store's
/// directory lock as `SledStore::open` does.
fn open_raw(path: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + SledStore::LOCK_WAIT;
    loop {
        match sled::open(path) {
            Ok(db) => break db,
            Err(error) if std::time::Instant::now() < deadline => {
                drop(error);
                std::thread::park_timeout(std::time::Duration::from_millis(5));
            }
            Err(error) => panic!("opening {}: {error}", path.display()),
        }
    }
}

// LIST-18 (adapted: the log the store refuses to hand out is a sled record that no longer decodes)
#[actix_rt::test]
async fn a_child_whose_log_the_store_refuses_to_read_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let parent = SessionId::new();
    let broken = SessionId::new();
    {
        let store = SledStore::open(dir.path()).unwrap();
        author(
            &store,
            delegated(broken, parent, 1),
            child_events(continuable("broken record")),
        )
        .await;
        store.flush(broken).await.unwrap();
    }
    // The row holding the descriptor (the creation's events, from seq 0) is torn; the header,
    // which enumeration reads, is intact.
    let mut key = broken.as_bytes().to_vec();
    key.extend_from_slice(&0u64.to_be_bytes());
    let db = open_raw(dir.path());
    db.open_tree("event_batches")
        .unwrap()
        .insert(key, b"{not json".to_vec())
        .unwrap();
    db.flush().unwrap();
    drop(db);

    let rt = runtime_over(Arc::new(SledStore::open(dir.path()).unwrap())).await;
    assert_eq!(
        children(&rt, parent).await,
        [diagnostic(broken, SubagentDiagnosticReason::Unavailable)]
    );
}

// LIST-19
#[actix_rt::test]
async fn a_malformed_descriptor_payload_is_corrupt() {
    let (store, rt, parent) = stored_parent().await;
    let malformed = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(json!({"version": 2, "mode": "continuable", "provider": 7})),
    )
    .await;
    assert_eq!(
        children(&rt, parent).await,
        [diagnostic(malformed, SubagentDiagnosticReason::Corrupt)]
    );
}

// LIST-20 (adapted: version 3 is this port's budgeted descriptor, so the unknown version is 99)
#[actix_rt::test]
async fn a_descriptor_of_an_unknown_version_is_corrupt() {
    let (store, rt, parent) = stored_parent().await;
    let future_child = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(json!({
            "version": 99, "mode": "continuable", "provider": "spawn", "label": "from the future"
        })),
    )
    .await;
    // Unclassifiable is not distinguished from malformed: no identity, and a settled child
    // without one is corrupt.
    assert_eq!(
        children(&rt, parent).await,
        [diagnostic(future_child, SubagentDiagnosticReason::Corrupt)]
    );
}

// A fork's seed replays its ancestor's descriptor, but that identity names the ancestor: a
// settled child with no descriptor of its own is damaged (this runtime stores every delegated
// child with its own descriptor), and is never listed as the resumable continuable child a
// follow-up would then refuse with NOT_RESUMABLE.
// LIST-21 (adapted: an inherited descriptor never names the child, on any rung, as a resume reads it)
#[actix_rt::test]
async fn a_fork_whose_only_descriptor_is_in_its_seed_is_corrupt() {
    let (store, rt, parent) = stored_parent().await;
    let fork_child = author(
        &*store,
        SessionHeader {
            seed_length: Some(3),
            ..delegated(SessionId::new(), parent, 1)
        },
        ancestor_seed(),
    )
    .await;
    assert_eq!(
        children(&rt, parent).await,
        [diagnostic(fork_child, SubagentDiagnosticReason::Corrupt)]
    );
    let error = rt
        .subagents()
        .followup(
            &rt.agents().get(parent).await.unwrap(),
            fork_child,
            text("go on"),
            subagents::FollowupOptions::new(subagents::MessageSource::User),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotResumable, "{error}");
}

// The same rule on the live rung: a live fork of a continuable child that has not written its
// own descriptor yet is inside its creation window (omitted), never its parent's identity.
#[actix_rt::test]
async fn a_live_fork_is_never_listed_under_its_seeded_ancestor_identity() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await.agent().id();
    let seed: Vec<SessionEvent> = ancestor_seed()
        .into_iter()
        .zip(0..)
        .map(|(kind, seq)| SessionEvent::new(seq, kind))
        .collect();
    let fork = |own: Option<SubagentDescriptor>| {
        rt.agents().create(
            CreateAgent::new()
                .delegated_by(parent, 1)
                .seed(seed.clone(), 3)
                .setup(move |_: &mut AgentScope, log: &SessionLog| {
                    if let Some(own) = own {
                        log.append(own.event())?;
                    }
                    Ok(None)
                }),
        )
    };
    let _pending = fork(None).await.expect("the live fork is created");
    let entries = children(&rt, parent).await;
    assert!(entries.is_empty(), "{entries:?}");
    // Once a fork wrote its own one-shot descriptor, that is who it is.
    let named = fork(Some(SubagentDescriptor::one_shot("fork", None)))
        .await
        .expect("the named fork is created");
    assert_eq!(
        children(&rt, parent).await,
        [SubagentListEntry::Child {
            id: named.agent().id(),
            mode: DelegationMode::OneShot,
            label: None,
            activity: SubagentActivity::Running,
            has_children: false,
        }]
    );
}

// LIST-22
#[actix_rt::test]
async fn children_of_an_unregistered_provider_stay_listed() {
    let (store, rt, parent) = stored_parent().await;
    let foreign = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(SubagentDescriptor::continuable("not-mounted", "orphan provider").to_json()),
    )
    .await;
    assert_eq!(
        children(&rt, parent).await,
        [inactive(foreign, "orphan provider")]
    );
}

// LIST-23
#[actix_rt::test]
async fn a_foreign_unit_failing_on_a_cold_child_makes_only_that_child_corrupt() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    rt.projections()
        .expect("the runtime has projections")
        .register(Arc::new(HostileProbe { panics: false }))
        .expect("the probe registers")
        .keep();
    let parent = root(&rt).await;
    let healthy = settled_child(&rt, &parent, "healthy sibling").await;
    let poisoned = author(
        &*store,
        delegated(SessionId::new(), parent.agent().id(), 1),
        child_events(continuable("poison me")),
    )
    .await;
    // The identity unit folds the poisoned child cleanly; the foreign unit's view fails, and the
    // damage stays with that one child.
    let expected = [
        diagnostic(poisoned, SubagentDiagnosticReason::Corrupt),
        inactive(healthy, "healthy sibling"),
    ];
    assert_eq!(children(&rt, parent.agent().id()).await, expected);
    // A cached record whose foreign row fails to render is no answer either: the child goes to
    // the inspection and is diagnosed there, not served from its cached identity.
    let header = store.header(poisoned).await.unwrap();
    store
        .cache_put(
            CHECKPOINT_RECORD,
            poisoned,
            record(
                &header,
                json!({
                    IDENTITY_UNIT: {"ver": 2, "seq": 0, "val": {"mode": "continuable", "label": "poison me", "seq": 0}},
                    "subagentListHostileProbe": {"ver": 1, "seq": 0, "val": {"poisoned": true}},
                }),
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(children(&rt, parent.agent().id()).await, expected);
}

// LIST-24
#[actix_rt::test]
async fn a_foreign_unit_failing_on_a_live_child_makes_only_that_child_corrupt() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    // This time the view panics: the registry contains a panic like an error.
    rt.projections()
        .expect("the runtime has projections")
        .register(Arc::new(HostileProbe { panics: true }))
        .expect("the probe registers")
        .keep();
    let parent = root(&rt).await.agent().id();
    let poisoned = live_child(
        &rt,
        parent,
        Some(SubagentDescriptor::continuable("spawn", "poison me")),
    )
    .await;
    let healthy = live_child(
        &rt,
        parent,
        Some(SubagentDescriptor::continuable("spawn", "live healthy")),
    )
    .await;
    let entries = children(&rt, parent).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert!(entries.contains(&diagnostic(
        poisoned.agent().id(),
        SubagentDiagnosticReason::Corrupt
    )));
    assert!(entries.contains(&running(healthy.agent().id(), "live healthy")));
}

// LIST-25
#[actix_rt::test]
async fn a_failing_store_listing_fails_the_whole_listing_with_its_own_error() {
    let (probe, rt, parent) = probed_parent().await;
    author(
        &*probe,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("never listed")),
    )
    .await;
    let failure = SubagentError::new(ErrorCode::StoreIo, "backend listing failed");
    probe.fail_list(failure.clone());
    // No cancellation in flight: the backend's error is the listing's, not a diagnostic row.
    let error = within(
        "the failed listing",
        rt.subagents()
            .list_children(parent, CancellationToken::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(error, failure);
}

// LIST-26
#[actix_rt::test]
async fn a_failed_cold_inspection_is_one_unavailable_row_and_is_retried_by_the_next_listing() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = runtime_over(faults.clone()).await;
    let parent = root(&rt).await;
    let healthy = settled_child(&rt, &parent, "healthy sibling").await;
    let flaky = author(
        &*faults,
        delegated(SessionId::new(), parent.agent().id(), 1),
        child_events(continuable("flaky storage")),
    )
    .await;
    faults.arm_for(StoreOperation::Inspect, flaky);
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [
            diagnostic(flaky, SubagentDiagnosticReason::Unavailable),
            inactive(healthy, "healthy sibling"),
        ]
    );
    // Nothing was memoized: with the store healthy again, the same child is named.
    faults.disarm(StoreOperation::Inspect);
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [
            inactive(flaky, "flaky storage"),
            inactive(healthy, "healthy sibling")
        ]
    );
}

// LIST-27
#[actix_rt::test]
async fn compacted_and_uncompacted_children_are_listed_identically() {
    let (store, rt, parent) = stored_parent().await;
    let plain = author(
        &*store,
        delegated(SessionId::new(), parent, 1),
        child_events(continuable("twin child")),
    )
    .await;
    // The compacted twin: a summary replaces the surface history, while the append-only log
    // keeps the model-hidden descriptor.
    let header = delegated(SessionId::new(), parent, 2);
    let twin = header.id;
    let mut events: Vec<Arc<SessionEvent>> = child_events(continuable("twin child"))
        .into_iter()
        .zip(0u64..)
        .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
        .collect();
    let mut summary = SessionEvent::new(
        3,
        EventKind::UserMessage(subagents::Message::user(
            text("summary of everything"),
            subagents::MessageSource::Plugin {
                plugin: "compact".into(),
            },
        )),
    );
    summary.surface_op = Some(subagents::session::SurfaceOp::Replace { start: 0, end: 0 });
    summary.source_event_seqs = vec![1].into();
    events.push(Arc::new(summary));
    store.create(header, events).await.unwrap();
    assert_eq!(
        children(&rt, parent).await,
        [inactive(plain, "twin child"), inactive(twin, "twin child")]
    );
}

// LIST-28
#[actix_rt::test]
async fn an_origin_classified_grandchild_sets_has_children_without_being_inspected() {
    let probe = ProbeStore::new();
    // Without the cache the child is inspected, which shows the grandchild is not.
    let rt = uncached_runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "direct child").await;
    let grandchild = author(
        &*probe,
        delegated(SessionId::new(), child, 1),
        child_events(continuable("grandchild")),
    )
    .await;
    probe.forget_inspections();
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [SubagentListEntry::Child {
            id: child,
            mode: DelegationMode::Continuable,
            label: Some("direct child".into()),
            activity: SubagentActivity::Inactive,
            has_children: true,
        }]
    );
    assert_eq!(
        probe.inspected(),
        [child],
        "the grandchild gave only its header"
    );
    assert_eq!(probe.inspections_of(grandchild), 0);
}

// LIST-29 LIST-32
#[actix_rt::test]
async fn each_cold_child_is_inspected_once_and_a_live_child_never() {
    let probe = ProbeStore::new();
    // No cache: every cold child takes the inspection rung directly.
    let rt = uncached_runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let pid = parent.agent().id();
    let cold_started = settled_child(&rt, &parent, "cold started child").await;
    let authored_header = delegated(SessionId::new(), pid, 1);
    let cold_authored = author(
        &*probe,
        authored_header.clone(),
        child_events(continuable("cold authored child")),
    )
    .await;
    // A usable cache row is ignored when the runtime reads no cache (LIST-32).
    cache_identity(
        &*probe,
        &authored_header,
        1,
        json!({"mode": "continuable", "label": "cached label", "seq": 1}),
    )
    .await;
    let live = live_child(
        &rt,
        pid,
        Some(SubagentDescriptor::continuable("spawn", "live mixed child")),
    )
    .await;
    probe.forget_inspections();

    let entries = children(&rt, pid).await;
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert!(entries.contains(&inactive(cold_started, "cold started child")));
    assert!(entries.contains(&inactive(cold_authored, "cold authored child")));
    assert!(entries.contains(&running(live.agent().id(), "live mixed child")));
    assert_eq!(probe.inspections_of(cold_started), 1);
    assert_eq!(probe.inspections_of(cold_authored), 1);
    assert_eq!(
        probe.inspections_of(live.agent().id()),
        0,
        "served from its live snapshot"
    );
}

// LIST-34
#[actix_rt::test]
async fn an_ordinary_grandchild_does_not_count_as_a_child() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "direct child").await;
    author(
        &*store,
        ordinary(SessionId::new(), child, 1),
        completed_turn(1, vec![]),
    )
    .await;
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [inactive(child, "direct child")]
    );
}

// LIST-35
#[actix_rt::test]
async fn a_diagnosed_grandchild_still_counts_as_a_child() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "direct child").await;
    let corrupt = author(
        &*store,
        delegated(SessionId::new(), child, 1),
        child_events(json!({"version": 2, "mode": "continuable", "provider": 7})),
    )
    .await;
    assert_eq!(
        children(&rt, child).await,
        [diagnostic(corrupt, SubagentDiagnosticReason::Corrupt)]
    );
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [SubagentListEntry::Child {
            id: child,
            mode: DelegationMode::Continuable,
            label: Some("direct child".into()),
            activity: SubagentActivity::Inactive,
            has_children: true,
        }]
    );
}

// LIST-41 LIST-44
#[actix_rt::test]
async fn a_parent_without_children_lists_nothing() {
    let rt = runtime_over(Arc::new(MemoryStore::new())).await;
    let parent = root(&rt).await.agent().id();
    let entries = children(&rt, parent).await;
    assert!(entries.is_empty(), "{entries:?}");
    let entries = descendants(&rt, parent).await;
    assert!(entries.is_empty(), "{entries:?}");
}
