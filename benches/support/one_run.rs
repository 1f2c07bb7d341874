//! One one-shot child, start to disposal: what the one-shot and fork benches time.

use std::hint::black_box;

use subagents::{AgentHandle, ContentBlock, Runtime, SessionId, SubagentStartRequest};

/// One child of `parent` through `provider`, `start` → `result` → `dispose`; its session id.
pub async fn one_run(rt: &Runtime, parent: &AgentHandle, provider: &str) -> SessionId {
    let run = rt
        .subagents()
        .start(
            provider,
            SubagentStartRequest::new(parent.agent(), vec![ContentBlock::text("work")]),
        )
        .await
        .expect("start");
    black_box(run.result().await.expect("result"));
    let id = run.id();
    run.dispose().await.expect("dispose");
    id
}
