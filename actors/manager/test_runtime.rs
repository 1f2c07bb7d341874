//! The runtime the manager's own tests run: a memory store, a scripted model and `spawn`.

use std::sync::Arc;

use crate::testing::ScriptedModel;
use crate::{MemoryStore, Runtime, SpawnInProcess};

/// A runtime on a fresh memory store whose agents talk to `model`, with `spawn` registered.
pub(super) async fn scripted_runtime(model: ScriptedModel) -> Runtime {
    let rt = Runtime::builder()
        .shared_store(Arc::new(MemoryStore::new()))
        .model("scripted", model)
        .build()
        .expect("a runtime");
    rt.subagents()
        .register_provider(SpawnInProcess::default())
        .await
        .expect("spawn registers")
        .keep();
    rt
}
