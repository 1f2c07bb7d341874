//! The Codex provider's fixture: a runtime whose root agent has a cwd, and `codex` providers
//! that run `subagents replay` (the fake product executable) over a scripted JSON Lines fixture.
//! The fake appends every frame the provider sends to a record file, so a test can assert
//! exactly what went over the wire. Also here: the step builders, the expected diagnostic
//! lines and facts, and the `/proc` probes that show no process outlives a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use subagents::testing::ScriptedModel;
use subagents::{
    AgentHandle, CodexPermissionMode, CodexProvider, CodexProviderConfig, CreateAgent,
    ProviderRegistration, Runtime, SubagentRun, SubagentStartRequest,
};
use tempfile::TempDir;

pub use crate::support::alive;
use crate::support::{memory_runtime, text, within};

/// The `subagents` binary, which serves `replay`.
pub const BINARY: &str = env!("CARGO_BIN_EXE_subagents");

/// The default provider's name.
pub const PROVIDER: &str = "codex";

/// The error text every failing fixture carries; it must never reach a diagnostic.
pub const SECRET: &str = "SECRET_TOKEN in /private/secret.txt";

// The fixed reasons of the permission facts.
pub const NO_APPROVAL: &str = "the provider does not grant interactive approval";
pub const NO_GRANT: &str = "the provider grants no additional turn permissions";
pub const NO_ANSWERS: &str = "the provider does not collect interactive answers";
pub const NO_MCP_INPUT: &str = "the provider does not collect interactive MCP input";
pub const DECLINED_COMMAND: &str = "Codex declined the command under the selected permission mode";
pub const DECLINED_FILE: &str = "Codex declined the file change under the selected permission mode";
pub const SANDBOX_FAILURE: &str = "Codex reported a sandbox failure";
pub const ESCALATION_REJECTED: &str =
    "Codex rejected an escalation because the selected policy never asks for approval";
pub const SANDBOX_VIOLATION: &str = "Codex reported a sandbox violation";

pub struct Codex {
    pub rt: Runtime,
    pub parent: AgentHandle,
    /// The parent's cwd, and where the fixtures and records live.
    pub dir: TempDir,
}

impl Codex {
    /// A runtime and a root parent whose cwd is a fresh directory; no provider yet.
    pub async fn bare() -> Self {
        let rt = memory_runtime(&ScriptedModel::new());
        let dir = tempfile::tempdir().unwrap();
        let parent = rt
            .agents()
            .create(CreateAgent::new().cwd(dir.path()))
            .await
            .unwrap();
        Self { rt, parent, dir }
    }

    /// The default `codex` provider replaying `steps`.
    pub async fn new(steps: Vec<Value>) -> Self {
        Self::with(steps, |_| {}).await
    }

    /// [`Codex::new`] with `tweak` applied to the provider's configuration.
    pub async fn with(steps: Vec<Value>, tweak: impl FnOnce(&mut CodexProviderConfig)) -> Self {
        let codex = Self::bare().await;
        codex.register(PROVIDER, steps, tweak).await.unwrap().keep();
        codex
    }

    /// A `codex` provider whose command only creates `<dir>/spawned`: it shows whether a
    /// start got as far as spawning anything.
    pub async fn detecting() -> Self {
        let codex = Self::bare().await;
        let marker = codex.dir.path().join("spawned");
        let script = format!(": > '{}'", marker.display());
        let tweak = |config: &mut CodexProviderConfig| {
            config.command = "/bin/sh".to_owned();
            config.args = vec!["-c".to_owned(), script];
        };
        codex
            .register(PROVIDER, Vec::new(), tweak)
            .await
            .unwrap()
            .keep();
        codex
    }

    /// Whether the [`Codex::detecting`] command ran.
    pub fn spawned(&self) -> bool {
        self.dir.path().join("spawned").exists()
    }

    /// Where `provider`'s fixture and record live: the fixture's directory for the default
    /// provider, a subdirectory named after any other.
    pub fn home(&self, provider: &str) -> PathBuf {
        if provider == PROVIDER {
            self.dir.path().to_owned()
        } else {
            self.dir.path().join(provider)
        }
    }

    /// `provider`'s fixture file (its path is also in the fake's command line).
    pub fn fixture(&self, provider: &str) -> PathBuf {
        self.home(provider).join("fixture.jsonl")
    }

    /// A configuration named `provider` that replays its fixture and records into its record.
    pub fn config(&self, provider: &str) -> CodexProviderConfig {
        let mut config = CodexProviderConfig::new(BINARY);
        config.provider_name = provider.to_owned();
        // The scripted fixtures were written for `never`, the mode in which Codex asks nothing
        // (the default asks before anything and is tested on its own).
        config.permission_mode = CodexPermissionMode::Never;
        config.args = vec![
            "replay".to_owned(),
            "--fixture".to_owned(),
            self.fixture(provider).display().to_string(),
        ];
        config.env = BTreeMap::from([(
            "SUBAGENTS_REPLAY_RECORD".to_owned(),
            self.home(provider)
                .join("record.jsonl")
                .display()
                .to_string(),
        )]);
        config
    }

