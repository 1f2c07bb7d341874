//! The ACP provider against `subagents acp-agent`, the reference ACP peer: the handshake, the
//! output and stop-reason mapping, permissions, cancellation, the dispose ladder, and that no
//! process outlives its run. The SDK provider rides on the same peer.

#[path = "provider_acp/fixture.rs"]
mod fixture;

use std::collections::BTreeMap;

use serde_json::json;
use subagents::content::text_of;
use subagents::{
    AcpPermission, AcpProvider, AcpProviderConfig, ContentBlock, CreateAgent, ErrorCode,
    SdkProvider, SdkProviderConfig, StopReason, SubagentProvider, SubagentRun,
};
use tokio_util::sync::CancellationToken;

use crate::support::{memory_runtime, text, within, Warnings};
use fixture::{alive, appears, gone, peer_config, pid_in, Acp, BINARY};

async fn settle(run: &SubagentRun) -> subagents::SubagentResult {
    within("the run's result", run.result()).await.unwrap()
}

async fn dispose(run: &SubagentRun) {
    within("the run's disposal", run.dispose()).await.unwrap();
}

/// Runs `prompt` to its result and disposes the run.
async fn run_once(acp: &Acp, prompt: &str) -> subagents::SubagentResult {
    let run = acp.start(prompt).await.unwrap();
    let result = settle(&run).await;
    dispose(&run).await;
    result
}

// ACP-01
#[actix_rt::test]
async fn a_run_streams_the_agents_answer_and_completes_on_end_turn() {
    let acp = Acp::peer(&[("ACP_AGENT_PID_FILE", "{dir}/pid")]).await;
    let run = acp.start("hello").await.unwrap();
    assert!(
        run.local_agent().is_none(),
        "an external child has no local agent"
    );
    let result = settle(&run).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.output, vec![ContentBlock::text("mock child answer")]);
    assert_eq!(result.structured, None);
    let pid = pid_in(&acp.file("pid"));
    dispose(&run).await;
    assert!(!alive(pid), "the agent process is gone after dispose");
}

// ACP-02
#[actix_rt::test]
async fn the_run_id_is_fresh_and_never_the_childs_protocol_session_id() {
    let fixed = "5f0c9a64-0000-4000-8000-00000000abcd";
    let acp = Acp::peer(&[("ACP_AGENT_SESSION_ID", fixed)]).await;
    let first = acp.start("one").await.unwrap();
    let second = acp.start("two").await.unwrap();
    assert_ne!(first.id().to_string(), fixed);
    assert_ne!(first.id(), second.id(), "two runs get two ids");
    for run in [&first, &second] {
        assert_eq!(settle(run).await.stop_reason, StopReason::Completed);
        dispose(run).await;
    }
}

// ACP-03
#[actix_rt::test]
async fn each_acp_stop_reason_maps_onto_the_harness_stop_reason() {
    for (stop, expected) in [
        ("max_tokens", StopReason::MaxTokens),
        ("refusal", StopReason::Refusal),
        ("cancelled", StopReason::Aborted),
        ("max_turn_requests", StopReason::Error),
    ] {
        let acp = Acp::peer(&[("ACP_AGENT_STOP", stop), ("ACP_AGENT_TEXT", "cut")]).await;
        let result = run_once(&acp, "go").await;
        assert_eq!(result.stop_reason, expected, "ACP stop reason {stop}");
        assert_eq!(
            text_of(&result.output),
            "cut",
            "the output is kept for {stop}"
        );
    }
}

// ACP-04
#[actix_rt::test]
async fn thought_chunks_are_consumed_and_ignored() {
    let acp = Acp::peer(&[("ACP_AGENT_THOUGHT", "1"), ("ACP_AGENT_TEXT", "answer")]).await;
    let result = run_once(&acp, "go").await;
    assert_eq!(result.output, vec![ContentBlock::text("answer")]);
}

// ACP-05
#[actix_rt::test]
async fn the_child_runs_in_the_parent_session_cwd_and_announces_it() {
    let acp = Acp::peer(&[("ACP_AGENT_ECHO_CWD", "1")]).await;
    let result = run_once(&acp, "where").await;
    let cwd = acp.dir.path().display().to_string();
    assert_eq!(text_of(&result.output), format!("{cwd}\n{cwd}"));
}

// ACP-05
#[actix_rt::test]
async fn a_configured_cwd_overrides_the_parent_cwd_for_the_process_and_the_session() {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut config = peer_config(&[("ACP_AGENT_ECHO_CWD", "1")]);
    config.cwd = Some(elsewhere.path().to_owned());
    let acp = Acp::new(config).await;
    let result = run_once(&acp, "where").await;
    let cwd = elsewhere.path().display().to_string();
    assert_eq!(text_of(&result.output), format!("{cwd}\n{cwd}"));
}

