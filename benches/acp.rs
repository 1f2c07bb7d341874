//! Benchmarks ACP round trips against `subagents acp-agent` (this crate's reference ACP agent,
//! a whole runtime on the scripted model in its own process):
//!
//! - `acp/run_with_process_start`: one ACP provider run, `start` → `result` → `dispose`: a
//!   fresh agent process, `initialize`, `session/new`, one prompt, the EOF ladder.
//! - `acp/prompt_round_trip`: `session/new` then one `session/prompt` → answer on a
//!   connection kept open, so the process start is excluded.
//!
//! Floors measured in the same run, for ratios:
//!
//! - `floor/process_spawn_exit`: start `true` and reap it (what any process start costs).
//! - `floor/actor_spawn_round_trip`: a bare actix actor and one request/response.
//!
//! Run with `cargo bench --bench acp`.

use std::hint::black_box;
use std::sync::Arc;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock as AcpBlock, InitializeRequest, NewSessionRequest, PromptRequest,
};
use agent_client_protocol::{v1, Agent, ByteStreams, Client};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use subagents::testing::ScriptedModel;
use subagents::{
    AcpProvider, AcpProviderConfig, CreateAgent, MemoryStore, Runtime, SubagentStartRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

// The sled floor does not apply here.
#[allow(dead_code)]
#[path = "support/floors.rs"]
mod floors;

const BINARY: &str = env!("CARGO_BIN_EXE_subagents");

fn bench(c: &mut Criterion) {
    let system = actix::System::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (rt, parent) = system.block_on(async {
        let rt = Runtime::builder()
            .shared_store(Arc::new(MemoryStore::new()))
            .model("scripted", ScriptedModel::new())
            .build()
            .expect("runtime builds");
        let mut config = AcpProviderConfig::new(BINARY);
        config.args = ["acp-agent", "--store", "memory"]
            .map(str::to_owned)
            .to_vec();
        rt.subagents()
            .register_provider(AcpProvider::new(config).expect("config is valid"))
            .await
            .expect("provider registers")
            .keep();
        let parent = rt
            .agents()
            .create(CreateAgent::new().cwd(dir.path()))
            .await
            .expect("parent is created");
        (rt, parent)
    });
    let mut group = c.benchmark_group("acp");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.bench_function("run_with_process_start", |b| {
        b.iter_custom(|iterations| {
            system.block_on(async {
                let started = std::time::Instant::now();
                for _ in 0..iterations {
                    let prompt = vec![subagents::ContentBlock::text("go")];
                    let request = SubagentStartRequest::new(parent.agent(), prompt);
                    let run = rt
                        .subagents()
                        .start("acp", request)
                        .await
                        .expect("run starts");
                    black_box(run.result().await.expect("run settles"));
                    run.dispose().await.expect("run disposes");
                }
                started.elapsed()
            })
        });
    });
    let prompts = system.block_on(persistent_session(dir.path().to_owned()));
    group.sample_size(100);
    // Timed inside one `block_on`: the actor system stays running between prompts, as in a
    // host (entering and leaving the system per prompt costs more than the prompt).
    group.bench_function("prompt_round_trip", |b| {
        b.iter_custom(|iterations| {
            system.block_on(async {
                let started = std::time::Instant::now();
                for _ in 0..iterations {
                    let (answered, answer) = oneshot::channel();
                    prompts.send(answered).await.expect("the session is open");
                    black_box(answer.await.expect("the prompt is answered"));
                }
                started.elapsed()
            })
        });
    });
    group.bench_function("floor/process_spawn_exit", |b| {
        b.iter_custom(|iterations| {
            system.block_on(async {
                let started = std::time::Instant::now();
                for _ in 0..iterations {
                    let status = tokio::process::Command::new("true").status().await;
                    black_box(status.expect("true runs"));
                }
                started.elapsed()
            })
        });
    });
    floors::actor_round_trip(&mut group, &system);
    group.finish();
    drop(prompts);
}

/// Starts one `subagents acp-agent`, and answers each request on the returned channel with the
/// stop reason of one prompt in a new session.
async fn persistent_session(cwd: std::path::PathBuf) -> mpsc::Sender<oneshot::Sender<String>> {
    let mut child = tokio::process::Command::new(BINARY)
        .args(["acp-agent", "--store", "memory"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("acp-agent starts");
    let transport = ByteStreams::new(
        child.stdin.take().expect("stdin").compat_write(),
        child.stdout.take().expect("stdout").compat(),
    );
    let (requests, mut asked) = mpsc::channel::<oneshot::Sender<String>>(1);
    tokio::spawn(async move {
        let _child = child;
        let _ = Client
            .v1()
            .connect_with(transport, async move |cx: v1::ConnectionTo<Agent>| {
                cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                    .block_task()
                    .await?;
                while let Some(answer) = asked.recv().await {
                    // A fresh session per delegation, as a provider run has: one session's
                    // transcript growing over thousands of prompts would be measured instead.
                    let session = cx
                        .send_request(NewSessionRequest::new(cwd.clone()))
                        .block_task()
                        .await?
                        .session_id;
                    let prompt = vec![AcpBlock::from("go".to_owned())];
                    let response = cx
                        .send_request(PromptRequest::new(session.clone(), prompt))
                        .block_task()
                        .await?;
                    let _ = answer.send(format!("{:?}", response.stop_reason));
                }
                Ok(())
            })
            .await;
    });
    requests
}

criterion_group!(benches, bench);
criterion_main!(benches);
