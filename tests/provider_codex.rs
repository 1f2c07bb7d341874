//! The Codex provider against `subagents replay`, a fake `codex app-server` scripted by a JSON
//! Lines fixture that records every frame the provider sends. Covered: the exact handshake and
//! turn frames, answer selection, every terminal and its safe diagnostic, the unattended replies
//! to server requests and their permission facts, stderr signatures, exits and signals,
//! cancellation and `turn/interrupt`, no process outliving a run, isolation of overlapping runs
//! and named instances, and the config and start validation. Reference numbers are the tests of
//! deepseek-harness `subagent-codex` (numbered as in /tmp/drafts/codex.md §2). What needs exact
//! tick ordering or the provisional turn/start window (frames before the turn/start response)
//! stays with the wire's unit tests: the fake answers turn/start the moment it reads it.

#[path = "provider_codex/fixture.rs"]
mod fixture;

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};
use subagents::{
    CodexPermissionMode, CodexProvider, CodexProviderConfig, ContentBlock, CreateAgent, ErrorCode,
    StopReason, SubagentProvider, SubagentResult, SubagentRun, SubagentStartRequest,
};
use tokio_util::sync::CancellationToken;

use crate::support::{text, within, Warnings};
use fixture::{
    alive, assert_safe, await_reply, completed, completed_in, fact, failed, failure, failure_with,
    fake_pid, final_answer, handshake_steps, hang, item, message_in, published, reply_to, running,
    send, sent, server_request, shell_fake, sync_steps, turn_completed, turn_steps_for, unphased,
    Codex, DECLINED_COMMAND, DECLINED_FILE, ESCALATION_REJECTED, NO_ANSWERS, NO_APPROVAL, NO_GRANT,
    NO_MCP_INPUT, PROVIDER, SANDBOX_FAILURE, SANDBOX_VIOLATION, SECRET,
};

const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
const FILE_APPROVAL: &str = "item/fileChange/requestApproval";
const PERMISSIONS: &str = "item/permissions/requestApproval";
const USER_INPUT: &str = "item/tool/requestUserInput";
const ELICITATION: &str = "mcpServer/elicitation/request";
const BYPASS: &str = "dangerously-bypass-approvals-and-sandbox";

/// The shell fake's start: answer initialize, read initialized.
const SHELL_INITIALIZED: &str = r#"answer '{"userAgent":"codex-cli 0.147.0"}'
read -r line
"#;

async fn settle(run: &SubagentRun) -> SubagentResult {
    within("the run's result", run.result()).await.unwrap()
}

async fn dispose(run: &SubagentRun) {
    within("the run's disposal", run.dispose()).await.unwrap();
}

/// Runs `prompt` on the default provider to its result and disposes the run (after which the
/// fake has exited, so its record is complete).
async fn run_once(codex: &Codex, prompt: &str) -> SubagentResult {
    let run = codex.start(prompt).await.unwrap();
    let result = settle(&run).await;
    dispose(&run).await;
    result
}

/// Runs `go` to its result, waits until the fake has read the reply to its request `id`
/// (a run that failed at that request may be disposed before the fake reads on), then
/// disposes.
async fn run_answering(codex: &Codex, id: &str) -> SubagentResult {
    let run = codex.start("go").await.unwrap();
    let result = settle(&run).await;
    codex
        .recorded(PROVIDER, "the request's reply", |frame| {
            frame.get("method").is_none() && frame["id"] == id
        })
        .await;
    dispose(&run).await;
    result
}

/// One run of `go` against a default provider replaying `steps`: its result and the record.
async fn replay(steps: Vec<Value>) -> (SubagentResult, Vec<Value>) {
    replay_with(steps, |_| {}).await
}

async fn replay_with(
    steps: Vec<Value>,
    tweak: impl FnOnce(&mut CodexProviderConfig),
) -> (SubagentResult, Vec<Value>) {
    let codex = Codex::with(steps, tweak).await;
    let result = run_once(&codex, "go").await;
    (result, codex.record())
}

fn outcome(stop_reason: StopReason, output: &[&str], diagnostic: Option<String>) -> SubagentResult {
    SubagentResult {
        output: output
            .iter()
            .map(|text| ContentBlock::text(*text))
            .collect(),
        structured: None,
        stop_reason,
        diagnostic,
    }
}

/// A published run that failed with `diagnostic`.
fn errored(output: &[&str], diagnostic: String) -> SubagentResult {
    outcome(StopReason::Error, output, Some(diagnostic))
}

/// Asserts `frame` is exactly a request as the provider sends it — `jsonrpc`, a fresh
/// `req_<32 lowercase hex>` id, `method`, `params`, nothing else — and returns its id.
fn assert_request(frame: &Value, method: &str, params: Value) -> String {
    let id = frame["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} has a string id: {frame}"));
    let hex = id.strip_prefix("req_").unwrap_or_default();
    assert!(
        hex.len() == 32 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
        "{method} id {id}"
    );
    assert_eq!(
        frame,
        &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    );
    id.to_owned()
}

/// The start's failure on the default provider.
async fn start_error(codex: &Codex, request: SubagentStartRequest) -> subagents::SubagentError {
    codex.start_with(PROVIDER, request).await.unwrap_err()
}

/// initialize and initialized, then thread/start answered with `reply`.
fn thread_start_answered(reply: Value) -> Vec<Value> {
    let mut steps = handshake_steps("thread-1");
    steps[2] = json!({"expect": "thread/start", "reply": reply});
    steps
}

/// The command approval request every fact test sends.
fn command_request() -> Value {
    server_request(
        "command",
        COMMAND_APPROVAL,
        json!({"threadId": "thread-1", "turnId": "turn-1",
               "availableDecisions": ["decline", "cancel"], "command": "cat /private/secret.txt"}),
    )
}

