//! Killing a writer process mid-turn: every flushed event survives, the interrupted turn is
//! repaired on load, and the session resumes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use futures::executor::block_on;
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, EventKind, ResumeAgent, Runtime, SessionHeader, SessionId, SessionPersistence,
    SledStore, TurnEndReason,
};

use crate::support::{run_prompt, turn_ends, types};

/// A runtime over the reopened `store` that resumes session `id` (the surviving log must be
/// whole and resumable).
async fn resume_on(
    store: SledStore,
    id: SessionId,
    model: &ScriptedModel,
) -> (Runtime, AgentHandle) {
    let rt = Runtime::builder()
        .store(store)
        .model("scripted", model.clone())
        .build()
        .unwrap();
    let resumed = rt
        .agents()
        .resume(ResumeAgent::new(id))
        .await
        .expect("the surviving session is resumable");
    (rt, resumed)
}

/// Starts `subagents demo` with `args` over `store`; its stdout arrives line by line.
fn spawn_demo(
    args: &[&str],
    store: impl AsRef<std::ffi::OsStr>,
) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("demo")
        .args(args)
        .arg("--store")
        .arg(store)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (child, received)
}

/// Starts `subagents demo --stall`, waits until it reports the tool step durable, and kills
/// it with SIGKILL. Returns the session id it printed.
fn run_and_kill(store: &std::path::Path) -> SessionId {
    let (mut child, received) = spawn_demo(&["--stall"], store);
    let line = received
        .recv_timeout(Duration::from_secs(60))
        .expect("the demo reports its stall (safety net: 60 s)");
    let id = line
        .strip_prefix("stalled ")
        .expect("a `stalled <id>` line")
        .parse()
        .expect("a session id");
    child.kill().expect("SIGKILL delivered");
    child.wait().expect("the killed child is reaped");
    id
}

#[test]
fn a_killed_writer_loses_no_flushed_event_and_its_turn_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let id = run_and_kill(dir.path());

    let store = SledStore::open(dir.path()).expect("the store reopens after the crash");
    let raw = block_on(store.read_from(id, 0)).unwrap();
    let first_step_end = raw
        .iter()
        .position(|e| matches!(e.kind, EventKind::StepEnd { turn: 1, step: 1 }))
        .expect("the flushed tool step is on disk");
    let durable = types(&raw[..=first_step_end]);
    assert_eq!(
        durable[3..],
        [
            "step/start",
            "user/message",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end"
        ],
        "every event of the flushed step survived"
    );
    assert!(turn_ends(&raw).is_empty(), "the process died inside turn 1");

    let inspected = block_on(store.inspect(id)).unwrap();
    assert_eq!(turn_ends(&inspected.events), [TurnEndReason::Interrupted]);
    assert_eq!(inspected.header.id, id);

    actix::System::new().block_on(async move {
        let model = ScriptedModel::with_script([ScriptStep::text("back again")]);
        let (rt, resumed) = resume_on(store, id, &model).await;
        run_prompt(resumed.agent(), "are you there?").await;
        let events = resumed.agent().log().events();
        assert_eq!(
            turn_ends(&events),
            [TurnEndReason::Interrupted, TurnEndReason::Completed]
        );
        assert!(events
            .iter()
            .any(|e| matches!(e.kind, EventKind::TurnStart { turn: 2 })));
        let history = &model.requests()[0].messages;
        assert_eq!(
            history.first().map(|m| m.text()).as_deref(),
            Some("How many words are in \"the quick brown fox jumps over the lazy dog\"?")
        );
        resumed.dispose().await.unwrap();
        let stored = rt.store().unwrap().read_from(id, 0).await.unwrap();
        assert_eq!(
            stored.len(),
            events.len(),
            "disposal drained the resumed turn into the store"
        );
    });
}

