//! Writes into the stored inbox of a parent that is away (issue #16): each child that settles
//! while its parent is away leaves its notice in the parent's log once, at its place in
//! `next-turn`, and only the first such write reads the parent's whole log; each later one
//! reads what the log gained after the checkpoint the previous write left.

use std::sync::Arc;

use subagents::testing::{FaultInjectingStore, Gate, ScriptStep};
use subagents::{
    EventKind, EventScope, MemoryStore, ResumeAgent, Runtime, SessionEvent, SessionId,
    SessionPersistence, TurnEndReason,
};

use crate::support::{
    converse, injected_runtime, notice_splices, notices_inserted, resumed_with_the_notice_pending,
    run_prompt, start_continuable, within, SeamRecorder,
};

/// A parent that is away while its continuable children run, each held in its first turn at
/// a gate of its own.
struct AwayParent {
    rt: Runtime,
    /// The store under the read counter: what a test reads back is not counted.
    inner: Arc<MemoryStore>,
    /// The store the runtime writes through, counting the events each session's reads return.
    counted: Arc<FaultInjectingStore>,
    parent: SessionId,
    /// Each child's gate, in the order they were started.
    gates: Vec<Gate>,
    _recorder: SeamRecorder,
}

impl AwayParent {
    /// A parent with `turns` turns of conversation, which starts `children` continuable
    /// children and is disposed while each is held in its first turn.
    async fn new(turns: u32, children: usize) -> Self {
        let (rt, model, inner, counted) = injected_runtime().await;
        let parent = rt
            .agents()
            .create(subagents::CreateAgent::new())
            .await
            .unwrap();
        let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
        converse(&parent, turns).await;
        let mut gates = Vec::new();
        for child in 0..children {
            let gate = Gate::new();
            model.push(ScriptStep::text("held").gated(&gate));
            start_continuable(&rt, parent.agent(), &format!("task {child}")).await;
            // Its first model call took this gate, not the next child's.
            gate.reached().await;
            gates.push(gate);
        }
        let id = parent.agent().id();
        parent.dispose().await.unwrap();
        Self {
            rt,
            inner,
            counted,
            parent: id,
            gates,
            _recorder: recorder,
        }
    }

    /// The parent's stored log, read past the counter.
    async fn log(&self) -> Vec<Arc<SessionEvent>> {
        self.inner.read_from(self.parent, 0).await.unwrap()
    }

    /// Resumes the parent, checks that `pending` messages wait in its inbox, and lets it go.
    async fn comes_back_to(&self, pending: usize) {
        let back = self
            .rt
            .agents()
            .resume(ResumeAgent::new(self.parent))
            .await
            .unwrap();
        assert_eq!(
            back.agent().status().await.unwrap().next_turn,
            pending,
            "what waits in the resumed parent's inbox"
        );
        back.dispose().await.unwrap();
    }

    /// Lets child `child` finish its turn and waits until the parent's log holds `notices`
    /// settled notices; answers how many events the parent's stored-inbox writer read meanwhile.
    async fn settle(&self, child: usize, notices: usize) -> usize {
        let before = self.counted.events_read(self.parent);
        self.gates[child].release();
        within("the notice to be stored", async {
            while notices_inserted(&self.log().await) < notices {
                tokio::task::yield_now().await;
            }
        })
        .await;
        self.counted.events_read(self.parent) - before
    }
}

/// The positions the parent's notice splices name in `next-turn`, in log order.
fn notice_positions(events: &[Arc<SessionEvent>]) -> Vec<u64> {
    notice_splices(events)
        .into_iter()
        .map(|(start, _)| start)
        .collect()
}