// CODEX-01 (reference 11, 35)
#[actix_rt::test]
async fn the_handshake_and_turn_frames_are_exact() {
    let codex = Codex::new(published(vec![final_answer("answer"), turn_completed()])).await;
    let request = SubagentStartRequest::new(
        codex.parent.agent(),
        vec![ContentBlock::text("first"), ContentBlock::text("second")],
    );
    let run = codex.start_with(PROVIDER, request).await.unwrap();
    assert!(
        run.local_agent().is_none(),
        "an external child has no local agent"
    );
    assert_eq!(
        settle(&run).await,
        outcome(StopReason::Completed, &["answer"], None)
    );
    dispose(&run).await;
    let record = codex.record();
    let methods: Vec<&str> = record.iter().filter_map(|f| f["method"].as_str()).collect();
    assert_eq!(
        methods[..4],
        ["initialize", "initialized", "thread/start", "turn/start"]
    );
    let initialize = assert_request(
        &sent(&record, "initialize"),
        "initialize",
        json!({
            "clientInfo": {"name": "deepseek-harness", "title": "DeepSeek Harness", "version": "0.0.1"},
            "capabilities": {"experimentalApi": false, "requestAttestation": false},
        }),
    );
    assert_eq!(
        sent(&record, "initialized"),
        json!({"jsonrpc": "2.0", "method": "initialized"}),
        "initialized is a notification without params"
    );
    let thread = assert_request(
        &sent(&record, "thread/start"),
        "thread/start",
        json!({"cwd": codex.dir.path().to_str().unwrap(), "ephemeral": true, "approvalPolicy": "never"}),
    );
    let turn = assert_request(
        &sent(&record, "turn/start"),
        "turn/start",
        json!({"threadId": "thread-1", "input": [
            {"type": "text", "text": "first", "text_elements": []},
            {"type": "text", "text": "second", "text_elements": []},
        ]}),
    );
    let ids: HashSet<String> = [initialize, thread, turn].into_iter().collect();
    assert_eq!(ids.len(), 3, "every request has an id of its own");
}

// CODEX-02 (reference 8)
#[actix_rt::test]
async fn thread_start_carries_each_permission_modes_fields() {
    for (mode, fields) in [
        (
            CodexPermissionMode::default(),
            json!({"approvalPolicy": "untrusted"}),
        ),
        (
            CodexPermissionMode::Never,
            json!({"approvalPolicy": "never"}),
        ),
        (
            CodexPermissionMode::ApproveForMe,
            json!({"approvalPolicy": "on-request", "approvalsReviewer": "auto_review",
                   "sandbox": "workspace-write"}),
        ),
        (
            CodexPermissionMode::DangerouslyBypassApprovalsAndSandbox,
            json!({"approvalPolicy": "never", "sandbox": "danger-full-access"}),
        ),
    ] {
        let steps = published(vec![final_answer("answer"), turn_completed()]);
        let codex = Codex::with(steps, move |config| config.permission_mode = mode).await;
        let result = run_once(&codex, "go").await;
        assert_eq!(result.stop_reason, StopReason::Completed, "{fields}");
        let mut expected = json!({"cwd": codex.dir.path().to_str().unwrap(), "ephemeral": true});
        let object = expected.as_object_mut().unwrap();
        object.extend(fields.as_object().unwrap().clone());
        assert_eq!(
            sent(&codex.record(), "thread/start")["params"],
            expected,
            "{fields}"
        );
    }
}

// CODEX-03 (reference 11, 33)
#[actix_rt::test]
async fn the_last_final_answer_wins_and_everything_else_is_ignored() {
    let other_failure = json!({"message": SECRET, "codexErrorInfo": "other"});
    let (result, _) = replay(published(vec![
        send(json!({"method": "turn/started",
                    "params": {"threadId": "thread-1", "turn": {"id": "turn-1"}}})),
        send(json!({"method": "future/notification", "params": {}})),
        message_in("thread-2", "turn-1", "other thread", json!("final_answer")),
        message_in("thread-1", "turn-2", "other turn", json!("final_answer")),
        item(json!({"type": "reasoning", "text": "not output"})),
        message_in("thread-1", "turn-1", "commentary", json!("commentary")),
        unphased("unphased"),
        final_answer("first final"),
        final_answer("last final"),
        unphased("a later unphased answer"),
        completed_in("thread-2", "turn-1", "failed", other_failure.clone()),
        completed_in("thread-1", "turn-2", "failed", other_failure),
        turn_completed(),
    ]))
    .await;
    assert_eq!(
        result,
        outcome(StopReason::Completed, &["last final"], None)
    );
}

// CODEX-04 (reference 12)
#[actix_rt::test]
async fn the_last_unphased_answer_is_the_fallback() {
    let (result, _) = replay(published(vec![
        unphased("first"),
        unphased("fallback"),
        message_in("thread-1", "turn-1", "commentary", json!("commentary")),
        turn_completed(),
    ]))
    .await;
    assert_eq!(result, outcome(StopReason::Completed, &["fallback"], None));
}

// CODEX-05 (reference 17)
#[actix_rt::test]
async fn a_completed_turn_without_an_answer_fails_closed() {
    for (case, frames) in [
        ("no message", vec![]),
        (
            "commentary and reasoning only",
            vec![
                message_in("thread-1", "turn-1", "commentary", json!("commentary")),
                item(json!({"type": "reasoning", "text": "not output"})),
            ],
        ),
        (
            "a blank final after an unphased answer",
            vec![unphased("fallback"), final_answer(" \n ")],
        ),
    ] {
        let (result, _) = replay(published([frames, vec![turn_completed()]].concat())).await;
        assert_eq!(result, errored(&[], failure("turn", "unknown")), "{case}");
    }
}

// CODEX-06 (reference 17)
#[actix_rt::test]
async fn a_malformed_agent_message_fails_the_turn() {
    for (case, malformed) in [
        (
            "a non-string text",
            json!({"type": "agentMessage", "text": 42, "phase": "final_answer"}),
        ),
        (
            "an unknown phase",
            json!({"type": "agentMessage", "text": "x", "phase": "future_phase"}),
        ),
        (
            "a missing phase",
            json!({"type": "agentMessage", "text": "x"}),
        ),
    ] {
        let steps = published(vec![
            final_answer("answer"),
            item(malformed),
            turn_completed(),
        ]);
        let (result, _) = replay(steps).await;
        // Which output a fatal failure keeps is the settlement's business; the failure is not.
        assert_eq!(result.stop_reason, StopReason::Error, "{case}");
        assert_eq!(
            result.diagnostic,
            Some(failure("turn", "unknown")),
            "{case}"
        );
    }
}

// CODEX-07 (reference 38, 13)
#[actix_rt::test]
async fn string_error_categories_keep_the_partial_answer() {
    for category in [
        "contextWindowExceeded",
        "sessionBudgetExceeded",
        "usageLimitExceeded",
        "serverOverloaded",
        "cyberPolicy",
        "internalServerError",
        "unauthorized",
        "badRequest",
        "threadRollbackFailed",
        "other",
    ] {
        let steps = published(vec![unphased("partial answer"), failed(json!(category))]);
        let (result, _) = replay(steps).await;
        // Only a full context window is max-tokens; cyberPolicy is no refusal.
        let stop_reason = if category == "contextWindowExceeded" {
            StopReason::MaxTokens
        } else {
            StopReason::Error
        };
        assert_eq!(
            result,
            outcome(
                stop_reason,
                &["partial answer"],
                Some(failure("turn", category))
            ),
            "{category}"
        );
    }
}