/// Starts `subagents demo --burst`, reads `flushed <id> <events>` lines until `acknowledged`
/// flushes were reported, and kills it with SIGKILL while it keeps writing. Returns the session
/// id and the largest acknowledged event count.
fn burst_and_kill(store: &std::path::Path, acknowledged: usize) -> (SessionId, u64) {
    let (mut child, received) = spawn_demo(&["--burst", "100000"], store);
    let mut last = None;
    for _ in 0..acknowledged {
        let line = received
            .recv_timeout(Duration::from_secs(60))
            .expect("the demo reports a flush (safety net: 60 s)");
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("flushed"), "{line}");
        let id: SessionId = words.next().expect("an id").parse().expect("a session id");
        let events: u64 = words.next().expect("a count").parse().expect("a number");
        last = Some((id, events));
    }
    // The process is mid-burst: its next turns are being written as it dies.
    child.kill().expect("SIGKILL delivered");
    child.wait().expect("the killed child is reaped");
    last.expect("at least one flush was acknowledged")
}

#[test]
fn a_write_burst_killed_mid_flight_keeps_every_acknowledged_event_and_no_torn_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (id, acknowledged) = burst_and_kill(dir.path(), 5);

    let store = SledStore::open(dir.path()).expect("the store reopens after the crash");
    let raw = block_on(store.read_from(id, 0)).expect("every stored event decodes");
    let stored = u64::try_from(raw.len()).unwrap();
    assert!(
        stored >= acknowledged,
        "every acknowledged event is present: {stored} < {acknowledged}"
    );
    for (event, seq) in raw.iter().zip(0..) {
        assert_eq!(event.seq, seq, "seqs run without gaps");
    }
    assert!(
        turn_ends(&raw[..usize::try_from(acknowledged).unwrap()])
            .iter()
            .all(|reason| *reason == TurnEndReason::Completed),
        "the acknowledged turns completed"
    );
    // What survived past the last acknowledgement is whole batches: the log (repaired in memory
    // at most for its last, interrupted turn) keeps every invariant, so it resumes.
    actix::System::new().block_on(async move {
        let model = ScriptedModel::with_script([ScriptStep::text("after the crash")]);
        let (_rt, resumed) = resume_on(store, id, &model).await;
        let events = run_prompt(resumed.agent(), "still there?").await;
        assert_eq!(turn_ends(&events).last(), Some(&TurnEndReason::Completed));
        resumed.dispose().await.unwrap();
    });
}

/// The ids `subagents demo --forest` printed: the root, then the child, grandchild and
/// great-grandchild of one branch, then the second (mid-turn) child.
struct Forest {
    root: SessionId,
    child: SessionId,
    grandchild: SessionId,
    great_grandchild: SessionId,
    busy_child: SessionId,
}

/// Starts `subagents demo --forest`, waits until it reports the forest durable, and kills it
/// with SIGKILL.
fn grow_and_kill(store: impl AsRef<std::ffi::OsStr>, extra: &[&str]) -> Forest {
    let args: Vec<&str> = ["--forest"].iter().chain(extra).copied().collect();
    let (mut child, received) = spawn_demo(&args, store);
    let line = received
        .recv_timeout(Duration::from_secs(60))
        .expect("the demo reports its forest (safety net: 60 s)");
    let ids: Vec<SessionId> = line
        .strip_prefix("forest ")
        .expect("a `forest <ids>` line")
        .split_whitespace()
        .map(|id| id.parse().expect("a session id"))
        .collect();
    child.kill().expect("SIGKILL delivered");
    child.wait().expect("the killed child is reaped");
    let [root, child, grandchild, great_grandchild, busy_child] = ids[..] else {
        panic!("five ids expected, got {line}");
    };
    Forest {
        root,
        child,
        grandchild,
        great_grandchild,
        busy_child,
    }
}

