//! The Claude Code provider against `subagents replay` playing a stream-json `claude` CLI: the
//! invocation, the strict result mapping, permission prompts, facts, process exits and
//! cancellation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};
use subagents::testing::ScriptedModel;
use subagents::{
    AgentHandle, ClaudeCodeProvider, ClaudeCodeProviderConfig, ClaudePermissionMode, ContentBlock,
    CreateAgent, ErrorCode, Runtime, StopReason, SubagentResult, SubagentRun, SubagentStartRequest,
};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::support::{memory_runtime, text, within};

const BINARY: &str = env!("CARGO_BIN_EXE_subagents");

struct Claude {
    rt: Runtime,
    parent: AgentHandle,
    dir: TempDir,
}

impl Claude {
    /// The default `claude-code` provider (mode `mode`) replaying `steps`.
    async fn new(steps: &[Value], mode: ClaudePermissionMode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fixture = dir.path().join("fixture.jsonl");
        let lines: Vec<String> = steps.iter().map(Value::to_string).collect();
        std::fs::write(&fixture, lines.join("\n")).unwrap();
        let mut config = ClaudeCodeProviderConfig::new(BINARY);
        config.args = vec![
            "replay".to_owned(),
            "--fixture".to_owned(),
            fixture.display().to_string(),
        ];
        config.permission_mode = mode;
        config.dispose_grace_ms = 500.0;
        config.env = BTreeMap::from([(
            "SUBAGENTS_REPLAY_RECORD".to_owned(),
            dir.path().join("record.jsonl").display().to_string(),
        )]);
        let (rt, parent) = registered(config, dir.path()).await;
        Self { rt, parent, dir }
    }

    fn request(&self, prompt: Vec<ContentBlock>) -> SubagentStartRequest {
        SubagentStartRequest::new(self.parent.agent(), prompt)
    }

    async fn start(&self, prompt: Vec<ContentBlock>) -> subagents::Result<SubagentRun> {
        within(
            "the Claude Code start",
            self.rt
                .subagents()
                .start("claude-code", self.request(prompt)),
        )
        .await
    }

    /// Runs `prompt` to its result and disposes the run.
    async fn run(&self, prompt: &str) -> SubagentResult {
        let run = self.start(text(prompt)).await.unwrap();
        let result = within("the result", run.result()).await.unwrap();
        within("the disposal", run.dispose()).await.unwrap();
        result
    }