// CODEX-08 (reference 38, 14)
#[actix_rt::test]
async fn object_error_forms_keep_only_a_numeric_http_status() {
    for (info, line) in [
        (
            json!({"httpConnectionFailed": {"httpStatusCode": 503}}),
            failure_with("turn", "httpConnectionFailed", "HTTP status: 503"),
        ),
        (
            json!({"responseStreamConnectionFailed": {"httpStatusCode": null}}),
            failure("turn", "responseStreamConnectionFailed"),
        ),
        (
            json!({"responseStreamDisconnected": {}}),
            failure("turn", "responseStreamDisconnected"),
        ),
        (
            json!({"responseTooManyFailedAttempts": {"httpStatusCode": "503"}}),
            failure("turn", "responseTooManyFailedAttempts"),
        ),
        (
            json!({"activeTurnNotSteerable": {"turnKind": "review"}}),
            failure("turn", "activeTurnNotSteerable"),
        ),
    ] {
        let steps = published(vec![unphased("partial answer"), failed(info.clone())]);
        let (result, _) = replay(steps).await;
        assert_eq!(result, errored(&["partial answer"], line), "{info}");
    }
}

// CODEX-09 (reference 38, 15, 17)
#[actix_rt::test]
async fn unknown_or_malformed_error_info_is_unknown() {
    for terminal in [
        failed(json!("futureError")),
        failed(json!({"futureVariant": {"message": "SECRET_TOKEN"}})),
        failed(json!({"httpConnectionFailed": {"httpStatusCode": 503}, "otherVariant": {}})),
        failed(json!({"httpConnectionFailed": null})),
        completed("failed", json!({"message": "no"})),
        completed("failed", json!("SECRET_TOKEN")),
    ] {
        let label = terminal.to_string();
        let (result, _) = replay(published(vec![unphased("partial answer"), terminal])).await;
        assert_eq!(
            result,
            errored(&["partial answer"], failure("turn", "unknown")),
            "{label}"
        );
    }
}

// CODEX-10 (reference 17)
#[actix_rt::test]
async fn an_interrupted_turn_fails_with_the_partial_answer() {
    let steps = published(vec![
        unphased("partial answer"),
        completed("interrupted", Value::Null),
    ]);
    let (result, _) = replay(steps).await;
    assert_eq!(
        result,
        errored(&["partial answer"], failure("turn", "unknown"))
    );
}

// CODEX-11 (reference 17, 18)
#[actix_rt::test]
async fn an_invalid_terminal_status_or_shape_fails_closed() {
    for terminal in [
        completed("inProgress", Value::Null),
        send(json!({"method": "turn/completed", "params": null})),
        send(json!({"method": "turn/completed",
                    "params": {"threadId": "thread-1", "turn": "turn-1"}})),
    ] {
        let label = terminal.to_string();
        let (result, _) = replay(published(vec![terminal])).await;
        assert_eq!(result, errored(&[], failure("turn", "unknown")), "{label}");
    }
}

// CODEX-12 (reference 21)
#[actix_rt::test]
async fn a_sandbox_failure_attaches_a_safe_fact() {
    let (result, _) = replay(published(vec![completed(
        "failed",
        json!({"message": "failed at /private/secret.txt with SECRET_TOKEN",
               "additionalDetails": "raw command payload", "codexErrorInfo": "sandboxError"}),
    )]))
    .await;
    let expected = format!(
        "{}\n{}",
        failure("turn", "sandboxError"),
        fact("never", "sandbox execution", "failed", SANDBOX_FAILURE)
    );
    assert_eq!(result, errored(&[], expected));
}

// CODEX-13 (reference 22)
#[actix_rt::test]
async fn declined_items_attach_facts_without_their_payloads() {
    let command = item(json!({"type": "commandExecution", "status": "declined",
                              "command": "cat /private/secret.txt"}));
    let file = item(json!({"type": "fileChange", "status": "declined",
                           "patch": "SECRET_TOKEN in /private/secret.txt"}));
    for (items, latest) in [
        (
            vec![command.clone()],
            fact("never", "command execution", "declined", DECLINED_COMMAND),
        ),
        (
            vec![command, file],
            fact("never", "file change", "declined", DECLINED_FILE),
        ),
    ] {
        let steps = published([items, vec![failed(json!("other"))]].concat());
        let (result, _) = replay(steps).await;
        let expected = format!("{}\n{latest}", failure("turn", "other"));
        assert_safe(result.diagnostic.as_deref().unwrap_or_default());
        assert_eq!(result, errored(&[], expected));
    }
}

// CODEX-14 (reference 20, 41, 37)
#[actix_rt::test]
async fn each_unattended_request_is_answered_and_its_fact_attached() {
    let turn = |extra: Value| {
        let mut params = json!({"threadId": "thread-1", "turnId": "turn-1"});
        params
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        params
    };
    let rows = [
        (
            "command",
            COMMAND_APPROVAL,
            turn(json!({"availableDecisions": ["decline", "cancel"],
                        "command": "cat /private/secret.txt"})),
            json!({"decision": "cancel"}),
            ("command approval", "cancelled", NO_APPROVAL),
        ),
        (
            "command-decline",
            COMMAND_APPROVAL,
            turn(json!({"availableDecisions": ["decline"]})),
            json!({"decision": "decline"}),
            ("command approval", "declined", NO_APPROVAL),
        ),
        (
            "command-null",
            COMMAND_APPROVAL,
            turn(json!({"availableDecisions": null})),
            json!({"decision": "decline"}),
            ("command approval", "declined", NO_APPROVAL),
        ),
        (
            "file",
            FILE_APPROVAL,
            turn(json!({"availableDecisions": ["decline"]})),
            json!({"decision": "decline"}),
            ("file approval", "declined", NO_APPROVAL),
        ),
        (
            "file-cancel",
            FILE_APPROVAL,
            turn(json!({"availableDecisions": ["cancel"]})),
            json!({"decision": "cancel"}),
            ("file approval", "cancelled", NO_APPROVAL),
        ),
        (
            "file-default",
            FILE_APPROVAL,
            turn(json!({})),
            json!({"decision": "decline"}),
            ("file approval", "declined", NO_APPROVAL),
        ),
        (
            "permissions",
            PERMISSIONS,
            turn(json!({})),
            json!({"permissions": {}, "scope": "turn"}),
            ("permission grant", "denied", NO_GRANT),
        ),
        (
            "user-input",
            USER_INPUT,
            turn(json!({"questions": []})),
            json!({"answers": {}}),
            ("user input", "empty response", NO_ANSWERS),
        ),
        (
            "mcp",
            ELICITATION,
            json!({"threadId": "thread-1", "turnId": null}),
            json!({"action": "decline", "content": null, "_meta": null}),
            ("MCP elicitation", "declined", NO_MCP_INPUT),
        ),
    ];
    for (id, method, params, reply, (request, decision, reason)) in rows {
        let steps = published(vec![
            server_request(id, method, params),
            await_reply(id),
            failed(json!("other")),
        ]);
        let codex = Codex::new(steps).await;
        let result = run_once(&codex, "go").await;
        assert_eq!(
            reply_to(&codex.record(), id),
            json!({"jsonrpc": "2.0", "id": id, "result": reply}),
            "{id}"
        );
        let expected = format!(
            "{}\n{}",
            failure("turn", "other"),
            fact("never", request, decision, reason)
        );
        assert_eq!(result, errored(&[], expected), "{id}");
    }
    // A fact never rides on a completed run.
    let steps = published(vec![
        command_request(),
        await_reply("command"),
        final_answer("answer"),
        turn_completed(),
    ]);
    let (result, _) = replay(steps).await;
    assert_eq!(result, outcome(StopReason::Completed, &["answer"], None));
}