// ACP-06 (an allow-list, beyond the TypeScript runtime's deny-list: issue #18)
#[actix_rt::test]
async fn the_child_env_is_the_base_set_the_names_the_host_passes_and_its_overlay() {
    // The provider reads the ambient environment, so the test must set it. Nothing else in
    // this process reads these names, and std serializes its own environment access.
    std::env::set_var("ACP_TEST_AMBIENT_TOKEN", "leaked");
    std::env::set_var("ACP_TEST_PLAIN", "plain");
    std::env::set_var("ACP_TEST_DATABASE_URL", "postgres://u:pw@db/app");
    std::env::set_var(
        "ACP_AGENT_TEST_AMBIENT",
        "a hook the host did not configure",
    );
    let home = std::env::var("HOME").unwrap_or_else(|_| "<HOME unset>".to_owned());
    for (name, inherit, overlay, expected) in [
        // Nothing outside the base set is inherited, credential-like or not.
        (
            "ACP_TEST_AMBIENT_TOKEN",
            false,
            None,
            "<ACP_TEST_AMBIENT_TOKEN unset>",
        ),
        ("ACP_TEST_PLAIN", false, None, "<ACP_TEST_PLAIN unset>"),
        (
            "ACP_TEST_DATABASE_URL",
            false,
            None,
            "<ACP_TEST_DATABASE_URL unset>",
        ),
        // The peer's own scripting hooks reach it only when configured.
        (
            "ACP_AGENT_TEST_AMBIENT",
            false,
            None,
            "<ACP_AGENT_TEST_AMBIENT unset>",
        ),
        // A name the host passes on is inherited; a value it sets is laid on top.
        ("ACP_TEST_PLAIN", true, None, "plain"),
        ("ACP_TEST_API_KEY", false, Some("explicit"), "explicit"),
        ("HOME", false, None, home.as_str()),
    ] {
        let mut script = vec![("ACP_AGENT_ECHO_ENV", name)];
        if let Some(value) = overlay {
            script.push((name, value));
        }
        let mut config = peer_config(&script);
        if inherit {
            config.inherit_env = vec![name.to_owned()];
        }
        let acp = Acp::new(config).await;
        let result = run_once(&acp, "env").await;
        assert_eq!(text_of(&result.output), expected, "{name}");
    }
}

// ACP-07 ACP-08
#[actix_rt::test]
async fn permission_requests_are_answered_by_policy_without_a_human() {
    for (policy, offer_allow, expected) in [
        (AcpPermission::Allow, true, StopReason::Completed),
        (AcpPermission::Allow, false, StopReason::Aborted),
        (AcpPermission::Reject, true, StopReason::Aborted),
    ] {
        let mut script = vec![("ACP_AGENT_PERMISSION", "1")];
        if !offer_allow {
            script.push(("ACP_AGENT_NO_ALLOW", "1"));
        }
        let mut config = peer_config(&script);
        config.permission = policy;
        let acp = Acp::new(config).await;
        let result = run_once(&acp, "needs approval").await;
        assert_eq!(
            result.stop_reason, expected,
            "{policy:?} with an allow option offered: {offer_allow}"
        );
    }
}

// ACP-09
#[actix_rt::test]
async fn client_methods_the_provider_does_not_implement_are_method_not_found() {
    let acp = Acp::peer(&[("ACP_AGENT_ASK_FS", "1")]).await;
    let result = run_once(&acp, "read a file").await;
    assert_eq!(text_of(&result.output), "fs -32601");
}

// ACP-10 ACP-24
#[actix_rt::test]
async fn a_session_without_an_id_fails_the_start_after_reaping_the_child() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_MISSING_SESSION_ID", "1"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
        ("ACP_AGENT_GRANDCHILD_PID_FILE", "{dir}/grandchild"),
    ])
    .await;
    let error = acp.start("go").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(error.message(), "ACP child published without a session id");
    assert!(!alive(pid_in(&acp.file("pid"))));
    assert!(!alive(pid_in(&acp.file("grandchild"))));
}

// Issue #18: ACP says a client disconnects from an agent that answers a protocol version it
// does not speak; the refusal was labelled an invalid request before.
#[actix_rt::test]
async fn an_agent_speaking_another_protocol_version_fails_the_start_with_that_category() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("fixture.jsonl");
    let initialize = json!({
        "expect": "initialize",
        "reply": {"result": {"protocolVersion": 2, "agentCapabilities": {}}}
    });
    std::fs::write(&fixture, format!("{initialize}\n{{\"hang\": true}}\n")).unwrap();
    let mut config = peer_config(&[]);
    config.args = vec![
        "replay".to_owned(),
        "--fixture".to_owned(),
        fixture.display().to_string(),
    ];
    let acp = Acp::new(config).await;
    let error = acp.start("go").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        "subagent-acp: Product subagent failure (product: ACP agent; stage: initialize; \
         category: protocol-version-mismatch): this client speaks ACP protocol version 1"
    );
}