    /// Every frame the provider wrote to the fake.
    fn record(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("record.jsonl"))
            .unwrap_or_default()
            .lines()
            // A line the fake is still writing is not a frame yet.
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Waits until the fake has read a frame for which `wanted` holds.
    async fn recorded(&self, wanted: impl Fn(&Value) -> bool) {
        within("a frame to reach the fake", async {
            while !self.record().iter().any(&wanted) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A runtime with `config` registered, and a root parent in `cwd`.
async fn registered(
    config: ClaudeCodeProviderConfig,
    cwd: &std::path::Path,
) -> (Runtime, AgentHandle) {
    let rt = memory_runtime(&ScriptedModel::new());
    rt.subagents()
        .register_provider(ClaudeCodeProvider::new(config).unwrap())
        .await
        .unwrap()
        .keep();
    let parent = rt
        .agents()
        .create(CreateAgent::new().cwd(cwd))
        .await
        .unwrap();
    (rt, parent)
}

/// A runtime with `config` registered and one run of it started for a root parent in `cwd`.
async fn started(
    config: ClaudeCodeProviderConfig,
    cwd: &std::path::Path,
) -> (Runtime, SubagentRun) {
    let (rt, parent) = registered(config, cwd).await;
    let run = rt
        .subagents()
        .start(
            "claude-code",
            SubagentStartRequest::new(parent.agent(), text("go")),
        )
        .await
        .unwrap();
    (rt, run)
}

fn expect_user() -> Value {
    json!({"expect": "user"})
}

fn send(frame: Value) -> Value {
    json!({ "send": frame })
}

fn result_success(text: &str) -> Value {
    send(json!({"type": "result", "subtype": "success", "is_error": false, "result": text}))
}

fn failure_line(stage: &str, category: &str) -> String {
    format!("Product subagent failure (product: Claude Code; stage: {stage}; category: {category})")
}

const DENIED_BEFORE_PROMPT: &str = "Claude Code unattended decision (mode: dontAsk; request: tool \
     permission; decision: denied): Claude Code denied the request before an interactive prompt";

// CLAUDE-01
#[actix_rt::test]
async fn the_task_is_one_user_message_and_the_last_strict_success_is_the_answer() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(json!({"type": "system", "subtype": "init"})),
            result_success("first"),
            result_success("last"),
        ],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let run = claude
        .start(vec![ContentBlock::text("one"), ContentBlock::text("two")])
        .await
        .unwrap();
    let result = within("the result", run.result()).await.unwrap();
    within("the disposal", run.dispose()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.output, vec![ContentBlock::text("last")]);
    assert_eq!(result.diagnostic, None);
    let user = &claude.record()[0];
    assert_eq!(user["type"], "user");
    assert_eq!(
        user["message"]["content"],
        json!([{"type": "text", "text": "onetwo"}]),
        "text blocks are joined with no separator"
    );
}

// CLAUDE-02
#[actix_rt::test]
async fn each_sdk_error_subtype_fails_with_its_category_and_no_output() {
    for subtype in [
        "error_during_execution",
        "error_max_turns",
        "error_max_budget_usd",
        "error_max_structured_output_retries",
    ] {
        let claude = Claude::new(
            &[
                expect_user(),
                send(
                    json!({"type": "result", "subtype": subtype, "is_error": true,
                            "errors": ["SECRET_TOKEN in /private/secret.txt"]}),
                ),
            ],
            ClaudePermissionMode::DontAsk,
        )
        .await;
        let result = claude.run("go").await;
        assert_eq!(result.stop_reason, StopReason::Error, "{subtype}");
        assert_eq!(result.output, Vec::<ContentBlock>::new());
        assert_eq!(
            result.diagnostic.as_deref(),
            Some(failure_line("query-run", subtype).as_str())
        );
    }
}

// CLAUDE-03
#[actix_rt::test]
async fn an_invalid_success_an_unknown_subtype_and_a_missing_result_fail_closed() {
    for (frames, category) in [
        (
            vec![send(
                json!({"type": "result", "subtype": "success", "is_error": true, "result": "answer"}),
            )],
            "invalid-success",
        ),
        (vec![result_success(" \n ")], "invalid-success"),
        (
            vec![send(
                json!({"type": "result", "subtype": "future_failure", "is_error": true,
                             "errors": ["SECRET_TOKEN"]}),
            )],
            "unknown",
        ),
        (
            vec![
                send(json!({"type": "system", "subtype": "init"})),
                json!({"exit": 0}),
            ],
            "missing-result",
        ),
    ] {
        let mut steps = vec![expect_user()];
        steps.extend(frames);
        let claude = Claude::new(&steps, ClaudePermissionMode::DontAsk).await;
        let result = claude.run("go").await;
        assert_eq!(result.stop_reason, StopReason::Error, "{category}");
        assert_eq!(
            result.diagnostic.as_deref(),
            Some(failure_line("query-run", category).as_str())
        );
        assert!(!result.diagnostic.unwrap().contains("SECRET_TOKEN"));
    }
}

// CLAUDE-04
#[actix_rt::test]
async fn a_permission_denial_before_a_failure_is_the_diagnostics_fact() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(
                json!({"type": "system", "subtype": "permission_denied", "tool_name": "Bash",
                        "message": "command with SECRET_TOKEN was denied"}),
            ),
            send(
                json!({"type": "result", "subtype": "error_during_execution", "is_error": true,
                        "errors": []}),
            ),
        ],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let result = claude.run("go").await;
    assert_eq!(
        result.diagnostic.unwrap(),
        format!(
            "{}\n{DENIED_BEFORE_PROMPT}",
            failure_line("query-run", "error_during_execution")
        )
    );
}

// CLAUDE-05
#[actix_rt::test]
async fn a_success_after_a_denial_carries_no_diagnostic() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(json!({"type": "system", "subtype": "permission_denied"})),
            result_success("fine"),
        ],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let result = claude.run("go").await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.diagnostic, None);
}