// CODEX-15 (reference 49)
#[actix_rt::test]
async fn a_failed_run_logs_one_safe_line_and_a_max_tokens_run_none() {
    let warnings = Warnings::capture();
    let codex = Codex::bare().await;
    let steps = published(vec![
        command_request(),
        await_reply("command"),
        failed(json!("other")),
    ]);
    codex
        .register("codex-diagnostic", steps, |config| {
            config.permission_mode = CodexPermissionMode::ApproveForMe;
        })
        .await
        .unwrap()
        .keep();
    let steps = published(vec![
        unphased("partial answer"),
        failed(json!("contextWindowExceeded")),
    ]);
    codex
        .register("codex-budget", steps, |_| {})
        .await
        .unwrap()
        .keep();
    let run = codex
        .start_with("codex-diagnostic", codex.request("go"))
        .await
        .unwrap();
    let expected = format!(
        "{}\n{}",
        failure("turn", "other"),
        fact(
            "approve-for-me",
            "command approval",
            "cancelled",
            NO_APPROVAL
        )
    );
    assert_eq!(settle(&run).await, errored(&[], expected));
    dispose(&run).await;
    let run = codex
        .start_with("codex-budget", codex.request("go"))
        .await
        .unwrap();
    assert_eq!(settle(&run).await.stop_reason, StopReason::MaxTokens);
    dispose(&run).await;
    let logged = warnings.text();
    let line = format!(
        "subagent-codex \"codex-diagnostic\": child run failed (error): subagent-codex: {}",
        failure("turn", "other")
    );
    assert!(logged.contains(&line), "{logged}");
    assert_eq!(
        logged.matches("child run failed").count(),
        1,
        "a max-tokens result is not logged: {logged}"
    );
    assert!(
        !logged.contains("Codex unattended decision"),
        "the log line never carries the fact: {logged}"
    );
    assert_safe(&logged);
}

// CODEX-16 (reference 27)
#[actix_rt::test]
async fn unsupported_or_misassociated_requests_fail_the_run() {
    let no_decision = "subagent-codex: app-server offered no unattended approval decision";
    for (id, method, params, message) in [
        (
            "unknown",
            "future/request",
            json!({"threadId": "thread-1", "turnId": "turn-1"}),
            "subagent-codex: unsupported app-server request \"future/request\"",
        ),
        (
            "accept-only",
            COMMAND_APPROVAL,
            json!({"threadId": "thread-1", "turnId": "turn-1", "availableDecisions": ["accept"]}),
            no_decision,
        ),
        (
            "not-a-list",
            FILE_APPROVAL,
            json!({"threadId": "thread-1", "turnId": "turn-1", "availableDecisions": "decline"}),
            no_decision,
        ),
        (
            "other-thread",
            FILE_APPROVAL,
            json!({"threadId": "thread-2", "turnId": "turn-1", "availableDecisions": ["decline"]}),
            "subagent-codex: app-server request referenced another thread",
        ),
        (
            "other-turn",
            COMMAND_APPROVAL,
            json!({"threadId": "thread-1", "turnId": "turn-2", "availableDecisions": ["decline"]}),
            "subagent-codex: app-server request referenced another turn",
        ),
        (
            "no-turn",
            PERMISSIONS,
            json!({"threadId": "thread-1"}),
            "subagent-codex: app-server returned invalid server request turn id",
        ),
    ] {
        let steps = published(vec![server_request(id, method, params), await_reply(id)]);
        let codex = Codex::new(steps).await;
        let result = run_answering(&codex, id).await;
        assert_eq!(
            reply_to(&codex.record(), id),
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}}),
            "{id}"
        );
        assert_eq!(result, errored(&[], failure("turn", "unknown")), "{id}");
    }
}

// CODEX-17 (reference 19)
#[actix_rt::test]
async fn an_unsupported_request_beats_the_terminal_after_it() {
    let codex = Codex::new(published(vec![
        server_request("future-request", "future/request", json!({})),
        final_answer("answer"),
        turn_completed(),
        await_reply("future-request"),
    ]))
    .await;
    let result = run_answering(&codex, "future-request").await;
    assert_eq!(
        reply_to(&codex.record(), "future-request")["error"],
        json!({"code": -32603,
               "message": "subagent-codex: unsupported app-server request \"future/request\""})
    );
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.diagnostic, Some(failure("turn", "unknown")));
}

// CODEX-18 (reference 23, 42)
#[actix_rt::test]
async fn stderr_signatures_attach_facts_without_raw_text() {
    let denied = fact("never", "command execution", "denied", ESCALATION_REJECTED);
    for (mode, line, category, latest) in [
        (
            CodexPermissionMode::Never,
            "SECRET_TOKEN approval policy is Never; reject command — /private/secret.txt"
                .to_owned(),
            "badRequest",
            denied.clone(),
        ),
        (
            CodexPermissionMode::Never,
            format!(
                "approval policy is Never; reject command{}",
                "x".repeat(2048)
            ),
            "badRequest",
            denied,
        ),
        (
            // Both in one line: the later signature wins.
            CodexPermissionMode::DangerouslyBypassApprovalsAndSandbox,
            "approval policy is Never; reject command, then recorded sandbox violation: \
             /private/secret.txt"
                .to_owned(),
            "other",
            fact(BYPASS, "sandbox execution", "failed", SANDBOX_VIOLATION),
        ),
    ] {
        // The line is written before the terminal: queued stderr is drained before settling.
        let steps = published(vec![json!({"stderr": line}), failed(json!(category))]);
        let (result, _) = replay_with(steps, move |config| config.permission_mode = mode).await;
        let expected = format!("{}\n{latest}", failure("turn", category));
        assert_eq!(result, errored(&[], expected), "{line:.60}");
    }
}