    /// Writes `steps` as `provider`'s fixture and registers `provider` with `tweak` applied.
    pub async fn register(
        &self,
        provider: &str,
        steps: Vec<Value>,
        tweak: impl FnOnce(&mut CodexProviderConfig),
    ) -> subagents::Result<ProviderRegistration> {
        write_fixture(&self.fixture(provider), &steps);
        let mut config = self.config(provider);
        tweak(&mut config);
        self.rt
            .subagents()
            .register_provider(CodexProvider::new(config)?)
            .await
    }

    pub fn request(&self, prompt: &str) -> SubagentStartRequest {
        SubagentStartRequest::new(self.parent.agent(), text(prompt))
    }

    /// Starts `prompt` on the default provider.
    pub async fn start(&self, prompt: &str) -> subagents::Result<SubagentRun> {
        self.start_with(PROVIDER, self.request(prompt)).await
    }

    /// Starts `request` on `provider`.
    pub async fn start_with(
        &self,
        provider: &str,
        request: SubagentStartRequest,
    ) -> subagents::Result<SubagentRun> {
        within(
            "the Codex start",
            self.rt.subagents().start(provider, request),
        )
        .await
    }

    /// The frames the default provider sent so far.
    pub fn record(&self) -> Vec<Value> {
        self.record_of(PROVIDER)
    }