// CLAUDE-06
#[actix_rt::test]
async fn a_permission_prompt_is_denied_without_a_human() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(json!({"type": "control_request", "request_id": "req-7",
                        "request": {"subtype": "can_use_tool", "tool_name": "Write",
                                    "input": {"file_path": "/tmp/x"}}})),
            json!({"expect": "control_response"}),
            send(json!({"type": "result", "subtype": "error_during_execution", "is_error": true})),
        ],
        ClaudePermissionMode::AcceptEdits,
    )
    .await;
    let result = claude.run("go").await;
    let reply = claude
        .record()
        .into_iter()
        .find(|frame| frame["type"] == "control_response")
        .expect("the prompt was answered");
    assert_eq!(
        reply["response"],
        json!({"subtype": "success", "request_id": "req-7",
               "response": {"behavior": "deny",
                            "message": "This unattended Claude Code subagent cannot request human approval."}})
    );
    assert_eq!(
        result.diagnostic.unwrap(),
        format!(
            "{}\nClaude Code unattended decision (mode: acceptEdits; request: tool permission; \
             decision: denied): the provider does not request human approval",
            failure_line("query-run", "error_during_execution")
        )
    );
}

// CLAUDE-14
#[actix_rt::test]
async fn an_elicitation_is_declined_and_an_unknown_control_request_refused() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(json!({"type": "control_request", "request_id": "req-1",
                        "request": {"subtype": "elicitation", "message": "Pick one"}})),
            json!({"expect": "control_response"}),
            send(json!({"type": "control_request", "request_id": "req-2",
                        "request": {"subtype": "future_request"}})),
            json!({"expect": "control_response"}),
            send(json!({"type": "result", "subtype": "error_during_execution", "is_error": true})),
        ],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let result = claude.run("go").await;
    let replies: Vec<Value> = claude
        .record()
        .into_iter()
        .filter(|frame| frame["type"] == "control_response")
        .map(|frame| frame["response"].clone())
        .collect();
    assert_eq!(
        replies,
        [
            json!({"subtype": "success", "request_id": "req-1",
                   "response": {"action": "decline"}}),
            json!({"subtype": "error", "request_id": "req-2",
                   "error": "unsupported control request"}),
        ]
    );
    assert_eq!(
        result.diagnostic.unwrap(),
        format!(
            "{}\nClaude Code unattended decision (mode: dontAsk; request: MCP elicitation; \
             decision: declined): the provider does not collect interactive MCP input",
            failure_line("query-run", "error_during_execution")
        )
    );
}

// CLAUDE-07
#[actix_rt::test]
async fn an_exit_before_any_result_is_a_process_failure_with_its_exit_code() {
    let claude = Claude::new(
        &[expect_user(), json!({"exit": 23})],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let result = claude.run("go").await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(
            "Product subagent failure (product: Claude Code; stage: process; category: \
             process-exit; exit code: 23)"
        )
    );
}

// A CLI that prints an endless line (issue #18): the line is refused past `maxFrameBytes`
// instead of held, the run fails with its own category, and disposal takes the process away.
#[actix_rt::test]
async fn a_line_longer_than_the_frame_limit_fails_the_run_and_is_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ClaudeCodeProviderConfig::new("sh");
    // Ten megabytes without a newline, then silence: nothing past the limit is kept.
    config.args = vec![
        "-c".to_owned(),
        "head -c 10000000 /dev/zero | tr '\\0' x; sleep 60".to_owned(),
    ];
    config.max_frame_bytes = 64 << 10;
    config.dispose_grace_ms = 500.0;
    let (_rt, run) = started(config, dir.path()).await;
    let result = within("the result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(failure_line("query-run", "frame-too-long").as_str())
    );
    within("the disposal", run.dispose()).await.unwrap();
}

// A limit of no bytes is refused when the provider is built.
#[test]
fn a_frame_limit_of_zero_is_an_invalid_config() {
    let mut config = ClaudeCodeProviderConfig::new("claude");
    config.max_frame_bytes = 0;
    let error = ClaudeCodeProvider::new(config).err().unwrap();
    assert_eq!(error.code(), ErrorCode::InvalidConfig);
    assert!(error.message().contains("maxFrameBytes"), "{error}");
}