// CODEX-19 (reference 16, 45)
#[actix_rt::test]
async fn an_invalid_handshake_response_fails_the_start_with_only_its_stage() {
    let initialize = |reply: Value| vec![json!({"expect": "initialize", "reply": reply})];
    for (case, steps, stage) in [
        (
            "a null initialize result",
            initialize(json!({"result": null})),
            "initialize",
        ),
        (
            "an array initialize result",
            initialize(json!({"result": []})),
            "initialize",
        ),
        (
            "an initialize error",
            initialize(json!({"error": {"code": -32000, "message": SECRET}})),
            "initialize",
        ),
        (
            "an empty thread id",
            thread_start_answered(json!({"result": {"thread": {"id": "", "ephemeral": true}}})),
            "thread-start",
        ),
        (
            "a durable thread",
            thread_start_answered(
                json!({"result": {"thread": {"id": "thread-1", "ephemeral": false}}}),
            ),
            "thread-start",
        ),
        (
            "a thread that is no object",
            thread_start_answered(json!({"result": {"thread": "thread-1"}})),
            "thread-start",
        ),
        (
            "a thread/start error",
            thread_start_answered(json!({"error": {"code": -32000, "message": SECRET}})),
            "thread-start",
        ),
    ] {
        let codex = Codex::new(steps).await;
        let error = start_error(&codex, codex.request("go")).await;
        assert_eq!(error.code(), ErrorCode::ChildStartFailed, "{case}");
        // The protocol's own words (the raw error) stay the source, never the message.
        assert!(std::error::Error::source(&error).is_some(), "{case}");
        assert_eq!(
            error.message(),
            format!("subagent-codex: {}", failure(stage, "unknown")),
            "{case}"
        );
        assert!(
            running(&codex.fixture(PROVIDER)).is_empty(),
            "{case}: the fake was reaped before the start failed"
        );
    }
}

// CODEX-19: an app-server that reads `initialize` and never answers fails the start once
// `startupTimeoutMs` passed, reaped first, instead of holding its caller for as long as it
// stays silent.
#[actix_rt::test]
async fn an_app_server_that_never_answers_the_handshake_fails_the_start_at_its_deadline() {
    let steps = vec![json!({"expect": "initialize"}), hang()];
    let codex = Codex::with(steps, |config| config.startup_timeout_ms = 300.0).await;
    let error = start_error(&codex, codex.request("go")).await;
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        format!("subagent-codex: {}", failure("startup", "timeout"))
    );
    assert!(
        running(&codex.fixture(PROVIDER)).is_empty(),
        "the fake was reaped before the start failed"
    );
}

// CODEX-20 (reference 16, 37)
#[actix_rt::test]
async fn an_invalid_turn_start_response_fails_the_run_at_turn_start() {
    for reply in [
        json!({"result": {"turn": {"id": ""}}}),
        json!({"result": {"turn": null}}),
        json!({"result": null}),
        json!({"error": {"code": -32000, "message": SECRET}}),
    ] {
        let steps = [
            handshake_steps("thread-1"),
            vec![json!({"expect": "turn/start", "reply": reply})],
        ]
        .concat();
        let (result, _) = replay(steps).await;
        assert_eq!(
            result,
            errored(&[], failure("turn-start", "unknown")),
            "{reply}"
        );
    }
}

// CODEX-21 (reference 45)
#[actix_rt::test]
async fn an_exit_during_startup_reports_its_exit_code_or_signal() {
    let codex = Codex::new(vec![json!({"expect": "initialize"}), json!({"exit": 5})]).await;
    let error = start_error(&codex, codex.request("go")).await;
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        format!(
            "subagent-codex: {}",
            failure_with("initialize", "unknown", "exit code: 5")
        )
    );

    let steps = [
        handshake_steps("thread-1")[..2].to_vec(),
        vec![json!({"expect": "thread/start"}), json!({"exit": 23})],
    ]
    .concat();
    let codex = Codex::new(steps).await;
    let error = start_error(&codex, codex.request("go")).await;
    assert_eq!(
        error.message(),
        format!(
            "subagent-codex: {}",
            failure_with("thread-start", "unknown", "exit code: 23")
        )
    );

    let script = format!("{SHELL_INITIALIZED}read -r line\nkill -s ABRT $$\n");
    let codex = Codex::with(Vec::new(), shell_fake(&script)).await;
    let error = start_error(&codex, codex.request("go")).await;
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        format!(
            "subagent-codex: {}",
            failure_with("thread-start", "unknown", "signal: SIGABRT")
        )
    );
}

// CODEX-22 (reference 45)
#[actix_rt::test]
async fn a_command_that_cannot_start_fails_at_initialize() {
    let codex = Codex::with(Vec::new(), |config| {
        config.command = "/nonexistent/SECRET_TOKEN/codex".to_owned();
    })
    .await;
    let error = start_error(&codex, codex.request("go")).await;
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        format!("subagent-codex: {}", failure("initialize", "unknown"))
    );
}

// CODEX-23 (reference 40)
#[actix_rt::test]
async fn an_exit_before_the_terminal_is_a_process_failure() {
    let (result, _) = replay(published(vec![json!({"exit": 9})])).await;
    assert_eq!(
        result,
        errored(&[], failure_with("process", "process-exit", "exit code: 9"))
    );

    let script = format!(
        "{SHELL_INITIALIZED}answer '{{\"thread\":{{\"id\":\"thread-1\",\"ephemeral\":true}}}}'\n\
         answer '{{\"turn\":{{\"id\":\"turn-1\"}}}}'\nkill -s ABRT $$\n"
    );
    let (result, _) = replay_with(Vec::new(), shell_fake(&script)).await;
    assert_eq!(
        result,
        errored(
            &[],
            failure_with("process", "process-exit", "signal: SIGABRT")
        )
    );
}

// CODEX-24 (reference 36)
#[actix_rt::test]
async fn cancelling_settles_aborted_at_once_and_interrupts_the_turn() {
    let codex = Codex::new(published([sync_steps(), vec![hang()]].concat())).await;
    let cancel = CancellationToken::new();
    let request = codex.request("go").cancel(cancel.clone());
    let run = codex.start_with(PROVIDER, request).await.unwrap();
    codex.synced(PROVIDER).await;
    cancel.cancel();
    // The fake never completes the turn: only the local cancellation settles the run.
    assert_eq!(settle(&run).await, outcome(StopReason::Aborted, &[], None));
    let interrupt = codex
        .recorded(PROVIDER, "the turn/interrupt", |frame| {
            frame["method"] == "turn/interrupt"
        })
        .await;
    assert_request(
        &interrupt,
        "turn/interrupt",
        json!({"threadId": "thread-1", "turnId": "turn-1"}),
    );
    dispose(&run).await;
}