// Three children settle while their parent is away: the first notice's write reads the
// parent's whole log (a chunk at a time), the next two read none of it, and the three notices
// wait in the parent's inbox once each, in the order they came.
#[actix_rt::test]
async fn notices_to_a_parent_that_is_away_read_its_log_once() {
    let away = AwayParent::new(100, 3).await;
    let len = away.log().await.len();
    assert!(len > 400, "{len} events");
    let first = away.settle(0, 1).await;
    assert!(
        first >= len,
        "the first write reads the whole log: {first} of {len} events"
    );
    let second = away.settle(1, 2).await;
    let third = away.settle(2, 3).await;
    assert_eq!(
        (second, third),
        (0, 0),
        "the later writes start from the checkpoint the previous one left"
    );
    let log = away.log().await;
    assert_eq!(notice_positions(&log), [0, 1, 2]);
    away.comes_back_to(3).await;
}

// A parent that came back, heard its first child's notice and went away again is written to
// from the checkpoint: the second notice's write reads only what the parent's own turns
// added after the first notice, and the notice lands first in its emptied `next-turn`.
#[actix_rt::test]
async fn a_parent_back_and_away_again_is_written_to_over_its_turns_since_the_checkpoint() {
    let away = AwayParent::new(20, 2).await;
    away.settle(0, 1).await;
    let checkpointed = away.log().await.len();
    let back = resumed_with_the_notice_pending(&away.rt, away.parent).await;
    run_prompt(back.agent(), "what happened?").await;
    assert_eq!(back.agent().status().await.unwrap().next_turn, 0);
    back.dispose().await.unwrap();
    let grown = away.log().await.len() - checkpointed;
    assert!(grown > 0, "the parent's turns added events");
    let read = away.settle(1, 2).await;
    assert_eq!(
        read, grown,
        "the write read the events after the checkpoint, and only those"
    );
    assert_eq!(notice_positions(&away.log().await), [0, 0]);
    away.comes_back_to(1).await;
}

// A turn a crash left open after the checkpoint (a resumed parent's process died in it) is
// closed before the next notice is written: the write falls back to reading the whole log,
// which repairs the turn, and the notice takes its place behind the one still pending.
#[actix_rt::test]
async fn a_turn_left_open_after_the_checkpoint_is_closed_before_the_next_notice() {
    let away = AwayParent::new(5, 2).await;
    away.settle(0, 1).await;
    let log = away.log().await;
    let last_turn = log
        .iter()
        .filter_map(|event| match event.kind {
            EventKind::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .max()
        .unwrap();
    let crashed = u64::try_from(log.len()).unwrap();
    away.inner
        .append(
            away.parent,
            crashed,
            vec![Arc::new(SessionEvent::new(
                crashed,
                EventKind::TurnStart {
                    turn: last_turn + 1,
                },
            ))],
            None,
        )
        .await
        .unwrap();
    let len = log.len() + 1;
    let read = away.settle(1, 2).await;
    assert!(read >= len, "the write read the whole log: {read} of {len}");
    let log = away.log().await;
    let after = &log[len..];
    assert!(
        matches!(
            after.first().map(|event| &event.kind),
            Some(EventKind::TurnEnd {
                reason: TurnEndReason::Interrupted,
                ..
            })
        ),
        "the open turn is closed first: {:?}",
        after.iter().map(|e| e.kind.type_name()).collect::<Vec<_>>()
    );
    assert_eq!(notice_positions(&log), [0, 1]);
    away.comes_back_to(2).await;
}

// A checkpoint past the log's end (a store that lost what followed it) is no answer: the
// write finds the log does not end there, falls back to reading it whole, and the notice is
// stored, not lost.
#[actix_rt::test]
async fn a_checkpoint_past_the_logs_end_is_no_answer() {
    let away = AwayParent::new(5, 2).await;
    away.settle(0, 1).await;
    let mut row = away
        .inner
        .cache_get("stored_inbox", away.parent)
        .await
        .unwrap()
        .expect("the first write left a checkpoint");
    let seq = row["seq"].as_u64().unwrap();
    row["seq"] = (seq + 5).into();
    away.inner
        .cache_put("stored_inbox", away.parent, row, None)
        .await
        .unwrap();
    let len = away.log().await.len();
    let read = away.settle(1, 2).await;
    assert!(read >= len, "the write read the whole log: {read} of {len}");
    assert_eq!(notice_positions(&away.log().await), [0, 1]);
    away.comes_back_to(2).await;
}