// The CLI reports a failed login as an assistant message carrying `"error":
// "authentication_failed"` and then a failing "success" (issue #18): the run fails as
// `authentication`, not `invalid-success`, and the CLI's own text stays out of the diagnostic.
#[actix_rt::test]
async fn an_authentication_failure_is_categorized_from_the_assistant_error() {
    for (error, category) in [
        ("authentication_failed", "authentication"),
        ("rate_limit", "rate-limit"),
        ("something_new", "unknown"),
    ] {
        let claude = Claude::new(
            &[
                expect_user(),
                send(json!({"type": "assistant", "error": error, "message": {"role": "assistant",
                    "content": [{"type": "text", "text": "Invalid API key SECRET · Please run /login"}]}})),
                send(json!({"type": "result", "subtype": "success", "is_error": true,
                    "result": "Invalid API key SECRET · Please run /login"})),
            ],
            ClaudePermissionMode::DontAsk,
        )
        .await;
        let result = claude.run("go").await;
        assert_eq!(result.stop_reason, StopReason::Error);
        let diagnostic = result.diagnostic.unwrap_or_default();
        // The exit code follows when the CLI has exited by then.
        let expected = failure_line("query-run", category);
        assert!(
            diagnostic.starts_with(expected.trim_end_matches(')')),
            "{error}: {diagnostic}"
        );
        assert!(!diagnostic.contains("SECRET"), "{diagnostic}");
    }
}

// CLAUDE-08
#[actix_rt::test]
async fn a_failing_exit_after_a_success_is_an_unknown_failure() {
    let claude = Claude::new(
        &[expect_user(), result_success("answer"), json!({"exit": 31})],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let result = claude.run("go").await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.output, Vec::<ContentBlock>::new());
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(
            "Product subagent failure (product: Claude Code; stage: query-run; category: \
             unknown; exit code: 31)"
        )
    );
}

// CLAUDE-08: a CLI that answers, closes its output and then does not exit (something of its
// own holds it up) fails the run once `disposeGraceMs` passed, instead of leaving the run
// unsettled until it is disposed.
#[actix_rt::test]
async fn a_cli_that_closes_its_output_but_does_not_exit_fails_within_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let success = json!({"type": "result", "subtype": "success", "is_error": false,
                         "result": "answer"});
    let mut config = ClaudeCodeProviderConfig::new("sh");
    config.args = vec![
        "-c".to_owned(),
        format!("read task; echo '{success}'; exec >&-; exec sleep 60"),
    ];
    config.dispose_grace_ms = 300.0;
    let (_rt, run) = started(config, dir.path()).await;
    let result = within("the result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(failure_line("query-run", "unknown").as_str())
    );
    within("the disposal", run.dispose()).await.unwrap();
}