// CODEX-25 (reference 36)
#[actix_rt::test]
async fn cancelling_keeps_the_answer_selected_so_far() {
    let steps = published([vec![unphased("half an answer")], sync_steps(), vec![hang()]].concat());
    let codex = Codex::new(steps).await;
    let cancel = CancellationToken::new();
    let request = codex.request("go").cancel(cancel.clone());
    let run = codex.start_with(PROVIDER, request).await.unwrap();
    codex.synced(PROVIDER).await;
    cancel.cancel();
    assert_eq!(
        settle(&run).await,
        outcome(StopReason::Aborted, &["half an answer"], None)
    );
    dispose(&run).await;
}

// CODEX-26 (reference 32, 35)
#[actix_rt::test]
async fn dispose_after_a_completed_turn_interrupts_best_effort() {
    let steps = [
        // SIGTERM follows stdin's close at once: the trap lets the fake read the interrupt.
        vec![json!({"trap_sigterm": true})],
        published(vec![final_answer("answer"), turn_completed()]),
        vec![json!({"expect": "turn/interrupt",
                    "reply": {"error": {"code": -32000, "message": "already done"}}})],
    ]
    .concat();
    let codex = Codex::new(steps).await;
    let run = codex.start("go").await.unwrap();
    let answer = outcome(StopReason::Completed, &["answer"], None);
    assert_eq!(settle(&run).await, answer);
    dispose(&run).await;
    dispose(&run).await;
    assert_eq!(
        settle(&run).await,
        answer,
        "the refused interrupt changes nothing"
    );
    assert_request(
        &sent(&codex.record(), "turn/interrupt"),
        "turn/interrupt",
        json!({"threadId": "thread-1", "turnId": "turn-1"}),
    );
}

// CODEX-27 (reference 35, 50)
#[actix_rt::test]
async fn no_process_outlives_a_run() {
    let codex = Codex::new(published(vec![final_answer("answer"), turn_completed()])).await;
    let run = codex.start("go").await.unwrap();
    assert_eq!(settle(&run).await.stop_reason, StopReason::Completed);
    // The script has ended: the fake waits for stdin to close.
    let pid = fake_pid(&codex.fixture(PROVIDER));
    dispose(&run).await;
    assert!(
        !alive(pid),
        "a completed run's app-server is gone after dispose"
    );

    let codex = Codex::new(published([sync_steps(), vec![hang()]].concat())).await;
    let run = codex.start("go").await.unwrap();
    codex.synced(PROVIDER).await;
    let pid = fake_pid(&codex.fixture(PROVIDER));
    dispose(&run).await;
    assert!(
        !alive(pid),
        "a running turn's app-server is gone after dispose"
    );
    assert_eq!(settle(&run).await, outcome(StopReason::Aborted, &[], None));
}

// CODEX-28 (reference 50, 51)
#[actix_rt::test]
async fn dispose_kills_an_app_server_that_ignores_eof_and_sigterm() {
    let steps = published(
        [
            vec![json!({"trap_sigterm": true})],
            sync_steps(),
            vec![json!({"hang": true, "ignore_eof": true})],
        ]
        .concat(),
    );
    let codex = Codex::with(steps, |config| config.dispose_grace_ms = 100.0).await;
    let run = codex.start("go").await.unwrap();
    codex.synced(PROVIDER).await;
    let pid = fake_pid(&codex.fixture(PROVIDER));
    dispose(&run).await;
    assert!(!alive(pid), "SIGKILL ended it after the grace");
    assert_eq!(settle(&run).await, outcome(StopReason::Aborted, &[], None));
}

// CODEX-29 (reference 47)
#[actix_rt::test]
async fn overlapping_runs_are_isolated() {
    let codex = Codex::bare().await;
    let names: Vec<String> = (0..6).map(|n| format!("codex-{n}")).collect();
    for (n, name) in names.iter().enumerate() {
        let (thread, turn) = (format!("thread-{n}"), format!("turn-{n}"));
        let answer = format!("answer-{n}");
        let steps = [
            handshake_steps(&thread),
            turn_steps_for(&turn),
            vec![
                message_in(&thread, &turn, &answer, json!("final_answer")),
                completed_in(&thread, &turn, "completed", Value::Null),
            ],
        ]
        .concat();
        codex.register(name, steps, |_| {}).await.unwrap().keep();
    }
    let starts = names
        .iter()
        .enumerate()
        .map(|(n, name)| codex.start_with(name, codex.request(&format!("task-{n}"))));
    let runs: Vec<SubagentRun> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ids: HashSet<String> = runs.iter().map(|run| run.id().to_string()).collect();
    assert_eq!(ids.len(), 6, "every run has an id of its own");
    let results = futures::future::join_all(runs.iter().map(settle)).await;
    for (n, result) in results.into_iter().enumerate() {
        let answer = format!("answer-{n}");
        assert_eq!(
            result,
            outcome(StopReason::Completed, &[answer.as_str()], None)
        );
    }
    for run in &runs {
        dispose(run).await;
    }
    for (n, name) in names.iter().enumerate() {
        assert_eq!(
            sent(&codex.record_of(name), "turn/start")["params"],
            json!({"threadId": format!("thread-{n}"),
                   "input": [{"type": "text", "text": format!("task-{n}"), "text_elements": []}]}),
            "{name}"
        );
    }
}

// CODEX-30 (reference 48)
#[actix_rt::test]
async fn overlapping_runs_keep_their_own_modes_and_facts() {
    let codex = Codex::bare().await;
    let steps = published(vec![
        command_request(),
        await_reply("command"),
        failed(json!("other")),
    ]);
    codex
        .register("codex-safe", steps, |config| {
            config.permission_mode = CodexPermissionMode::Never;
        })
        .await
        .unwrap()
        .keep();
    let steps = published(vec![
        server_request(
            "mcp",
            ELICITATION,
            json!({"threadId": "thread-1", "turnId": null}),
        ),
        await_reply("mcp"),
        failed(json!("other")),
    ]);
    codex
        .register("codex-bypass", steps, |config| {
            config.permission_mode = CodexPermissionMode::DangerouslyBypassApprovalsAndSandbox;
        })
        .await
        .unwrap()
        .keep();
    let (safe, bypass) = tokio::join!(
        codex.start_with("codex-safe", codex.request("safe")),
        codex.start_with("codex-bypass", codex.request("bypass")),
    );
    let (safe, bypass) = (safe.unwrap(), bypass.unwrap());
    let (safe_result, bypass_result) = tokio::join!(settle(&safe), settle(&bypass));
    let line = failure("turn", "other");
    assert_eq!(
        safe_result,
        errored(
            &[],
            format!(
                "{line}\n{}",
                fact("never", "command approval", "cancelled", NO_APPROVAL)
            )
        )
    );
    assert_eq!(
        bypass_result,
        errored(
            &[],
            format!(
                "{line}\n{}",
                fact(BYPASS, "MCP elicitation", "declined", NO_MCP_INPUT)
            )
        )
    );
    dispose(&safe).await;
    dispose(&bypass).await;
}

