//! The runtime most benches start from: the in-process providers registered, and a parent that
//! completed one turn (so a fork child inherits a real prefix).

use std::sync::Arc;

use subagents::testing::ScriptedModel;
use subagents::{
    AgentHandle, ContentBlock, CreateAgent, MessageSource, Runtime, SessionPersistence,
};

/// A runtime on `store` and `model` with agents spread over `workers` threads, and its parent.
pub async fn runtime_with_parent(
    store: Arc<dyn SessionPersistence>,
    model: ScriptedModel,
    workers: usize,
) -> (Runtime, AgentHandle) {
    model.set_recording(false);
    let rt = Runtime::builder()
        .workers(workers)
        .shared_store(store)
        .model("scripted", model)
        .build()
        .expect("runtime builds");
    rt.subagents()
        .register_in_process_providers()
        .await
        .expect("in-process providers register");
    let parent = rt
        .agents()
        .create(CreateAgent::new())
        .await
        .expect("parent");
    parent
        .agent()
        .followup(
            vec![ContentBlock::text("context for forks")],
            MessageSource::User,
        )
        .await
        .expect("parent turn");
    parent.agent().when_idle().await;
    (rt, parent)
}