// ACP-11
#[actix_rt::test]
async fn a_start_cancelled_before_it_began_spawns_nothing() {
    let acp = Acp::peer(&[("ACP_AGENT_PID_FILE", "{dir}/pid")]).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let error = acp
        .rt
        .subagents()
        .start("acp", acp.request("go").cancel(cancel))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
    assert_eq!(
        error.message(),
        "subagent request was aborted before the ACP child started"
    );
    assert!(!acp.file("pid").exists(), "no process was started");
}

// ACP-12 ACP-24
#[actix_rt::test]
async fn cancelling_during_the_handshake_reaps_the_child_then_refuses_the_start() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_NEWSESSION_READY", "{dir}/ready"),
        ("ACP_AGENT_NEWSESSION_GO", "{dir}/never"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ])
    .await;
    let cancel = CancellationToken::new();
    let start = acp
        .rt
        .subagents()
        .start("acp", acp.request("go").cancel(cancel.clone()));
    let starting = tokio::spawn(start);
    appears(&acp.file("ready")).await;
    cancel.cancel();
    let error = within("the refused start", starting)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
    assert!(
        !alive(pid_in(&acp.file("pid"))),
        "reaped before the start failed"
    );
}

// ACP-23: an agent that never finishes its handshake (here it never answers `session/new`)
// fails the start once `startupTimeoutMs` passed, reaped first, instead of holding its caller
// for as long as it stays silent.
#[actix_rt::test]
async fn an_agent_that_never_opens_its_session_fails_the_start_at_the_startup_deadline() {
    let mut config = peer_config(&[
        ("ACP_AGENT_NEWSESSION_GO", "{dir}/never"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ]);
    config.startup_timeout_ms = 300.0;
    config.dispose_eof_grace_ms = 100.0;
    let acp = Acp::new(config).await;
    let error = acp.start("go").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(
        error.message(),
        "subagent-acp: Product subagent failure (product: ACP agent; stage: startup; category: \
         timeout); no answer to the handshake within 300 ms"
    );
    assert!(
        !alive(pid_in(&acp.file("pid"))),
        "reaped before the start failed"
    );
}

// ACP-13
#[actix_rt::test]
async fn an_unusable_cwd_is_refused_before_anything_starts() {
    let rt = memory_runtime(&subagents::testing::ScriptedModel::new());
    let sentinel = tempfile::tempdir().unwrap();
    let touched = sentinel.path().join("touched");
    let mut config = AcpProviderConfig::new("touch");
    config.args = vec![touched.display().to_string()];
    rt.subagents()
        .register_provider(AcpProvider::new(config).unwrap())
        .await
        .unwrap()
        .keep();
    // A parent without a cwd, and no override: nowhere to run the child.
    let parent = rt.agents().create(CreateAgent::new()).await.unwrap();
    let error = rt
        .subagents()
        .start(
            "acp",
            subagents::SubagentStartRequest::new(parent.agent(), text("go")),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidConfig);
    assert_eq!(
        error.message(),
        "subagent-acp: no working directory for the child — configure `cwd` or delegate from a \
         parent session that has one"
    );
    assert!(!touched.exists(), "the command never ran");
}

// ACP-14
#[actix_rt::test]
async fn cancelling_settles_aborted_at_once_with_the_partial_output() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_HANG", "1"),
        ("ACP_AGENT_TEXT", "half an answer"),
        ("ACP_AGENT_READY_FILE", "{dir}/ready"),
        ("ACP_AGENT_CANCEL_FILE", "{dir}/cancelled"),
    ])
    .await;
    let cancel = CancellationToken::new();
    let run = within(
        "the start",
        acp.rt
            .subagents()
            .start("acp", acp.request("go").cancel(cancel.clone())),
    )
    .await
    .unwrap();
    appears(&acp.file("ready")).await;
    cancel.cancel();
    let result = settle(&run).await;
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.output, vec![ContentBlock::text("half an answer")]);
    appears(&acp.file("cancelled")).await;
    dispose(&run).await;
}