fn texts<E: std::borrow::Borrow<subagents::SessionEvent>>(events: &[E]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.borrow().kind {
            EventKind::UserMessage(message)
                if !matches!(message.source, subagents::MessageSource::Plugin { .. }) =>
            {
                Some(message.text())
            }
            EventKind::AssistantMessage { message, .. } => Some(message.text()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_killed_forest_resumes_a_grandchild_through_its_parent_from_its_last_flushed_event() {
    let dir = tempfile::tempdir().unwrap();
    let forest = grow_and_kill(dir.path(), &[]);
    let store = SledStore::open(dir.path()).expect("the store reopens after the crash");
    actix::System::new().block_on(resume_killed_forest(std::sync::Arc::new(store), forest));
}

#[test]
fn a_forest_killed_on_postgres_resumes_in_another_process_once_its_leases_expire() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let forest = grow_and_kill(&url, &["--lease-ttl-ms", "300"]);
    // The dead process's leases hold until they expire (their time-to-live, unrenewed).
    std::thread::sleep(Duration::from_millis(700));
    actix::System::new().block_on(async move {
        let store = subagents::store::PostgresStore::connect(&url)
            .await
            .expect("the database is there after the crash");
        resume_killed_forest(std::sync::Arc::new(store), forest).await;
    });
}

/// What a killed forest's store must let another runtime do: every node's flushed
/// conversation is there, a node that died mid-turn is repaired, and a grandchild resumes
/// through its cold parent from its last flushed event, resident once.
async fn resume_killed_forest(store: std::sync::Arc<dyn SessionPersistence>, forest: Forest) {
    // What the dead process made durable: each node's conversation so far.
    let before = store.read_from(forest.grandchild, 0).await.unwrap();
    assert_eq!(
        texts(&before),
        ["grandchild: work on your part", "grandchild answered"]
    );
    for mid_turn in [forest.great_grandchild, forest.busy_child] {
        let inspected = store.inspect(mid_turn).await.unwrap();
        assert_eq!(
            turn_ends(&inspected.events),
            [TurnEndReason::Interrupted],
            "a node that died mid-turn is repaired on load"
        );
    }
    let child_gate = subagents::testing::Gate::new();
    let model = ScriptedModel::new();
    // The child's resumed turn holds, so it stays resident while its own child is resumed.
    model.push(ScriptStep::text("child again").gated(&child_gate));
    model.push(ScriptStep::text("grandchild again"));
    let rt =
        crate::support::seam_runtime_on(Runtime::builder().model("scripted", model.clone()), store)
            .await;
    let root = rt
        .agents()
        .resume(ResumeAgent::new(forest.root))
        .await
        .expect("the root resumes");
    let recorder = crate::support::SeamRecorder::new(&rt, subagents::EventScope::All);
    // The grandchild's parent is cold too: the root wakes it first.
    crate::support::followup_child(&rt, root.agent(), forest.child, "child: carry on")
        .await
        .expect("the child cold-resumes");
    child_gate.reached().await;
    let child = rt
        .agents()
        .get(forest.child)
        .await
        .expect("the child is live");
    crate::support::followup_child(&rt, &child, forest.grandchild, "grandchild: and now?")
        .await
        .expect("the grandchild cold-resumes through its live parent");
    crate::support::settled(&recorder, forest.grandchild, 1).await;
    // The grandchild's conversation continued from its last flushed event.
    let request = model
        .requests()
        .into_iter()
        .find(|request| request.session_id == Some(forest.grandchild))
        .expect("the grandchild asked its model");
    let history: Vec<String> = request
        .messages
        .messages()
        .filter(|message| !matches!(message.source, subagents::MessageSource::Plugin { .. }))
        .map(subagents::Message::text)
        .collect();
    assert!(
        history.ends_with(&[
            "grandchild: work on your part".to_owned(),
            "grandchild answered".to_owned(),
            "grandchild: and now?".to_owned(),
        ]),
        "{history:?}"
    );
    let after = rt
        .store()
        .unwrap()
        .read_from(forest.grandchild, 0)
        .await
        .unwrap();
    assert_eq!(
        after[..before.len()],
        before[..],
        "nothing flushed was lost"
    );
    assert_eq!(
        texts(&after[before.len()..]),
        ["grandchild: and now?", "grandchild again"]
    );
    assert!(after
        .iter()
        .any(|event| matches!(event.kind, EventKind::TurnStart { turn: 2 })));
    // No session is resident twice: the child is this runtime's one Activation of it,
    // and nothing else may load it while it lives.
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 1);
    let twice = rt
        .agents()
        .resume(ResumeAgent::new(forest.child))
        .await
        .expect_err("a resident child cannot be loaded again");
    assert_eq!(twice.code(), subagents::ErrorCode::DuplicateAgent);
    child_gate.release();
    crate::support::settled(&recorder, forest.child, 1).await;
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    root.dispose().await.unwrap();
}

/// Runs `subagents tree` over `store` with `args`; its standard output.
fn tree(store: &std::path::Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("tree")
        .args(args)
        .arg("--store")
        .arg(store)
        .output()
        .expect("the binary runs");
    crate::support::assert_succeeded(&output);
    String::from_utf8(output.stdout).expect("utf-8 output")
}

#[test]
fn the_tree_command_prints_a_killed_forest_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let forest = grow_and_kill(dir.path(), &[]);
    let trees: serde_json::Value = serde_json::from_str(&tree(dir.path(), &["--json"])).unwrap();
    assert_eq!(trees.as_array().map(Vec::len), Some(1), "{trees:#}");
    assert_eq!(trees[0]["root"], forest.root.to_string());
    let rows: Vec<(String, String, u64, String, String)> = trees[0]["descendants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["id"].as_str().unwrap().to_owned(),
                row["parentId"].as_str().unwrap().to_owned(),
                row["depth"].as_u64().unwrap(),
                row["label"].as_str().unwrap().to_owned(),
                row["activity"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let row = |id: SessionId, parent: SessionId, depth: u64, label: &str| {
        (
            id.to_string(),
            parent.to_string(),
            depth,
            label.to_owned(),
            "inactive".to_owned(),
        )
    };
    assert_eq!(
        rows,
        [
            row(forest.child, forest.root, 1, "child"),
            row(forest.grandchild, forest.child, 2, "grandchild"),
            row(
                forest.great_grandchild,
                forest.grandchild,
                3,
                "great-grandchild"
            ),
            row(forest.busy_child, forest.root, 1, "busy child"),
        ],
        "pre-order, with the dead process's mid-turn nodes listed like the rest"
    );
    // One JSON shape whether or not a root is named; a root with no children is a root with
    // none (it printed `[]` or `null` before).
    let named: serde_json::Value =
        serde_json::from_str(&tree(dir.path(), &["--json", &forest.root.to_string()])).unwrap();
    assert_eq!(named, trees);
    let leaf = forest.great_grandchild.to_string();
    let lone: serde_json::Value =
        serde_json::from_str(&tree(dir.path(), &["--json", &leaf])).unwrap();
    assert_eq!(lone, serde_json::json!([{"root": leaf, "descendants": []}]));
    assert_eq!(
        tree(dir.path(), &[&leaf]).lines().collect::<Vec<_>>(),
        [leaf.as_str(), "  (no delegated children)"]
    );
    // The text form of one subtree: indented by depth below its root.
    let text = tree(dir.path(), &[&forest.grandchild.to_string()]);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            forest.grandchild.to_string(),
            format!(
                "  {}  continuable  inactive  \"great-grandchild\"",
                forest.great_grandchild
            ),
        ]
    );
}

