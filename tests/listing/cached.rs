//! The checkpoint cache rung: served behind the seq gate, or silently fallen through.

use super::*;

// LIST-14
#[actix_rt::test]
async fn a_cached_identity_from_the_childs_own_suffix_is_served_without_inspection() {
    let (probe, rt, parent) = probed_parent().await;
    let header = delegated(SessionId::new(), parent, 1);
    let child = author(
        &*probe,
        header.clone(),
        child_events(continuable("disk label")),
    )
    .await;
    // seq 1 >= seedLength 0: the row came from the child's own descriptor, so it is final. Its
    // label differs from the log's to show the row, not the log, produced the entry.
    cache_identity(
        &*probe,
        &header,
        1,
        json!({"mode": "continuable", "label": "cached own", "seq": 1}),
    )
    .await;
    assert_eq!(children(&rt, parent).await, [inactive(child, "cached own")]);
    assert!(probe.inspected().is_empty());
}

// LIST-15
#[actix_rt::test]
async fn a_cached_ancestor_identity_from_the_fork_seed_is_refused() {
    let (probe, rt, parent) = probed_parent().await;
    // The seed replays the ancestor's descriptor at seq 1; the child's own lands at seq 5.
    let mut events = ancestor_seed();
    events.extend(completed_turn(
        2,
        vec![descriptor(continuable("own label"))],
    ));
    let header = SessionHeader {
        seed_length: Some(3),
        ..delegated(SessionId::new(), parent, 1)
    };
    let child = author(&*probe, header.clone(), events).await;
    // A creation-window checkpoint caught the ancestor identity: seq 1 < seedLength 3.
    cache_identity(
        &*probe,
        &header,
        3,
        json!({"mode": "continuable", "label": "ancestor label", "seq": 1}),
    )
    .await;
    assert_eq!(children(&rt, parent).await, [inactive(child, "own label")]);
    assert_eq!(probe.inspections_of(child), 1);
}

// LIST-17
#[actix_rt::test]
async fn a_cached_null_identity_lets_the_inspection_rule() {
    let (probe, rt, parent) = probed_parent().await;
    let header = delegated(SessionId::new(), parent, 1);
    let child = author(
        &*probe,
        header.clone(),
        child_events(continuable("actually valid")),
    )
    .await;
    // A stale sentinel must not outrank the authoritative refold.
    cache_identity(&*probe, &header, 0, Value::Null).await;
    assert_eq!(
        children(&rt, parent).await,
        [inactive(child, "actually valid")]
    );
    assert_eq!(probe.inspections_of(child), 1);
}