// ACP-12 ACP-24
#[actix_rt::test]
async fn a_dropped_start_reaps_its_half_started_child() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_NEWSESSION_READY", "{dir}/ready"),
        ("ACP_AGENT_NEWSESSION_GO", "{dir}/never"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ])
    .await;
    let starting = tokio::spawn(acp.rt.subagents().start("acp", acp.request("go")));
    appears(&acp.file("ready")).await;
    starting.abort();
    let pid = pid_in(&acp.file("pid"));
    gone(pid).await;
}

// ACP-14
#[actix_rt::test]
async fn disposing_a_running_prompt_sends_session_cancel_before_closing_stdin() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_HANG", "1"),
        ("ACP_AGENT_READY_FILE", "{dir}/ready"),
        ("ACP_AGENT_CANCEL_FILE", "{dir}/cancelled"),
    ])
    .await;
    let run = acp.start("go").await.unwrap();
    appears(&acp.file("ready")).await;
    dispose(&run).await;
    assert!(
        acp.file("cancelled").exists(),
        "the child heard session/cancel"
    );
    assert_eq!(settle(&run).await.stop_reason, StopReason::Aborted);
}

// ACP-15 ACP-16 ACP-24
#[actix_rt::test]
async fn a_child_that_ignores_or_crashes_on_cancel_still_ends_aborted_and_is_reaped() {
    for misbehaviour in ["ACP_AGENT_IGNORE_CANCEL", "ACP_AGENT_CRASH_ON_CANCEL"] {
        let mut config = peer_config(&[
            ("ACP_AGENT_HANG", "1"),
            (misbehaviour, "1"),
            ("ACP_AGENT_READY_FILE", "{dir}/ready"),
            ("ACP_AGENT_CANCEL_FILE", "{dir}/cancelled"),
            ("ACP_AGENT_PID_FILE", "{dir}/pid"),
        ]);
        // An ignored cancel leaves a child that also ignores EOF for as long as its prompt
        // hangs; a short EOF grace keeps the ladder quick.
        config.dispose_eof_grace_ms = 200.0;
        let acp = Acp::new(config).await;
        let run = acp.start("go").await.unwrap();
        appears(&acp.file("ready")).await;
        within("the disposal", run.dispose()).await.unwrap();
        assert_eq!(
            settle(&run).await.stop_reason,
            StopReason::Aborted,
            "{misbehaviour}"
        );
        assert!(!alive(pid_in(&acp.file("pid"))), "{misbehaviour}: reaped");
        assert!(
            acp.file("cancelled").exists(),
            "{misbehaviour}: the cancel was sent"
        );
    }
}

// ACP-17 ACP-24
#[actix_rt::test]
async fn a_child_that_exits_mid_prompt_fails_the_run() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_CRASH_ON_PROMPT", "1"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ])
    .await;
    let run = acp.start("go").await.unwrap();
    let result = settle(&run).await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.output, Vec::<ContentBlock>::new());
    dispose(&run).await;
    assert!(!alive(pid_in(&acp.file("pid"))));
}

// ACP-18
#[actix_rt::test]
async fn dispose_gives_a_child_that_flushes_on_eof_its_grace() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_FLUSH_ON_EOF", "{dir}/flushed"),
        ("ACP_AGENT_FLUSH_DELAY_MS", "100"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ])
    .await;
    let run = acp.start("go").await.unwrap();
    assert_eq!(settle(&run).await.stop_reason, StopReason::Completed);
    dispose(&run).await;
    assert_eq!(
        std::fs::read_to_string(acp.file("flushed")).unwrap(),
        "flushed"
    );
    assert!(!alive(pid_in(&acp.file("pid"))));
}