/// The size of everything under `dir`, in bytes.
fn size_of_dir(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| match entry.metadata() {
                    Ok(meta) if meta.is_dir() => size_of_dir(&entry.path()),
                    Ok(meta) => meta.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

// Ctrl-C during `load` stops it growing: what runs drains, the partial report says it was
// interrupted and verifies (every child it started listed, none corrupt, nothing live), and
// the command exits 130. It is sent once the store holds part of the run (polled: nothing
// announces a moment of the run to another process).
#[test]
fn ctrl_c_during_load_drains_reports_what_grew_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let load = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--roots", "1", "--children", "1000000"])
        .arg("--store-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the load binary starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while size_of_dir(dir.path()) < 2 << 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = rustix::process::Pid::from_raw(i32::try_from(load.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let output = load.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(130),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("INTERRUPTED"), "{stdout}");
    assert!(stdout.contains("verification passed"), "{stdout}");
    assert!(
        !stdout.contains("1,000,000 ="),
        "stopped before the whole scenario: {stdout}"
    );
    let trees: serde_json::Value = serde_json::from_str(&tree(dir.path(), &["--json"])).unwrap();
    let printed = trees.to_string();
    assert!(
        printed.contains("\"mode\""),
        "children were listed: {printed}"
    );
    assert!(!printed.contains("diagnostic"), "none corrupt: {printed}");
}

// An interrupted creation is not a damaged child: a load run killed while fork children are
// being created leaves a tree with no diagnostic row (every delegated child is stored whole,
// with the descriptor that names it, or not at all).
#[test]
fn a_load_run_killed_mid_creation_leaves_no_damaged_child() {
    for (round, grown) in [(0, 2 << 20)] {
        let dir = tempfile::tempdir().unwrap();
        let mut load = Command::new(env!("CARGO_BIN_EXE_subagents"))
            .args(["load", "--roots", "2", "--children", "4000", "--depth", "2"])
            .args(["--fork-share", "1", "--continuable-share", "0.3"])
            .args(["--latency", "0..3", "--seed", &round.to_string()])
            .arg("--store-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the load binary starts");
        // Killed once the store holds part of the run: nothing announces a moment inside a
        // creation, so the store's growth is polled (any moment must leave a clean tree).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while size_of_dir(dir.path()) < grown
            && load.try_wait().unwrap().is_none()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            load.try_wait().unwrap().is_none(),
            "the run is still creating children when it is killed"
        );
        load.kill().unwrap();
        load.wait().unwrap();
        let trees: serde_json::Value =
            serde_json::from_str(&tree(dir.path(), &["--json"])).unwrap();
        let rows: Vec<&serde_json::Value> = trees
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|tree| tree["descendants"].as_array().unwrap())
            .collect();
        assert!(!rows.is_empty(), "the killed run stored children");
        let damaged: Vec<_> = rows.iter().filter(|row| row["kind"] != "child").collect();
        assert!(
            damaged.is_empty(),
            "{} of {} rows are diagnostics: {damaged:?}",
            damaged.len(),
            rows.len()
        );
        every_fork_resolves(dir.path());
    }
}

