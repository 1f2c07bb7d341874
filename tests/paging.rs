//! A long-lived agent that pages out its settled events (issue #16): it holds a bounded part
//! of its log in memory, the store holds all of it, a model that reads the whole history gets
//! the whole history, one that reads the newest entries gets those, and a fork of the agent
//! inherits its whole history.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream, StreamExt};
use subagents::testing::{post_again, Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, AgentOptions, BlockType, CancelCause, ContinuableStartSpec, CreateAgent,
    EventScope, FinishReason, GenerateRequest, History, InboxPolicy, LlmAdapter, LlmFailure,
    MemoryStore, Message, MessageSource, ResumeAgent, Runtime, SessionPersistence, StreamChunk,
    SubagentListEntry,
};
use tokio_util::sync::CancellationToken;

use crate::support::{
    converse, injected_runtime, resumed_with_the_notice_pending, run_prompt, seam_runtime_on,
    settled, text, within, SeamRecorder,
};

/// How many of its newest events the paging agent keeps.
const KEEP: u32 = 8;

/// Options that page out beyond `keep` events.
fn paging(keep: u32) -> AgentOptions {
    AgentOptions {
        resident_events: NonZeroU32::new(keep),
        ..AgentOptions::default()
    }
}

/// Session `id` resumed on `rt` as an agent that pages out beyond `keep` events.
async fn resume_paging(rt: &Runtime, id: subagents::SessionId, keep: u32) -> AgentHandle {
    rt.agents()
        .resume(ResumeAgent::new(id).options(paging(keep)))
        .await
        .unwrap()
}

/// An agent on `rt` that pages out its settled events beyond [`KEEP`].
async fn paging_agent(rt: &Runtime) -> AgentHandle {
    rt.agents()
        .create(CreateAgent::new().options(paging(KEEP)))
        .await
        .unwrap()
}

/// A runtime on a memory store (returned too, to read back) whose model answers "answer".
async fn scripted_runtime() -> (Runtime, ScriptedModel, Arc<MemoryStore>) {
    let model = ScriptedModel::repeating(ScriptStep::text("answer"));
    let store = Arc::new(MemoryStore::new());
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        Arc::clone(&store) as Arc<dyn SessionPersistence>,
    )
    .await;
    (rt, model, store)
}

/// Starts a continuable child of `parent` through `provider`, prompted (and labelled)
/// `prompt`; its id.
async fn start_child(
    rt: &Runtime,
    parent: &AgentHandle,
    provider: &str,
    prompt: &str,
) -> subagents::SessionId {
    rt.subagents()
        .start_continuable(ContinuableStartSpec::new(
            provider,
            prompt,
            parent.agent(),
            text(prompt),
        ))
        .await
        .unwrap()
        .child_id
}

/// Starts a continuable `fork` child of `parent`, prompted "forked task"; its id.
async fn start_fork(rt: &Runtime, parent: &AgentHandle) -> subagents::SessionId {
    start_child(rt, parent, "fork", "forked task").await
}

fn texts<'a>(messages: impl Iterator<Item = &'a Message>) -> Vec<String> {
    messages.map(Message::text).collect()
}

#[actix_rt::test]
async fn a_paging_agent_holds_a_bounded_log_and_its_model_sees_the_whole_history() {
    let (rt, model, store) = scripted_runtime().await;
    let agent = paging_agent(&rt).await;
    converse(&agent, 40).await;
    let log = agent.agent().log();
    let held = log.with_events(|events| events.iter().count());
    assert!(log.first_resident() > 0, "settled events were paged out");
    assert!(
        held < 4 * KEEP as usize,
        "{held} events held of {}: the working set is bounded",
        log.len()
    );
    let history = log.history();
    let held_entries = history.len() - history.first_resident().expect("a known history");
    assert!(
        held_entries < 4 * KEEP as usize,
        "{held_entries} history entries held: the one read back for the model is paged out again"
    );
    log.drain().await.unwrap();
    let stored = store.read_from(agent.agent().id(), 0).await.unwrap();
    assert_eq!(
        stored.len() as u64,
        log.len(),
        "the store holds every event"
    );
    // The model reads the whole history: each call got it whole, read back from the store.
    let requests = model.requests();
    let last = requests.last().expect("the model was called");
    assert!(last.messages.is_complete());
    let before_last_answer = &stored[..stored
        .iter()
        .rposition(|event| matches!(event.kind, subagents::EventKind::AssistantMessage { .. }))
        .unwrap()];
    assert_eq!(
        texts(last.messages.messages()),
        texts(History::of(before_last_answer).messages())
    );
    assert_eq!(
        last.messages.len(),
        79,
        "40 prompts and the 39 answers before the last"
    );
    agent.dispose().await.unwrap();
}