// ACP-19
#[actix_rt::test]
async fn dispose_sends_sigterm_to_a_child_that_outlives_eof() {
    let mut config = peer_config(&[
        ("ACP_AGENT_IGNORE_EOF", "1"),
        ("ACP_AGENT_SIGTERM_FILE", "{dir}/sigterm"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ]);
    config.dispose_eof_grace_ms = 100.0;
    let acp = Acp::new(config).await;
    let run = acp.start("go").await.unwrap();
    settle(&run).await;
    dispose(&run).await;
    assert_eq!(
        std::fs::read_to_string(acp.file("sigterm")).unwrap(),
        "sigterm"
    );
    assert!(!alive(pid_in(&acp.file("pid"))));
}

// ACP-20 ACP-24
#[actix_rt::test]
async fn dispose_kills_a_child_that_traps_sigterm_and_its_grandchild() {
    let mut config = peer_config(&[
        ("ACP_AGENT_IGNORE_EOF", "1"),
        ("ACP_AGENT_TRAP_SIGTERM", "1"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
        ("ACP_AGENT_GRANDCHILD_PID_FILE", "{dir}/grandchild"),
    ]);
    config.dispose_eof_grace_ms = 100.0;
    config.dispose_grace_ms = 100.0;
    let acp = Acp::new(config).await;
    let run = acp.start("go").await.unwrap();
    settle(&run).await;
    let (pid, grandchild) = (pid_in(&acp.file("pid")), pid_in(&acp.file("grandchild")));
    assert!(
        alive(grandchild),
        "the grandchild runs until the run is disposed"
    );
    dispose(&run).await;
    assert!(!alive(pid), "SIGKILL ended the agent");
    assert!(!alive(grandchild), "the tree kill reached the grandchild");
}

// ACP-24
#[actix_rt::test]
async fn a_dropped_run_still_releases_its_child() {
    let acp = Acp::peer(&[
        ("ACP_AGENT_HANG", "1"),
        ("ACP_AGENT_READY_FILE", "{dir}/ready"),
        ("ACP_AGENT_PID_FILE", "{dir}/pid"),
    ])
    .await;
    let run = acp.start("go").await.unwrap();
    appears(&acp.file("ready")).await;
    let pid = pid_in(&acp.file("pid"));
    drop(run);
    gone(pid).await;
}

// ACP-21
#[actix_rt::test]
async fn graces_must_be_positive_finite_and_bounded() {
    for (field, value) in [
        ("disposeEofGraceMs", 0.0),
        ("disposeGraceMs", -1.0),
        ("disposeGraceMs", f64::NAN),
        ("disposeEofGraceMs", f64::INFINITY),
        ("disposeGraceMs", 2_147_483_648.0),
        ("startupTimeoutMs", 0.0),
        ("startupTimeoutMs", f64::INFINITY),
    ] {
        let mut config = AcpProviderConfig::new("agent");
        match field {
            "disposeEofGraceMs" => config.dispose_eof_grace_ms = value,
            "startupTimeoutMs" => config.startup_timeout_ms = value,
            _ => config.dispose_grace_ms = value,
        }
        let error = AcpProvider::new(config).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidConfig);
        assert_eq!(
            error.message(),
            format!(
                "subagent-acp: {field} must be a positive finite number no greater than 2147483647"
            )
        );
    }
    let mut config = AcpProviderConfig::new("agent");
    config.dispose_grace_ms = 2_147_483_647.0;
    assert!(
        AcpProvider::new(config).is_ok(),
        "the bound itself is accepted"
    );
}

// ACP-21
#[actix_rt::test]
async fn the_config_reads_the_reference_keys_and_refuses_unknown_ones() {
    let config: AcpProviderConfig = serde_json::from_value(json!({
        "providerName": "editor",
        "command": "agent",
        "args": ["--stdio"],
        "permission": "allow",
        "env": {"A": "1"},
        "startupTimeoutMs": 5,
        "disposeEofGraceMs": 10,
        "disposeGraceMs": 20,
    }))
    .unwrap();
    assert_eq!(config.provider_name, "editor");
    assert_eq!(config.startup_timeout_ms, 5.0);
    assert_eq!(config.permission, AcpPermission::Allow);
    assert_eq!(
        config.env,
        BTreeMap::from([("A".to_owned(), "1".to_owned())])
    );
    let defaults: AcpProviderConfig = serde_json::from_value(json!({"command": "agent"})).unwrap();
    assert_eq!(defaults, AcpProviderConfig::new("agent"));
    assert_eq!(defaults.permission, AcpPermission::Reject);
    let unknown = serde_json::from_value::<AcpProviderConfig>(json!({"command": "a", "cmd": 1}));
    assert!(unknown
        .unwrap_err()
        .to_string()
        .contains("unknown field `cmd`"));
    let missing = serde_json::from_value::<AcpProviderConfig>(json!({}));
    assert!(missing
        .unwrap_err()
        .to_string()
        .contains("missing field `command`"));
}

// ACP-22
#[actix_rt::test]
async fn the_provider_advertises_no_capabilities_so_the_service_refuses_them() {
    let acp = Acp::peer(&[("ACP_AGENT_PID_FILE", "{dir}/pid")]).await;
    let provider = AcpProvider::new(AcpProviderConfig::new("agent")).unwrap();
    assert_eq!(
        provider.capabilities(),
        subagents::out_of_process::NO_START_CAPABILITIES
    );
    assert!(!provider.inherits_parent_context());
    let request = acp
        .request("go")
        .output_schema(json!({"type": "object", "properties": {}}));
    let error = acp.rt.subagents().start("acp", request).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    assert_eq!(
        error.message(),
        "subagent provider \"acp\" does not support the \"outputSchema\" capability"
    );
    assert!(
        !acp.file("pid").exists(),
        "refused before the provider was asked"
    );
}

// ACP-23
#[actix_rt::test]
async fn a_command_that_cannot_start_fails_the_start() {
    let mut config = peer_config(&[]);
    config.command = "/nonexistent/acp-agent".to_owned();
    let acp = Acp::new(config).await;
    let error = acp.start("go").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert_eq!(error.message(), "could not start /nonexistent/acp-agent");
}

// ACP-23
#[actix_rt::test]
async fn a_child_that_exits_before_the_handshake_fails_the_start_with_its_exit_code() {
    let mut config = peer_config(&[]);
    config.command = "sh".to_owned();
    config.args = vec!["-c".to_owned(), "exit 3".to_owned()];
    let acp = Acp::new(config).await;
    let error = acp.start("go").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    assert!(
        error.message().starts_with("subagent-acp: ")
            && error.message().ends_with("; exit code: 3"),
        "{}",
        error.message()
    );
}

// ACP-21
#[test]
fn acp_agent_refuses_model_flags_that_do_not_fit() {
    for (args, said) in [
        (
            &["--model", "openai"][..],
            "--model openai needs --base-url",
        ),
        (
            &["--base-url", "http://127.0.0.1:9"][..],
            "--base-url only applies with --model openai",
        ),
        (
            &["--request-timeout-ms", "500"][..],
            "--request-timeout-ms only applies with --model openai",
        ),
        (
            &["--max-retries", "0"][..],
            "--max-retries only applies with --model openai",
        ),
    ] {
        let output = std::process::Command::new(BINARY)
            .arg("acp-agent")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "stdout is the protocol channel");
    }
}