// Issue #16: a load run's forks, on the sled store it leaves, are stored by reference and read
// back whole once the store is reopened by another process.
#[test]
fn a_finished_load_runs_forks_resolve_in_the_reopened_store() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "load",
            "--roots",
            "1",
            "--children",
            "120",
            "--fork-share",
            "1",
        ])
        // A window of 8, so the root settles children (its turns) while forks still start.
        .args([
            "--continuable-share",
            "0.5",
            "--in-flight",
            "8",
            "--latency",
            "0",
        ])
        .arg("--store-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the load binary runs");
    assert!(status.success(), "the load run verifies");
    assert!(
        every_fork_resolves(dir.path()) > 0,
        "the run stored seeded forks"
    );
}

/// Reopens the sled store at `dir` and checks that every fork in it is stored by reference
/// (issue #16) and reads back whole: its seed is its parent's prefix. Returns how many.
fn every_fork_resolves(dir: &std::path::Path) -> usize {
    let store = SledStore::open(dir).expect("the store reopens");
    let forks: Vec<SessionHeader> = block_on(store.list())
        .unwrap()
        .into_iter()
        .filter_map(|row| row.header().cloned())
        .filter(|header| header.seed_length.is_some())
        .collect();
    let count = forks.len();
    for header in forks {
        let reference = header
            .seed_reference
            .as_deref()
            .copied()
            .unwrap_or_else(|| panic!("fork {} stores its seed inline", header.id));
        let events = block_on(store.read_from(header.id, 0))
            .unwrap_or_else(|error| panic!("fork {} does not resolve: {error}", header.id));
        let parent = block_on(store.read_from(reference.session, 0)).unwrap();
        let n = usize::try_from(reference.length).unwrap();
        assert_eq!(events[..n], parent[..n], "fork {}'s seed", header.id);
        assert_eq!(events[n].seq, reference.length);
    }
    count
}