// CODEX-31 (reference 4)
#[actix_rt::test]
async fn a_removed_instance_keeps_its_published_run() {
    let codex = Codex::bare().await;
    let safe = codex
        .register(
            "codex-safe",
            published([sync_steps(), vec![hang()]].concat()),
            |config| {
                config.permission_mode = CodexPermissionMode::Never;
                config.dispose_grace_ms = 11.0;
            },
        )
        .await
        .unwrap();
    codex
        .register(
            "codex-bypass",
            published(vec![final_answer("bypass answer"), turn_completed()]),
            |config| {
                config.permission_mode = CodexPermissionMode::DangerouslyBypassApprovalsAndSandbox;
                config.dispose_grace_ms = 29.0;
            },
        )
        .await
        .unwrap()
        .keep();
    let cancel = CancellationToken::new();
    let safe_request = codex.request("safe").cancel(cancel.clone());
    let safe_run = codex.start_with("codex-safe", safe_request).await.unwrap();
    codex.synced("codex-safe").await;
    safe.remove();
    let refused = codex
        .start_with("codex-safe", codex.request("again"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::NoProvider);
    let bypass_run = codex
        .start_with("codex-bypass", codex.request("bypass"))
        .await
        .unwrap();
    assert_eq!(
        settle(&bypass_run).await,
        outcome(StopReason::Completed, &["bypass answer"], None)
    );
    cancel.cancel();
    assert_eq!(
        settle(&safe_run).await,
        outcome(StopReason::Aborted, &[], None),
        "the removed instance's run survived until its cancellation"
    );
    dispose(&safe_run).await;
    dispose(&bypass_run).await;
    let cwd = codex.dir.path().to_str().unwrap();
    assert_eq!(
        sent(&codex.record_of("codex-safe"), "thread/start")["params"],
        json!({"cwd": cwd, "ephemeral": true, "approvalPolicy": "never"})
    );
    assert_eq!(
        sent(&codex.record_of("codex-bypass"), "thread/start")["params"],
        json!({"cwd": cwd, "ephemeral": true, "approvalPolicy": "never",
               "sandbox": "danger-full-access"})
    );
}

// CODEX-32 (reference 5)
#[actix_rt::test]
async fn a_duplicate_provider_name_is_refused() {
    let codex = Codex::new(published(vec![
        final_answer("first instance"),
        turn_completed(),
    ]))
    .await;
    let second = CodexProvider::new(CodexProviderConfig::new("/nonexistent/codex")).unwrap();
    let Err(error) = codex.rt.subagents().register_provider(second).await else {
        panic!("a second `codex` was registered");
    };
    assert_eq!(error.code(), ErrorCode::DuplicateProvider);
    assert_eq!(
        run_once(&codex, "go").await,
        outcome(StopReason::Completed, &["first instance"], None),
        "the first instance is kept"
    );
}

// CODEX-33 (reference 45, 49)
#[actix_rt::test]
async fn a_pre_aborted_start_spawns_nothing() {
    let codex = Codex::detecting().await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let error = start_error(&codex, codex.request("go").cancel(cancel)).await;
    assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
    assert_eq!(
        error.message(),
        "subagent-codex: request was aborted before app-server startup"
    );
    assert!(!codex.spawned(), "no process was started");
}

// CODEX-34 (reference 9)
#[actix_rt::test]
async fn a_parent_without_a_cwd_is_refused() {
    let codex = Codex::detecting().await;
    let homeless = codex.rt.agents().create(CreateAgent::new()).await.unwrap();
    let request = SubagentStartRequest::new(homeless.agent(), text("go"));
    let error = start_error(&codex, request).await;
    assert_eq!(error.code(), ErrorCode::InvalidConfig);
    assert_eq!(
        error.message(),
        "subagent-codex: no working directory for the child — delegate from a parent session \
         that has one"
    );
    assert!(!codex.spawned(), "no process was started");
}

// CODEX-35 (reference 49)
#[actix_rt::test]
async fn an_unusable_parent_cwd_fails_at_initialize_without_the_path() {
    let codex = Codex::detecting().await;
    let missing = codex.dir.path().join("SECRET_TOKEN-missing");
    let stray = codex
        .rt
        .agents()
        .create(CreateAgent::new().cwd(&missing))
        .await
        .unwrap();
    let request = SubagentStartRequest::new(stray.agent(), text("go"));
    let error = start_error(&codex, request).await;
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        format!("subagent-codex: {}", failure("initialize", "unknown"))
    );
    let cause = std::error::Error::source(&error)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(
        cause.contains(&missing.display().to_string()),
        "the path stays in the cause: {cause:?}"
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    let request = SubagentStartRequest::new(stray.agent(), text("go")).cancel(cancel);
    let error = start_error(&codex, request).await;
    assert_eq!(
        error.message(),
        "subagent-codex: request was aborted before app-server startup"
    );
    assert!(!codex.spawned(), "no process was started");
}

// CODEX-36 (reference 2)
#[actix_rt::test]
async fn the_task_must_be_non_empty_text() {
    let only_text = "subagent-codex: the one-shot task must contain only text blocks";
    let not_empty = "subagent-codex: the one-shot task must not be empty";
    let reasoning = || ContentBlock::Reasoning {
        text: "think".to_owned(),
    };
    let codex = Codex::detecting().await;
    for (case, prompt, message) in [
        ("no block", vec![], only_text),
        ("a reasoning block", vec![reasoning()], only_text),
        (
            "text and reasoning",
            vec![ContentBlock::text("do"), reasoning()],
            only_text,
        ),
        ("blank text", vec![ContentBlock::text(" \n ")], not_empty),
        (
            "blank blocks",
            vec![ContentBlock::text(" "), ContentBlock::text("\n")],
            not_empty,
        ),
    ] {
        let request = SubagentStartRequest::new(codex.parent.agent(), prompt);
        let error = start_error(&codex, request).await;
        assert_eq!(error.code(), ErrorCode::InvalidArgs, "{case}");
        assert_eq!(error.message(), message, "{case}");
    }
    assert!(!codex.spawned(), "no process was started");

    // A blank block beside a non-blank one is sent as its own entry.
    let codex = Codex::new(published(vec![final_answer("answer"), turn_completed()])).await;
    let prompt = vec![ContentBlock::text("one"), ContentBlock::text(" \n ")];
    let run = codex
        .start_with(
            PROVIDER,
            SubagentStartRequest::new(codex.parent.agent(), prompt),
        )
        .await
        .unwrap();
    assert_eq!(settle(&run).await.stop_reason, StopReason::Completed);
    dispose(&run).await;
    assert_eq!(
        sent(&codex.record(), "turn/start")["params"]["input"],
        json!([
            {"type": "text", "text": "one", "text_elements": []},
            {"type": "text", "text": " \n ", "text_elements": []},
        ])
    );
}

// CODEX-37 (reference 3)
#[actix_rt::test]
async fn dispose_grace_must_be_positive_finite_and_bounded() {
    let refusal = |value: f64| {
        let mut config = CodexProviderConfig::new("codex");
        config.dispose_grace_ms = value;
        let Err(error) = CodexProvider::new(config) else {
            panic!("disposeGraceMs {value} was accepted");
        };
        assert_eq!(error.code(), ErrorCode::InvalidConfig, "{value}");
        error.message().to_owned()
    };
    for value in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            refusal(value),
            "subagent-codex: disposeGraceMs must be a positive finite number",
            "{value}"
        );
    }
    assert_eq!(
        refusal(2_147_483_648.0),
        "subagent-codex: disposeGraceMs must be no greater than 2147483647"
    );
    for value in [0.5, 2_147_483_647.0] {
        let mut config = CodexProviderConfig::new("codex");
        config.dispose_grace_ms = value;
        assert!(CodexProvider::new(config).is_ok(), "{value} is accepted");
    }
    for value in [0.0, f64::NAN, 2_147_483_648.0] {
        let mut config = CodexProviderConfig::new("codex");
        config.startup_timeout_ms = value;
        let Err(error) = CodexProvider::new(config) else {
            panic!("startupTimeoutMs {value} was accepted");
        };
        assert_eq!(
            error.message(),
            "subagent-codex: startupTimeoutMs must be a positive finite number no greater than \
             2147483647"
        );
    }
    let mut config = CodexProviderConfig::new("codex");
    config.provider_name = String::new();
    let Err(error) = CodexProvider::new(config) else {
        panic!("an empty provider name was accepted");
    };
    assert_eq!(error.code(), ErrorCode::InvalidConfig);
}