/// A memory runtime with the SDK provider `config` registered, and a root parent working in a
/// fresh directory (kept alive by the returned guard).
async fn with_sdk_provider(
    config: SdkProviderConfig,
) -> (
    subagents::Runtime,
    subagents::AgentHandle,
    tempfile::TempDir,
) {
    let rt = memory_runtime(&subagents::testing::ScriptedModel::new());
    let dir = tempfile::tempdir().unwrap();
    let parent = rt
        .agents()
        .create(CreateAgent::new().cwd(dir.path()))
        .await
        .unwrap();
    rt.subagents()
        .register_provider(SdkProvider::new(config).unwrap())
        .await
        .unwrap()
        .keep();
    (rt, parent, dir)
}

// SDK-02
#[actix_rt::test]
async fn an_sdk_child_that_dies_before_its_handshake_says_why() {
    let (rt, parent, _dir) = with_sdk_provider(SdkProviderConfig {
        command: BINARY.to_owned(),
        args: vec!["--no-such-flag".to_owned()],
        ..SdkProviderConfig::default()
    })
    .await;
    let error = rt
        .subagents()
        .start(
            "sdk",
            subagents::SubagentStartRequest::new(parent.agent(), text("go")),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ChildStartFailed);
    let message = error.message();
    assert!(message.starts_with("subagent-sdk: "), "{message}");
    assert!(message.contains("exit code: 2"), "{message}");
    assert!(
        message.contains("stderr: ") && message.contains("--no-such-flag"),
        "the child's last words: {message}"
    );
}

// SDK-01
#[actix_rt::test]
async fn the_sdk_provider_delegates_to_a_subagents_process() {
    let (rt, parent, _dir) = with_sdk_provider(SdkProviderConfig {
        command: BINARY.to_owned(),
        env: BTreeMap::from([(
            "ACP_AGENT_TEXT".to_owned(),
            "from the child runtime".to_owned(),
        )]),
        ..SdkProviderConfig::default()
    })
    .await;
    let run = rt
        .subagents()
        .start(
            "sdk",
            subagents::SubagentStartRequest::new(parent.agent(), text("go")),
        )
        .await
        .unwrap();
    let result = settle(&run).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(
        result.output,
        vec![ContentBlock::text("from the child runtime")]
    );
    dispose(&run).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let refused = rt
        .subagents()
        .start(
            "sdk",
            subagents::SubagentStartRequest::new(parent.agent(), text("go")).cancel(cancel),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "subagent request was aborted before the SDK child started"
    );
}

/// A bare JSON-RPC client of `subagents acp-agent`, speaking ndjson over its stdio.
struct RawAcpClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl RawAcpClient {
    fn spawn(args: &[&str]) -> Self {
        Self::spawn_scripted(args, &[])
    }