// CLAUDE-09
#[actix_rt::test]
async fn cancellation_settles_aborted_with_no_output_and_interrupts_the_cli() {
    let claude = Claude::new(
        &[
            expect_user(),
            send(json!({"type": "system", "subtype": "init"})),
            json!({"hang": true}),
        ],
        ClaudePermissionMode::DontAsk,
    )
    .await;
    let cancel = CancellationToken::new();
    let run = within(
        "the start",
        claude.rt.subagents().start(
            "claude-code",
            claude.request(text("go")).cancel(cancel.clone()),
        ),
    )
    .await
    .unwrap();
    claude.recorded(|frame| frame["type"] == "user").await;
    cancel.cancel();
    let result = within("the result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.output, Vec::<ContentBlock>::new());
    assert_eq!(result.diagnostic, None);
    claude
        .recorded(|frame| {
            frame["type"] == "control_request" && frame["request"]["subtype"] == "interrupt"
        })
        .await;
    within("the disposal", run.dispose()).await.unwrap();
}

// CLAUDE-10
#[actix_rt::test]
async fn the_invocation_carries_the_mode_and_never_asks_a_human() {
    for (mode, expected) in [
        (
            ClaudePermissionMode::DontAsk,
            "--permission-mode dontAsk --disallowedTools AskUserQuestion \
             --permission-prompt-tool stdio --no-session-persistence",
        ),
        (
            ClaudePermissionMode::Plan,
            "--permission-mode plan --disallowedTools AskUserQuestion,ExitPlanMode \
             --permission-prompt-tool stdio --no-session-persistence",
        ),
        (
            ClaudePermissionMode::BypassPermissions,
            "--permission-mode bypassPermissions --disallowedTools AskUserQuestion \
             --allow-dangerously-skip-permissions --no-session-persistence",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let args = dir.path().join("args");
        let mut config = ClaudeCodeProviderConfig::new("sh");
        config.args = vec![
            "-c".to_owned(),
            format!("echo \"$*\" > '{}'", args.display()),
            "claude".to_owned(),
        ];
        config.permission_mode = mode;
        let (_rt, run) = started(config, dir.path()).await;
        within("the result", run.result()).await.unwrap();
        within("the disposal", run.dispose()).await.unwrap();
        let written = std::fs::read_to_string(&args).unwrap();
        assert_eq!(
            written.trim(),
            format!("--output-format stream-json --verbose --input-format stream-json {expected}"),
            "{mode:?}"
        );
    }
}

// CLAUDE-11
#[actix_rt::test]
async fn the_task_must_be_text_and_not_blank_and_the_start_must_not_be_cancelled() {
    let claude = Claude::new(&[expect_user()], ClaudePermissionMode::DontAsk).await;
    let empty = claude.start(Vec::new()).await.unwrap_err();
    assert_eq!(empty.code(), ErrorCode::InvalidArgs);
    assert_eq!(
        empty.message(),
        "subagent-claude-code: the one-shot task must contain only text blocks"
    );
    let blank = claude.start(text(" \n ")).await.unwrap_err();
    assert_eq!(
        blank.message(),
        "subagent-claude-code: the one-shot task must not be empty"
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    let refused = claude
        .rt
        .subagents()
        .start("claude-code", claude.request(text("go")).cancel(cancel))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::AbortedBeforePublication);
    assert_eq!(
        refused.message(),
        "subagent-claude-code: request was aborted before SDK startup"
    );
    assert!(!claude.file("record.jsonl").exists(), "nothing was started");
}

// CLAUDE-12
#[actix_rt::test]
async fn the_config_reads_the_reference_keys_and_refuses_interactive_modes() {
    let config: ClaudeCodeProviderConfig = serde_json::from_value(json!({
        "providerName": "claude-safe",
        "permissionMode": "bypassPermissions",
        "env": {"ANTHROPIC_API_KEY": "fake"},
        "disposeGraceMs": 29,
    }))
    .unwrap();
    assert_eq!(
        config.permission_mode,
        ClaudePermissionMode::BypassPermissions
    );
    assert_eq!(
        serde_json::from_value::<ClaudeCodeProviderConfig>(json!({})).unwrap(),
        ClaudeCodeProviderConfig::default()
    );
    for mode in ["default", "interactive", "future-mode"] {
        let refused =
            serde_json::from_value::<ClaudeCodeProviderConfig>(json!({"permissionMode": mode}));
        assert!(refused.is_err(), "{mode}");
    }
    for (grace, message) in [
        (
            0.0,
            "subagent-claude-code: disposeGraceMs must be a positive finite number",
        ),
        (
            f64::NAN,
            "subagent-claude-code: disposeGraceMs must be a positive finite number",
        ),
        (
            2_147_483_648.0,
            "subagent-claude-code: disposeGraceMs must be no greater than 2147483647",
        ),
    ] {
        let config = ClaudeCodeProviderConfig {
            dispose_grace_ms: grace,
            ..ClaudeCodeProviderConfig::default()
        };
        let error = ClaudeCodeProvider::new(config).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidConfig);
        assert_eq!(error.message(), message);
    }
}

// CLAUDE-13
#[actix_rt::test]
async fn a_parent_without_a_cwd_cannot_delegate() {
    let claude = Claude::new(&[expect_user()], ClaudePermissionMode::DontAsk).await;
    let orphan = claude.rt.agents().create(CreateAgent::new()).await.unwrap();
    let error = claude
        .rt
        .subagents()
        .start(
            "claude-code",
            SubagentStartRequest::new(orphan.agent(), text("go")),
        )
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "subagent-claude-code: no working directory for the child — delegate from a parent \
         session that has one"
    );
}