// CODEX-38 (reference 6, 3)
#[actix_rt::test]
async fn the_config_reads_the_reference_keys_and_refuses_others() {
    let config: CodexProviderConfig = serde_json::from_value(json!({
        "providerName": "codex-named",
        "command": "/opt/codex/bin/codex",
        "args": ["app-server", "--stdio", "--verbose"],
        "env": {"A": "1"},
        "permissionMode": "approve-for-me",
        "startupTimeoutMs": 15,
        "disposeGraceMs": 25,
    }))
    .unwrap();
    assert_eq!(config.startup_timeout_ms, 15.0);
    assert_eq!(config.provider_name, "codex-named");
    assert_eq!(config.command, "/opt/codex/bin/codex");
    assert_eq!(config.args, ["app-server", "--stdio", "--verbose"]);
    assert_eq!(
        config.env,
        BTreeMap::from([("A".to_owned(), "1".to_owned())])
    );
    assert_eq!(config.permission_mode, CodexPermissionMode::ApproveForMe);
    assert_eq!(config.dispose_grace_ms, 25.0);

    for (name, mode) in [
        ("untrusted", CodexPermissionMode::Untrusted),
        ("never", CodexPermissionMode::Never),
        ("approve-for-me", CodexPermissionMode::ApproveForMe),
        (
            BYPASS,
            CodexPermissionMode::DangerouslyBypassApprovalsAndSandbox,
        ),
    ] {
        let parsed: CodexProviderConfig =
            serde_json::from_value(json!({"permissionMode": name})).unwrap();
        assert_eq!(parsed.permission_mode, mode, "{name}");
    }
    for name in ["", "on-request", "future-mode"] {
        let parsed = serde_json::from_value::<CodexProviderConfig>(json!({"permissionMode": name}));
        assert!(parsed.is_err(), "{name:?} is no permission mode");
    }
    for key in ["cmd", "cwd"] {
        let parsed = serde_json::from_str::<CodexProviderConfig>(&format!(r#"{{"{key}": "x"}}"#));
        let Err(error) = parsed else {
            panic!("{key} was accepted");
        };
        assert!(
            error
                .to_string()
                .contains(&format!("unknown field `{key}`")),
            "{error}"
        );
    }

    let parsed: CodexProviderConfig = serde_json::from_value(json!({})).unwrap();
    for (how, config) in [
        ("{}", parsed),
        ("Default", CodexProviderConfig::default()),
        ("new(\"codex\")", CodexProviderConfig::new("codex")),
    ] {
        assert_eq!(config.provider_name, "codex", "{how}");
        assert_eq!(config.command, "codex", "{how}");
        assert_eq!(config.args, ["app-server", "--stdio"], "{how}");
        assert!(config.env.is_empty(), "{how}");
        assert_eq!(
            config.permission_mode,
            CodexPermissionMode::Untrusted,
            "{how}"
        );
        assert_eq!(config.dispose_grace_ms, 3000.0, "{how}");
    }
    assert_eq!(CodexProviderConfig::new("/bin/codex").command, "/bin/codex");
}

// CODEX-39 (reference 3)
#[actix_rt::test]
async fn the_provider_advertises_no_capabilities_so_the_service_refuses_them() {
    let provider = CodexProvider::new(CodexProviderConfig::default()).unwrap();
    assert_eq!(provider.name(), "codex");
    assert_eq!(
        provider.capabilities(),
        subagents::out_of_process::NO_START_CAPABILITIES
    );
    assert!(!provider.inherits_parent_context());
    let codex = Codex::detecting().await;
    let request = codex
        .request("go")
        .output_schema(json!({"type": "object", "properties": {}}));
    let error = start_error(&codex, request).await;
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    assert_eq!(
        error.message(),
        "subagent provider \"codex\" does not support the \"outputSchema\" capability"
    );
    assert!(!codex.spawned(), "refused before the provider was asked");
}

// A line longer than `maxFrameBytes` during the turn (issue #18) fails the run with its own
// category; the line is skipped as it arrives, never held whole.
#[actix_rt::test]
async fn a_line_longer_than_the_frame_limit_fails_the_turn() {
    let endless = send(json!({
        "jsonrpc": "2.0",
        "method": "item/agentMessage/delta",
        "params": {"delta": "x".repeat(200_000)}
    }));
    let codex = Codex::with(published(vec![endless]), |config| {
        config.max_frame_bytes = 64 << 10;
    })
    .await;
    let run = codex.start("go").await.unwrap();
    let result = within("the result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(failure("turn", "frame-too-long").as_str())
    );
    within("the disposal", run.dispose()).await.unwrap();
}