    /// The agent with its `ACP_AGENT_*` scripting hooks set to `script`.
    fn spawn_scripted(args: &[&str], script: &[(&str, &str)]) -> Self {
        let mut child = tokio::process::Command::new(BINARY)
            .args(["acp-agent", "--store", "memory"])
            .args(args)
            // Only this client's script: another test may have set an ACP_AGENT_* name here.
            .env_clear()
            .envs(
                std::env::vars_os()
                    .filter(|(name, _)| !name.to_string_lossy().starts_with("ACP_AGENT_")),
            )
            .envs(script.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        Self {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    /// Sends `method` with `params` and answers its response (`result` or `error`), skipping
    /// the notifications before it.
    async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.send(method, params).await;
        self.answer(method, id).await
    }

    /// Sends the request `method` with `params`; answers its id.
    async fn send(&mut self, method: &str, params: serde_json::Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.write(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// Sends the notification `method` with `params`.
    async fn notify(&mut self, method: &str, params: serde_json::Value) {
        self.write(json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    async fn write(&mut self, frame: serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
    }

    /// The next `session/update` notification about `session`, skipping what comes before it.
    async fn update_of(&mut self, session: &str) -> serde_json::Value {
        within("a session/update", async {
            loop {
                let line = self.stdout.next_line().await.unwrap().expect("an update");
                let message: serde_json::Value = serde_json::from_str(&line).unwrap();
                if message["method"] == "session/update"
                    && message["params"]["sessionId"] == session
                {
                    return message;
                }
            }
        })
        .await
    }

    /// The response to request `id` (`result` or `error`), skipping what comes before it.
    async fn answer(&mut self, method: &str, id: u64) -> serde_json::Value {
        within(method, async {
            loop {
                let line = self.stdout.next_line().await.unwrap().expect("an answer");
                let message: serde_json::Value = serde_json::from_str(&line).unwrap();
                if message["id"] == json!(id) {
                    return message;
                }
            }
        })
        .await
    }

    async fn new_session(&mut self, cwd: &std::path::Path) -> String {
        let answer = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        answer["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a session id: {answer}"))
            .to_owned()
    }

    async fn close(mut self) {
        drop(self.stdin);
        within("the agent's exit", self.child.wait()).await.unwrap();
    }
}

// A long-lived ACP client opens session after session: the agent advertises session/close,
// a closed session is gone (its agent disposed), and past --max-sessions the least recently
// used idle session is closed to make room.
#[actix_rt::test]
async fn the_acp_agent_closes_sessions_and_keeps_its_open_ones_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = RawAcpClient::spawn(&["--max-sessions", "3"]);
    let init = client
        .call("initialize", json!({"protocolVersion": 1}))
        .await;
    assert_eq!(
        init["result"]["agentCapabilities"]["sessionCapabilities"]["close"],
        json!({}),
        "{init}"
    );
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(client.new_session(dir.path()).await);
    }
    // Prompting the first makes the second the least recently used.
    let prompt = |id: &str| json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]});
    let answer = client.call("session/prompt", prompt(&ids[0])).await;
    assert!(answer["result"]["stopReason"].is_string(), "{answer}");
    let fourth = client.new_session(dir.path()).await;
    let evicted = client.call("session/prompt", prompt(&ids[1])).await;
    assert!(
        evicted["error"]["data"]
            .as_str()
            .is_some_and(|data| data.contains("unknown session")),
        "{evicted}"
    );
    for kept in [&ids[0], &ids[2], &fourth] {
        let answer = client.call("session/prompt", prompt(kept)).await;
        assert!(answer["result"]["stopReason"].is_string(), "{answer}");
    }
    let closed = client
        .call("session/close", json!({"sessionId": ids[2]}))
        .await;
    assert_eq!(closed["result"], json!({}), "{closed}");
    for (method, params) in [
        ("session/prompt", prompt(&ids[2])),
        ("session/close", json!({"sessionId": ids[2]})),
    ] {
        let gone = client.call(method, params).await;
        assert!(
            gone["error"]["data"]
                .as_str()
                .is_some_and(|data| data.contains("unknown session")),
            "{method}: {gone}"
        );
    }
    client.close().await;
}

// A client's mistakes are invalid params (-32602), said before anything is created: a relative
// cwd, a cwd that is not a directory, and a prompt with no text (this agent reads text only).
#[actix_rt::test]
async fn the_acp_agent_refuses_a_bad_cwd_and_a_textless_prompt_as_invalid_params() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = RawAcpClient::spawn(&[]);
    client
        .call("initialize", json!({"protocolVersion": 1}))
        .await;
    let missing = dir.path().join("missing");
    for cwd in [json!("relative/dir"), json!(missing)] {
        let refused = client
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        assert_eq!(refused["error"]["code"], json!(-32602), "{cwd}: {refused}");
    }
    let id = client.new_session(dir.path()).await;
    let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="});
    for prompt in [
        json!([]),
        json!([image]),
        json!([{"type": "text", "text": "  "}]),
    ] {
        let refused = client
            .call("session/prompt", json!({"sessionId": id, "prompt": prompt}))
            .await;
        assert_eq!(
            refused["error"]["code"],
            json!(-32602),
            "{prompt}: {refused}"
        );
    }
    let answered = client
        .call(
            "session/prompt",
            json!({"sessionId": id, "prompt": [image, {"type": "text", "text": "hi"}]}),
        )
        .await;
    assert_eq!(
        answered["result"]["stopReason"],
        json!("end_turn"),
        "{answered}"
    );
    client.close().await;
}