// The same, deterministically: a crash is what a second runtime over the same store sees while
// the first one's writes are held. A one-shot fork child that entered its first step is in
// that store whole, named by its own descriptor, even when nothing after its creation got
// through; before its first step it is not there at all. Never a damaged (`corrupt`) child.
#[actix_rt::test]
async fn a_creation_cut_short_by_a_crash_is_never_a_damaged_child() {
    use std::sync::Arc;
    use subagents::testing::{FaultInjectingStore, Gate, StoreOperation};
    use subagents::{CancellationToken, MemoryStore, SubagentListEntry, SubagentStartRequest};

    let inner = Arc::new(MemoryStore::new());
    let faults = Arc::new(FaultInjectingStore::new(inner.clone()));
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = crate::support::seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        faults.clone(),
    )
    .await;
    let parent = crate::support::root(&rt).await;
    run_prompt(parent.agent(), "some history to fork").await;
    parent.agent().log().flush().await.unwrap();
    // From here no append reaches the store: the process "dies" with them unwritten.
    faults.hold(StoreOperation::Append);
    model.push(ScriptStep::text("held").gated(&gate));
    let run = rt
        .subagents()
        .start(
            "fork",
            SubagentStartRequest::new(parent.agent(), crate::support::text("go")),
        )
        .await
        .unwrap();
    crate::support::within("the child's first request", gate.reached()).await;
    let survivor = Runtime::builder()
        .shared_store(inner.clone())
        .build()
        .unwrap();
    let listed = survivor
        .subagents()
        .list_children(parent.agent().id(), CancellationToken::new())
        .await
        .unwrap();
    assert!(
        listed
            .iter()
            .all(|entry| !matches!(entry, SubagentListEntry::Diagnostic { .. })),
        "an interrupted creation is never a damaged child: {listed:?}"
    );
    assert!(
        listed.iter().all(|entry| matches!(
            entry,
            SubagentListEntry::Child { id, mode: subagents::seam::DelegationMode::OneShot, .. }
                if *id == run.id()
        )),
        "the child is there whole, named by its own descriptor: {listed:?}"
    );
    faults.release(StoreOperation::Append);
    gate.release();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
}

// A root the store does not hold is refused before anything is printed: stdout stays empty
// (the JSON listing's opening bracket included) and the error names the session.
#[test]
fn tree_of_an_unknown_root_prints_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let grown = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["load", "--roots", "1", "--children", "1", "--store"])
        .arg(&store)
        .output()
        .expect("the binary runs");
    crate::support::assert_succeeded(&grown);
    let unknown = subagents::SessionId::new().to_string();
    for json in [false, true] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.arg("tree").arg(&unknown).arg("--store").arg(&store);
        if json {
            command.arg("--json");
        }
        let output = command.output().expect("the binary runs");
        assert!(!output.status.success(), "json: {json}");
        assert!(
            output.stdout.is_empty(),
            "json: {json}: {:?}",
            output.stdout
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("session {unknown} is not in the store")),
            "{stderr}"
        );
    }
}