    /// The frames `provider` sent so far, in order (none before its fake read any). Lenient:
    /// a line the fake is still writing is left out.
    pub fn record_of(&self, provider: &str) -> Vec<Value> {
        let path = self.home(provider).join("record.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Waits (with the safety-net timeout) until `provider` sent a frame `wanted` accepts.
    pub async fn recorded(
        &self,
        provider: &str,
        what: &str,
        wanted: impl Fn(&Value) -> bool,
    ) -> Value {
        within(what, async {
            loop {
                if let Some(frame) = self.record_of(provider).into_iter().find(|f| wanted(f)) {
                    return frame;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    /// Waits until `provider` answered the [`sync_steps`] request: by then it has processed
    /// every frame before it (the turn/start response among them), so the turn id is known.
    pub async fn synced(&self, provider: &str) {
        self.recorded(provider, "the sync request's reply", |frame| {
            frame.get("method").is_none() && frame["id"] == "sync"
        })
        .await;
    }
}

/// Writes `steps` as JSON Lines to `path`, creating its directory.
pub fn write_fixture(path: &Path, steps: &[Value]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let lines: Vec<String> = steps.iter().map(Value::to_string).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// initialize (answered with the pinned user agent), initialized, and thread/start answered
/// with an ephemeral `thread_id`.
pub fn handshake_steps(thread_id: &str) -> Vec<Value> {
    vec![
        json!({"expect": "initialize", "reply": {"result": {"userAgent": "codex-cli 0.147.0"}}}),
        json!({"expect": "initialized"}),
        json!({"expect": "thread/start",
               "reply": {"result": {"thread": {"id": thread_id, "ephemeral": true}}}}),
    ]
}

/// turn/start answered with `turn-1`.
pub fn turn_steps() -> Vec<Value> {
    turn_steps_for("turn-1")
}

/// turn/start answered with `turn_id`.
pub fn turn_steps_for(turn_id: &str) -> Vec<Value> {
    vec![json!({"expect": "turn/start", "reply": {"result": {"turn": {"id": turn_id}}}})]
}

/// The handshake on `thread-1` and a committed `turn-1`, then `rest`.
pub fn published(rest: Vec<Value>) -> Vec<Value> {
    [handshake_steps("thread-1"), turn_steps(), rest].concat()
}

/// Writes `frame` as one line.
pub fn send(frame: Value) -> Value {
    json!({"send": frame})
}

/// An `item/completed` on `thread-1`/`turn-1` carrying `item`.
pub fn item(item: Value) -> Value {
    send(json!({"method": "item/completed",
                "params": {"threadId": "thread-1", "turnId": "turn-1", "item": item}}))
}

/// An agent message on `thread`/`turn`; `phase` is `"final_answer"`, `null`, `"commentary"`...
pub fn message_in(thread: &str, turn: &str, text: &str, phase: Value) -> Value {
    send(json!({"method": "item/completed",
                "params": {"threadId": thread, "turnId": turn,
                           "item": {"type": "agentMessage", "text": text, "phase": phase}}}))
}

/// A `final_answer` message on `thread-1`/`turn-1`.
pub fn final_answer(text: &str) -> Value {
    message_in("thread-1", "turn-1", text, json!("final_answer"))
}

/// An unphased (`phase: null`) message on `thread-1`/`turn-1`.
pub fn unphased(text: &str) -> Value {
    message_in("thread-1", "turn-1", text, Value::Null)
}

/// `turn/completed` for `thread`/`turn` with `status` and `error`.
pub fn completed_in(thread: &str, turn: &str, status: &str, error: Value) -> Value {
    send(json!({"method": "turn/completed",
                "params": {"threadId": thread,
                           "turn": {"id": turn, "status": status, "error": error}}}))
}

/// `turn/completed` for `thread-1`/`turn-1` with `status` and `error`.
pub fn completed(status: &str, error: Value) -> Value {
    completed_in("thread-1", "turn-1", status, error)
}

/// A successful `turn/completed` for `thread-1`/`turn-1`.
pub fn turn_completed() -> Value {
    completed("completed", Value::Null)
}

/// A `failed` `turn/completed` whose error carries [`SECRET`] and `info` as `codexErrorInfo`.
pub fn failed(info: Value) -> Value {
    completed("failed", json!({"message": SECRET, "codexErrorInfo": info}))
}

/// A server request (codex → provider).
pub fn server_request(id: &str, method: &str, params: Value) -> Value {
    send(json!({"id": id, "method": method, "params": params}))
}

/// Reads frames until the provider's reply to the request `id`.
pub fn await_reply(id: &str) -> Value {
    json!({"await_reply": id})
}

/// A user-input request `sync`, and the wait for its reply: see [`Codex::synced`].
pub fn sync_steps() -> Vec<Value> {
    vec![
        server_request(
            "sync",
            "item/tool/requestUserInput",
            json!({"threadId": "thread-1", "turnId": "turn-1", "questions": []}),
        ),
        await_reply("sync"),
    ]
}

/// Stays alive, recording, until stdin closes.
pub fn hang() -> Value {
    json!({"hang": true})
}

/// The first frame with `method`; panics naming it when none was sent.
pub fn sent(record: &[Value], method: &str) -> Value {
    record
        .iter()
        .find(|frame| frame["method"] == method)
        .unwrap_or_else(|| panic!("no {method} frame in {record:?}"))
        .clone()
}

/// The provider's reply to the server request `id`.
pub fn reply_to(record: &[Value], id: &str) -> Value {
    record
        .iter()
        .find(|frame| frame.get("method").is_none() && frame["id"] == id)
        .unwrap_or_else(|| panic!("no reply to {id} in {record:?}"))
        .clone()
}

/// The diagnostic line of a failure at `stage` in `category`.
pub fn failure(stage: &str, category: &str) -> String {
    format!("Product subagent failure (product: Codex; stage: {stage}; category: {category})")
}

/// [`failure`] with trailing fields (`HTTP status: 503`, `exit code: 9`, `signal: SIGABRT`).
pub fn failure_with(stage: &str, category: &str, extra: &str) -> String {
    format!(
        "Product subagent failure (product: Codex; stage: {stage}; category: {category}; {extra})"
    )
}

/// A permission fact.
pub fn fact(mode: &str, request: &str, decision: &str, reason: &str) -> String {
    format!("Codex unattended decision (mode: {mode}; request: {request}; decision: {decision}): {reason}")
}

/// Asserts that `text` carries nothing from the fixtures' secret payloads.
pub fn assert_safe(text: &str) {
    for secret in ["SECRET_TOKEN", "/private", "raw command payload", "review"] {
        assert!(!text.contains(secret), "{secret:?} leaked into {text:?}");
    }
}

/// A `/bin/sh` fake for what the replay fake cannot do (die by a signal). `answer '<json>'`
/// replies to the next request line with that result, under the request's own id.
pub fn shell_fake(body: &str) -> impl FnOnce(&mut CodexProviderConfig) {
    const PRELUDE: &str = r#"ulimit -c 0 2>/dev/null
answer() {
  read -r line
  id=${line#*'"id":'}
  id=${id%%,*}
  printf '{"id":%s,"result":%s}\n' "$id" "$1"
}
"#;
    let script = format!("{PRELUDE}{body}");
    move |config: &mut CodexProviderConfig| {
        config.command = "/bin/sh".to_owned();
        config.args = vec!["-c".to_owned(), script];
    }
}

/// The live processes whose command line mentions `needle` (a fixture path is unique to its
/// test, so this finds that test's fakes).
pub fn running(needle: &Path) -> Vec<u32> {
    let needle = needle.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| String::from_utf8_lossy(&line).contains(&needle))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// The one live fake replaying `fixture`.
pub fn fake_pid(fixture: &Path) -> u32 {
    let pids = running(fixture);
    assert_eq!(pids.len(), 1, "one fake replays {}", fixture.display());
    pids[0]
}