// LIST-30
#[actix_rt::test]
async fn a_settled_child_is_served_from_its_checkpoint_without_any_inspection() {
    let probe = ProbeStore::new();
    let rt = runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "cached child").await;
    // The turn end writes the checkpoint on its own task, after the events reached the store:
    // wait for the row rather than assume it.
    let record = within("the child's checkpoint record", async {
        loop {
            if let Some(record) = probe.cache_get(CHECKPOINT_RECORD, child).await.unwrap() {
                break record;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let header = probe.header(child).await.unwrap();
    assert_eq!(record["identity"]["createdAt"], header.created_at);
    let row = &record["rows"][IDENTITY_UNIT];
    assert_eq!(row["ver"], 2);
    assert_eq!(row["val"]["mode"], "continuable");
    assert_eq!(row["val"]["label"], "cached child");
    assert_eq!(
        record["rows"][TIMING_UNIT]["ver"], 2,
        "every unit has its row"
    );

    probe.forget_inspections();
    assert_eq!(
        children(&rt, parent.agent().id()).await,
        [inactive(child, "cached child")]
    );
    // A restarted runtime over the same store reads the same row.
    let restarted = runtime_over(probe.clone()).await;
    assert_eq!(
        children(&restarted, parent.agent().id()).await,
        [inactive(child, "cached child")]
    );
    assert!(probe.inspected().is_empty(), "{:?}", probe.inspected());
}

// LIST-31
#[actix_rt::test]
async fn without_a_usable_cached_identity_the_child_is_inspected() {
    let (probe, rt, parent) = probed_parent().await;
    let header = delegated(SessionId::new(), parent, 1);
    let child = author(
        &*probe,
        header.clone(),
        child_events(continuable("uncached child")),
    )
    .await;
    let expected = [inactive(child, "uncached child")];
    let stale = json!({"mode": "continuable", "label": "stale label", "seq": 1});

    // No row at all: a child this process never ran.
    assert_eq!(children(&rt, parent).await, expected);
    assert_eq!(probe.inspections_of(child), 1);

    // A record with another unit's row only: no identity among the cached values.
    probe
        .cache_put(
            CHECKPOINT_RECORD,
            child,
            record(
                &header,
                json!({TIMING_UNIT: {"ver": 2, "seq": 0, "val": {"descriptorSeen": false, "settledMs": 0}}}),
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(children(&rt, parent).await, expected);
    assert_eq!(probe.inspections_of(child), 2);

    // An identity row that does not decode, a record of another lifecycle, and a row of
    // another state version are no answer either.
    let mut other_lifecycle = header.clone();
    other_lifecycle.created_at += 1;
    for row in [
        record(&header, json!({IDENTITY_UNIT: {"ver": 2, "seq": 1}})),
        record(
            &other_lifecycle,
            json!({IDENTITY_UNIT: {"ver": 2, "seq": 1, "val": stale.clone()}}),
        ),
        record(
            &header,
            json!({IDENTITY_UNIT: {"ver": 1, "seq": 1, "val": stale.clone()}}),
        ),
    ] {
        let before = probe.inspections_of(child);
        probe
            .cache_put(CHECKPOINT_RECORD, child, row.clone(), None)
            .await
            .unwrap();
        assert_eq!(children(&rt, parent).await, expected, "row {row}");
        assert_eq!(probe.inspections_of(child), before + 1, "row {row}");
    }
}

// LIST-33
#[actix_rt::test]
async fn a_failing_cache_read_silently_falls_through_to_inspection() {
    let (probe, rt, parent) = probed_parent().await;
    let header = delegated(SessionId::new(), parent, 1);
    let child = author(
        &*probe,
        header.clone(),
        child_events(continuable("recovered child")),
    )
    .await;
    cache_identity(
        &*probe,
        &header,
        1,
        json!({"mode": "continuable", "label": "unreadable label", "seq": 1}),
    )
    .await;
    // The cache is derived data: its failure is no verdict and no error.
    probe.fail_cache_reads();
    assert_eq!(
        children(&rt, parent).await,
        [inactive(child, "recovered child")]
    );
    assert_eq!(probe.inspections_of(child), 1);
}

#[actix_rt::test]
async fn a_runtime_without_the_cache_writes_no_checkpoint() {
    let probe = ProbeStore::new();
    let rt = uncached_runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let child = settled_child(&rt, &parent, "uncached child").await;
    // The disposal's write, when there is one, lands before the child leaves the registry.
    released(&rt, child).await;
    assert_eq!(
        probe.cache_get(CHECKPOINT_RECORD, child).await.unwrap(),
        None
    );
}

#[actix_rt::test]
async fn a_long_turn_is_checkpointed_before_it_ends() {
    let gate = subagents::testing::Gate::new();
    let model = ScriptedModel::new();
    // Enough tool steps in one turn to pass the step-end throttle's event count.
    for call in 0..60 {
        model.push(ScriptStep::tool_call(
            &format!("call-{call}"),
            "noop",
            json!({}),
        ));
    }
    model.push(ScriptStep::text("done").gated(&gate));
    let noop = subagents::Tool::new(
        "noop",
        "Does nothing.",
        json!({"type": "object"}),
        |_, _| async { Ok(subagents::ToolOutput::text("ok")) },
    );
    let probe = ProbeStore::new();
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model).tool(noop),
        probe.clone(),
    )
    .await;
    let parent = root(&rt).await;
    let child = crate::support::start_continuable(&rt, parent.agent(), "work long")
        .await
        .child_id;
    gate.reached().await;
    // The turn is still open: only the step-end throttle can have written this record.
    let record = within("a checkpoint inside the turn", async {
        loop {
            if let Some(record) = probe.cache_get(CHECKPOINT_RECORD, child).await.unwrap() {
                break record;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        record["rows"][TIMING_UNIT]["val"]["active"].is_object(),
        "taken inside the open turn: {record:#}"
    );
    assert_eq!(record["rows"][IDENTITY_UNIT]["val"]["label"], "child task");
    within("shutdown", rt.shutdown()).await.unwrap();
}

#[actix_rt::test]
async fn a_one_shot_child_is_not_checkpointed_and_is_named_from_its_creation() {
    let probe = ProbeStore::new();
    let rt = runtime_over(probe.clone()).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "finish once").await;
    within("the one-shot result", run.result()).await.unwrap();
    let child = run.id();
    within("the one-shot disposal", run.dispose())
        .await
        .unwrap();
    // The delegation hot path writes no checkpoint: a cold one-shot child is named from the
    // descriptor its creation stored, without inspecting (decoding) its whole log.
    assert_eq!(
        probe.cache_get(CHECKPOINT_RECORD, child).await.unwrap(),
        None
    );
    let entries = children(&rt, parent.agent().id()).await;
    assert!(matches!(
        entries[..],
        [SubagentListEntry::Child { id, mode: DelegationMode::OneShot, .. }] if id == child
    ));
    assert_eq!(probe.inspections_of(child), 0);
}

/// A child resumed epoch after epoch starts each resumed epoch's projection from its
/// checkpoint record once its log is long, rather than folding the whole log again: after
/// twenty cold resumes its record still covers its whole stored log and says, unit by unit,
/// what the fold of that log says.
#[actix_rt::test]
async fn a_child_resumed_from_its_checkpoint_keeps_the_record_the_fold_of_its_log_gives() {
    let store = Arc::new(MemoryStore::new());
    let rt = runtime_over(store.clone()).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let child = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "long-lived",
            parent.agent(),
            text("epoch 0"),
        ))
        .await
        .expect("the child starts")
        .child_id;
    for epoch in 1..=20 {
        settled(&recorder, child, epoch).await;
        released(&rt, child).await;
        rt.subagents()
            .followup(
                parent.agent(),
                child,
                text(&format!("epoch {epoch}")),
                subagents::FollowupOptions::new(subagents::MessageSource::User),
            )
            .await
            .expect("the follow-up cold-resumes the child");
    }
    settled(&recorder, child, 21).await;
    released(&rt, child).await;

    let events = store.read_from(child, 0).await.unwrap();
    assert!(
        events.len() > 2 * 64,
        "{} events: the later resumes start from the record",
        events.len()
    );
    let record = store
        .cache_get(CHECKPOINT_RECORD, child)
        .await
        .unwrap()
        .expect("the child's checkpoint record");
    let registry = subagents::projection::ProjectionRegistry::with_seam_units();
    let folded = registry.fold(&events).expect("the log folds");
    for unit in [IDENTITY_UNIT, TIMING_UNIT] {
        let row = &record["rows"][unit];
        assert_eq!(row["seq"], events.len() - 1, "{unit} covers the whole log");
        let row = subagents::projection::CheckpointRow {
            key: unit.to_owned(),
            version: u32::try_from(row["ver"].as_u64().expect("a version")).unwrap(),
            seq: row["seq"].as_u64().expect("a seq"),
            state: row["val"].clone(),
        };
        let view = registry.view_row(&row).expect("a unit of the registry");
        assert_eq!(view.expect("a view"), folded.values[unit], "{unit}");
    }
}