// A session/cancel that arrives while the prompt waits to start (here a scripted delay of a
// minute) ends it `cancelled` at once, as ACP requires; it answered `end_turn` after the wait.
#[actix_rt::test]
async fn the_acp_agent_answers_cancelled_to_a_prompt_cancelled_before_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = RawAcpClient::spawn_scripted(&[], &[("ACP_AGENT_DELAY_MS", "60000")]);
    client
        .call("initialize", json!({"protocolVersion": 1}))
        .await;
    let id = client.new_session(dir.path()).await;
    let prompt = client
        .send(
            "session/prompt",
            json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]}),
        )
        .await;
    client
        .notify("session/cancel", json!({"sessionId": id}))
        .await;
    let answer = client.answer("session/prompt", prompt).await;
    assert_eq!(
        answer["result"]["stopReason"],
        json!("cancelled"),
        "{answer}"
    );
    client.close().await;
}

// ACP failures in safe words (issue #18): a prompt the agent fails is the run's error with a
// diagnostic naming the stage, the category and the JSON-RPC code, not a start error; the
// agent's own text reaches neither the diagnostic nor the warning log. A stop reason that ends
// the run as an error says which.
#[actix_rt::test]
async fn an_acp_failure_is_a_diagnostic_in_safe_words_without_the_agents_text() {
    let warnings = Warnings::capture();
    let acp = Acp::peer(&[("ACP_AGENT_PROMPT_ERROR", "SECRET in /private/key.pem")]).await;
    let result = run_once(&acp, "go").await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(
            "Product subagent failure (product: ACP agent; stage: prompt; category: \
             internal-error; JSON-RPC code: -32603)"
        )
    );
    let logged = warnings.text();
    assert!(logged.contains("category: internal-error"), "{logged}");
    assert!(!logged.contains("SECRET"), "{logged}");
    let acp = Acp::peer(&[("ACP_AGENT_STOP", "max_turn_requests")]).await;
    let result = run_once(&acp, "go").await;
    assert_eq!(
        result.diagnostic.as_deref(),
        Some(
            "Product subagent failure (product: ACP agent; stage: prompt; category: \
             max-turn-requests)"
        )
    );
}

// Sessions' prompts run at once (issue #18): with one session's prompt held mid-turn, another
// session's prompt still starts and streams. (One prompt at a time ran process-wide: the second
// waited for the first to end.)
#[actix_rt::test]
async fn the_acp_agent_runs_the_prompts_of_different_sessions_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = RawAcpClient::spawn_scripted(&[], &[("ACP_AGENT_HANG", "1")]);
    client
        .call("initialize", json!({"protocolVersion": 1}))
        .await;
    let (first, second) = (
        client.new_session(dir.path()).await,
        client.new_session(dir.path()).await,
    );
    let prompt = |id: &str| json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]});
    client.send("session/prompt", prompt(&first)).await;
    client.update_of(&first).await;
    // The first prompt holds its turn; the second session's answer streams all the same.
    client.send("session/prompt", prompt(&second)).await;
    let update = client.update_of(&second).await;
    assert_eq!(
        update["params"]["update"]["sessionUpdate"],
        json!("agent_message_chunk"),
        "{update}"
    );
    client.close().await;
}

// An agent that prints an endless line (issue #18): the connection fails once the line passes
// `maxFrameBytes`, instead of the protocol's reader holding it, and the start says why.
#[actix_rt::test]
async fn an_agent_line_longer_than_the_frame_limit_fails_the_start() {
    let mut config = AcpProviderConfig::new("sh");
    config.args = vec![
        "-c".to_owned(),
        "head -c 10000000 /dev/zero | tr '\\0' x; sleep 60".to_owned(),
    ];
    config.max_frame_bytes = 64 << 10;
    config.dispose_eof_grace_ms = 500.0;
    config.dispose_grace_ms = 500.0;
    let acp = Acp::new(config).await;
    let refused = acp.start("go").await.err().unwrap();
    assert_eq!(refused.code(), ErrorCode::ChildStartFailed);
    assert!(
        refused.message().contains("category: frame-too-long"),
        "{refused}"
    );
}