/// What a model call was handed: the history's length, and the index of its first held entry.
type Handed = (usize, Option<usize>);

/// A model that reads the two newest history entries, recording what it was handed.
#[derive(Clone, Default)]
struct Windowed {
    seen: Arc<Mutex<Vec<Handed>>>,
}

impl LlmAdapter for Windowed {
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
        let history = &request.messages;
        self.seen
            .lock()
            .unwrap()
            .push((history.len(), history.first_resident()));
        stream::iter([
            Ok(StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            }),
            Ok(StreamChunk::TextDelta {
                index: 0,
                text: "answer".to_owned(),
            }),
            Ok(StreamChunk::Finish {
                reason: FinishReason::Stop,
            }),
        ])
        .boxed()
    }

    fn history_window(&self) -> Option<usize> {
        Some(2)
    }
}

#[actix_rt::test]
async fn a_model_that_reads_the_newest_entries_gets_those_the_agent_holds() {
    let model = Windowed::default();
    let rt = seam_runtime_on(
        Runtime::builder().model("windowed", model.clone()),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let agent = paging_agent(&rt).await;
    converse(&agent, 20).await;
    let seen = model.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20);
    for (call, (len, first)) in seen.iter().enumerate() {
        assert_eq!(*len, 2 * call + 1, "every call counts the whole history");
        let first = first.expect("a known history");
        assert!(len - first >= 2.min(*len), "the window is held: {seen:?}");
    }
    assert!(
        seen.iter()
            .any(|(_, first)| first.is_some_and(|first| first > 0)),
        "later calls were handed the held entries alone, not a history read back"
    );
    agent.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_fork_of_a_paging_agent_inherits_its_whole_history() {
    let (rt, model, store) = scripted_runtime().await;
    let parent = paging_agent(&rt).await;
    converse(&parent, 20).await;
    assert!(parent.agent().log().first_resident() > 0);
    parent.agent().log().drain().await.unwrap();
    let inherited = History::of(store.read_from(parent.agent().id(), 0).await.unwrap());
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let child = start_fork(&rt, &parent).await;
    settled(&recorder, child, 1).await;
    let first_call = model
        .requests()
        .into_iter()
        .find(|request| request.session_id == Some(child))
        .expect("the fork called its model");
    assert!(first_call.messages.is_complete());
    let seen = texts(first_call.messages.messages());
    assert_eq!(
        seen[..inherited.len()],
        texts(inherited.messages())[..],
        "the fork's model sees every inherited message, the paged-out ones read back"
    );
    assert!(
        seen[inherited.len()..].contains(&"forked task".to_owned()),
        "then its own prompt"
    );
    parent.dispose().await.unwrap();
}

// A resumed agent that pages holds its bounded working set from its resumption, not from its
// first turn's end (a resumed root that settled many children stays idle until it hears one).
#[actix_rt::test]
async fn a_resumed_paging_agent_pages_out_what_it_loaded_at_once() {
    let (rt, model, _) = scripted_runtime().await;
    let whole = rt.agents().create(CreateAgent::new()).await.unwrap();
    let id = whole.agent().id();
    converse(&whole, 20).await;
    let len = whole.agent().log().len();
    assert_eq!(whole.agent().log().first_resident(), 0, "nothing paged out");
    whole.dispose().await.unwrap();

    let resumed = resume_paging(&rt, id, KEEP).await;
    let log = resumed.agent().log();
    let held = log.with_events(|events| events.iter().count());
    assert_eq!(log.len(), len, "the whole log was loaded");
    assert!(
        held < 2 * KEEP as usize,
        "{held} of {len} events held before any turn ran"
    );
    // It goes on whole: the model is handed every entry, the paged-out ones read back.
    run_prompt(resumed.agent(), "after the resume").await;
    let handed = model.requests().last().unwrap().messages.clone();
    assert!(handed.is_complete());
    assert_eq!(
        handed.len(),
        41,
        "20 prompts, their answers and the new prompt"
    );
    resumed.dispose().await.unwrap();
}

/// The runtime-context texts session `id`'s stored log stated to its model, in order.
async fn stated_contexts(store: &MemoryStore, id: subagents::SessionId) -> Vec<String> {
    store
        .read_stored(id, 0, u64::MAX)
        .await
        .unwrap()
        .iter()
        .filter_map(|event| match &event.kind {
            subagents::EventKind::UserMessage(message)
                if matches!(message.source, MessageSource::Plugin { .. }) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect()
}

/// A setup that gives the agent one runtime context, `text`.
fn with_context(
    text: &'static str,
) -> impl FnOnce(
    &mut subagents::AgentScope,
    &subagents::SessionLog,
) -> subagents::Result<Option<subagents::host::SetupCommit>>
       + Send
       + 'static {
    move |scope: &mut subagents::AgentScope, _: &subagents::SessionLog| {
        scope.context(subagents::PromptSection::new("standing", 1.0, text));
        Ok(None)
    }
}

/// Resumes session `id` paging beyond [`KEEP`] with the runtime context `context`, runs one
/// prompt and disposes of it once its log is stored.
async fn resume_stating(rt: &Runtime, id: subagents::SessionId, context: &'static str) {
    let resumed = rt
        .agents()
        .resume(
            ResumeAgent::new(id)
                .options(paging(KEEP))
                .setup(with_context(context)),
        )
        .await
        .unwrap();
    run_prompt(resumed.agent(), "after the resume").await;
    resumed.agent().log().drain().await.unwrap();
    resumed.dispose().await.unwrap();
}

// A paging agent resumed after its runtime context's statement was paged out does not state
// the unchanged context again: its model reads the whole history back, which has it. Before,
// the resumed agent looked for the statement only among the entries it held, and stated it
// once more at every resume.
#[actix_rt::test]
async fn a_resumed_paging_agent_states_an_unchanged_runtime_context_once() {
    let (rt, model, store) = scripted_runtime().await;
    let brief = "Standing orders: be brief.";
    let agent = rt
        .agents()
        .create(
            CreateAgent::new()
                .options(paging(KEEP))
                .setup(with_context(brief)),
        )
        .await
        .unwrap();
    let id = agent.agent().id();
    converse(&agent, 20).await;
    assert!(
        agent.agent().log().first_resident() > 0,
        "the statement was paged out"
    );
    agent.agent().log().drain().await.unwrap();
    agent.dispose().await.unwrap();
    resume_stating(&rt, id, brief).await;
    resume_stating(&rt, id, brief).await;
    let stated = stated_contexts(&store, id).await;
    assert_eq!(stated.len(), 1, "stated once in the whole log: {stated:?}");
    assert!(stated[0].ends_with(brief));
    let handed = model.requests().last().unwrap().messages.clone();
    assert!(handed.is_complete(), "the model read the history back");
    assert_eq!(
        handed
            .messages()
            .filter(|message| message.text().contains("Standing orders"))
            .count(),
        1,
        "the model sees the context once"
    );

    // A context that changed meanwhile is stated anew.
    let thorough = "Standing orders: be thorough.";
    resume_stating(&rt, id, thorough).await;
    let stated = stated_contexts(&store, id).await;
    assert_eq!(stated.len(), 2, "{stated:?}");
    assert!(stated[1].ends_with(thorough));
}

// A paging agent is resumed a chunk of its log at a time: however long its log, no read hands
// the resume more than a chunk, so it never holds its whole transcript, and it goes on whole.
#[actix_rt::test]
async fn a_paging_agent_is_resumed_without_reading_its_whole_log_at_once() {
    let (rt, model, _, store) = injected_runtime().await;
    // It pages only once resumed: a paging agent reads its history back every turn.
    let agent = rt.agents().create(CreateAgent::new()).await.unwrap();
    let id = agent.agent().id();
    // Past one chunk (4,096 events): twelve events a turn.
    converse(&agent, 400).await;
    let len = agent.agent().log().len();
    assert!(len > 4096, "{len} events");
    let projections = rt.projections().unwrap();
    let views = projections.snapshot(agent.agent().log()).unwrap();
    agent.dispose().await.unwrap();

    let resumed = resume_paging(&rt, id, KEEP).await;
    let largest = store.largest_read(id);
    assert!(
        largest <= 4096,
        "one read handed the resume {largest} of {len} events"
    );
    assert_eq!(resumed.agent().log().len(), len);
    assert!(resumed.agent().log().first_resident() > 0);
    // Every projection unit folded each chunk before it was paged out.
    assert_eq!(
        projections.snapshot(resumed.agent().log()).unwrap(),
        views,
        "the resumed agent's projections are its log's"
    );
    run_prompt(resumed.agent(), "after the resume").await;
    let handed = model.requests().last().unwrap().messages.clone();
    assert_eq!(
        handed.len(),
        801,
        "400 prompts, their answers and the new prompt"
    );
    resumed.dispose().await.unwrap();
}

// A parent that is away hears its child settle without its log being read whole: the notice
// is written into its stored inbox from its log read a chunk at a time, and waits there.
#[actix_rt::test]
async fn a_notice_to_a_parent_that_is_away_reads_its_log_a_chunk_at_a_time() {
    // The test reads past the injector, so its own reads are not counted.
    let (rt, model, inner, store) = injected_runtime().await;
    let parent = rt.agents().create(CreateAgent::new()).await.unwrap();
    let parent_id = parent.agent().id();
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent_id));
    converse(&parent, 400).await;
    let len = parent.agent().log().len();
    assert!(len > 4096, "{len} events");
    let gate = Gate::new();
    model.push(ScriptStep::text("held").gated(&gate));
    let child = start_child(&rt, &parent, "spawn", "task").await;
    gate.reached().await;
    parent.dispose().await.unwrap();
    let away = inner.read_from(parent_id, 0).await.unwrap().len();
    gate.release();
    settled(&recorder, child, 1).await;
    within("the notice to be stored", async {
        while inner.read_from(parent_id, 0).await.unwrap().len() == away {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let largest = store.largest_read(parent_id);
    assert!(
        largest <= 4096,
        "one read handed the stored inbox's writer {largest} of {len} events"
    );
    let back = resumed_with_the_notice_pending(&rt, parent_id).await;
    back.dispose().await.unwrap();
}

// What waited in the inbox when the agent's process died is replayed by a resume that pages
// the event that queued it out: a follow-up queued during a turn that was then interrupted
// (its queue kept) runs first once the resumed agent is woken.
#[actix_rt::test]
async fn a_paging_agent_resumed_runs_what_was_queued_before_its_last_turn_ended() {
    let (rt, model, store) = scripted_runtime().await;
    let agent = rt.agents().create(CreateAgent::new()).await.unwrap();
    converse(&agent, 5).await;
    let gate = Gate::new();
    model.push(ScriptStep::text("held").gated(&gate));
    agent
        .agent()
        .followup(text("the held turn"), MessageSource::User)
        .await
        .unwrap();
    gate.reached().await;
    agent
        .agent()
        .followup(text("queued before the end"), MessageSource::User)
        .await
        .unwrap();
    agent
        .agent()
        .cancel(CancelCause::User, InboxPolicy::Keep)
        .await
        .unwrap();
    within("the interrupted turn to end", agent.agent().when_idle()).await;
    agent.agent().log().drain().await.unwrap();
    // The log as the process left it when it died (a disposal would discard the queue): the
    // same events, stored as another session.
    let events = store.read_from(agent.agent().id(), 0).await.unwrap();
    let queued_at = events
        .iter()
        .rfind(|event| matches!(event.kind, subagents::EventKind::InboxSpliced { .. }))
        .unwrap()
        .seq;
    let died = subagents::SessionId::new();
    store
        .create(subagents::SessionHeader::new(died), events)
        .await
        .unwrap();

    let resumed = resume_paging(&rt, died, 1).await;
    assert!(
        resumed.agent().log().first_resident() > queued_at,
        "the event that queued it is paged out"
    );
    let calls = model.requests().len();
    resumed
        .agent()
        .followup(text("the wake"), MessageSource::User)
        .await
        .unwrap();
    within("both turns", async {
        while model.requests().len() < calls + 2 {
            resumed.agent().when_idle().await;
            tokio::task::yield_now().await;
        }
    })
    .await;
    let prompts: Vec<String> = model.requests()[calls..]
        .iter()
        .map(|request| request.messages.messages().last().unwrap().text())
        .collect();
    assert_eq!(prompts, ["queued before the end", "the wake"]);
    resumed.dispose().await.unwrap();
    agent.dispose().await.unwrap();
}

// A resume that pages closes a turn the agent's process died in, durably, as any resume does:
// the stored log ends balanced, and the agent goes on.
#[actix_rt::test]
async fn a_paging_agent_resumed_closes_the_turn_it_died_in() {
    let (rt, _, store) = scripted_runtime().await;
    let agent = rt.agents().create(CreateAgent::new()).await.unwrap();
    let id = agent.agent().id();
    converse(&agent, 10).await;
    let len = agent.agent().log().len();
    agent.dispose().await.unwrap();
    // The process died right after it opened turn 11.
    store
        .append(
            id,
            len,
            vec![Arc::new(subagents::SessionEvent::new(
                len,
                subagents::EventKind::TurnStart { turn: 11 },
            ))],
            None,
        )
        .await
        .unwrap();

    let resumed = resume_paging(&rt, id, 2).await;
    assert!(resumed.agent().log().is_balanced());
    let stored = store.read_from(id, 0).await.unwrap();
    assert!(
        matches!(
            stored.last().unwrap().kind,
            subagents::EventKind::TurnEnd { turn: 11, .. }
        ),
        "the interrupted turn is closed in the store: {:?}",
        stored.last().unwrap().kind
    );
    run_prompt(resumed.agent(), "after the crash").await;
    assert_eq!(resumed.agent().log().last_turn(), 12);
    resumed.dispose().await.unwrap();
}

// A paging agent resumed after a crash keeps its link to the last epoch traced: the turn the
// process died in is closed with the trace context of the turn before it, which the resume
// pages out once the closed turn is the last. Before, the closing `turn/end` kept none, and the
// next turn found no context among the events it held (a whole log's resume looks further
// back and finds it).
#[actix_rt::test]
async fn a_paging_agent_repaired_after_a_crash_links_back_to_the_last_turn_traced() {
    use subagents::{EventKind, SessionEvent, SessionHeader, TurnEndReason};
    let (rt, _, store) = scripted_runtime().await;
    let traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let id = subagents::SessionId::new();
    // One traced turn, then a turn of three steps the process died in.
    let mut kinds = vec![
        EventKind::TurnStart { turn: 1 },
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
            traceparent: Some(traced.to_owned()),
        },
        EventKind::TurnStart { turn: 2 },
    ];
    for step in 1..=3 {
        kinds.push(EventKind::StepStart { turn: 2, step });
        kinds.push(EventKind::StepEnd { turn: 2, step });
    }
    let events = kinds
        .into_iter()
        .zip(0..)
        .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
        .collect();
    store.create(SessionHeader::new(id), events).await.unwrap();

    let resumed = resume_paging(&rt, id, 2).await;
    assert!(
        resumed.agent().log().first_resident() > 1,
        "the traced turn's end was paged out"
    );
    let stored = store.read_from(id, 0).await.unwrap();
    match &stored.last().unwrap().kind {
        EventKind::TurnEnd {
            turn: 2,
            reason: TurnEndReason::Interrupted,
            traceparent,
        } => assert_eq!(traceparent.as_deref(), Some(traced)),
        other => panic!("the interrupted turn is closed in the store: {other:?}"),
    }
    resumed.dispose().await.unwrap();
}

// A message the agent accepted long ago, its events since paged out, posted again under its id
// (a settled notice or a report asked again) is answered with that acceptance and runs no
// second turn: the store answers for what left memory.
#[actix_rt::test]
async fn a_message_posted_again_after_it_was_paged_out_is_not_accepted_twice() {
    let (rt, model, _) = scripted_runtime().await;
    let agent = paging_agent(&rt).await;
    let first = Message::user(text("the first"), MessageSource::User);
    agent.agent().followup_message(first.clone()).await.unwrap();
    within("the first turn", agent.agent().when_idle()).await;
    converse(&agent, 20).await;
    assert!(
        agent.agent().log().first_resident() > 8,
        "the first message's events left memory"
    );
    let calls = model.requests().len();
    let again = post_again(agent.agent(), first.clone()).await.unwrap();
    assert_eq!(again, first.id, "answered with the first acceptance");
    within("the agent to settle", agent.agent().when_idle()).await;
    assert_eq!(model.requests().len(), calls, "no second turn ran it");
    agent.dispose().await.unwrap();
}

// A message that may have been accepted before (a peer's settled notice or report) but was
// not is accepted without reading the paged-out events back: the log knows which messages they
// inserted. Before, every such message read the whole paged-out prefix from the store while the
// agent's mailbox waited, so a root whose children ran on another node slowed with its log (two
// nodes sharing 5,000 children grew 3 to 5 times slower than with nothing paged out). One accepted
// before is still looked for in the store, and answered with its first acceptance.
#[actix_rt::test]
async fn a_first_ask_that_may_repeat_reads_nothing_paged_out_back() {
    // A model that reads the newest entries only: its turns read nothing back either.
    let model = Windowed::default();
    let store = Arc::new(subagents::testing::FaultInjectingStore::new(Arc::new(
        MemoryStore::new(),
    )));
    let rt = seam_runtime_on(
        Runtime::builder().model("windowed", model.clone()),
        Arc::clone(&store) as Arc<dyn SessionPersistence>,
    )
    .await;
    let calls = || model.seen.lock().unwrap().len();
    let agent = paging_agent(&rt).await;
    let id = agent.agent().id();
    let first = Message::user(text("the first"), MessageSource::User);
    agent.agent().followup_message(first.clone()).await.unwrap();
    within("the first turn", agent.agent().when_idle()).await;
    converse(&agent, 20).await;
    assert!(agent.agent().log().first_resident() > 8);
    let (read, ran) = (store.events_read(id), calls());
    let fresh = Message::user(text("a notice"), MessageSource::User);
    let accepted = post_again(agent.agent(), fresh.clone()).await.unwrap();
    assert_eq!(accepted, fresh.id);
    within("its turn", agent.agent().when_idle()).await;
    assert_eq!(calls(), ran + 1, "it ran");
    assert_eq!(store.events_read(id), read, "nothing was read back");
    let again = post_again(agent.agent(), first.clone()).await.unwrap();
    assert_eq!(again, first.id, "answered with the first acceptance");
    within("the agent to settle", agent.agent().when_idle()).await;
    assert_eq!(calls(), ran + 1, "no second turn ran it");
    assert!(
        store.events_read(id) > read,
        "the repeat was looked for in the store"
    );
    agent.dispose().await.unwrap();
}

// A continuable fork of a paging agent, live mid-turn, is listed by its identity: its
// projections catch up on its inherited events from the store (they are paged out in memory)
// instead of failing, which listed it `corrupt`.
#[actix_rt::test]
async fn a_live_fork_of_a_paging_agent_is_listed_by_its_identity() {
    let (rt, model, _) = scripted_runtime().await;
    let parent = paging_agent(&rt).await;
    converse(&parent, 20).await;
    assert!(parent.agent().log().first_resident() > 0);
    let gate = Gate::new();
    model.push(ScriptStep::text("held").gated(&gate));
    let child = start_fork(&rt, &parent).await;
    gate.reached().await;
    let listed = rt
        .subagents()
        .list_children(parent.agent().id(), CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(
            listed.as_slice(),
            [SubagentListEntry::Child { id, label: Some(label), .. }] if *id == child && label == "forked task"
        ),
        "{listed:?}"
    );
    gate.release();
    parent.dispose().await.unwrap();
}
