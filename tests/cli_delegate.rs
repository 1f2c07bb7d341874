//! `subagents delegate`: one delegation through an out-of-process provider from the command
//! line, its result (or error) as one JSON line, and a cancel that ends it.

use std::process::Output;

use serde_json::{json, Value};

use crate::support::alive;

const BINARY: &str = env!("CARGO_BIN_EXE_subagents");

/// Runs `subagents delegate` with `args` in a fresh directory; returns its output, its one
/// printed line as JSON, and the directory.
fn delegate(args: &[&str]) -> (Output, Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(BINARY)
        .arg("delegate")
        .arg("--cwd")
        .arg(dir.path())
        .args(
            args.iter()
                .map(|arg| arg.replace("{dir}", dir.path().to_str().unwrap())),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let printed = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("not one JSON line ({error}): {stdout:?}"));
    (output, printed, dir)
}

/// The SDK provider's configuration: `acp-agent` on a memory store, scripted by `script`.
fn sdk_config(script: Value) -> String {
    json!({"command": BINARY, "args": ["--store", "memory"], "env": script}).to_string()
}

#[test]
fn a_delegation_prints_the_childs_result_as_one_json_line() {
    let config = sdk_config(json!({"ACP_AGENT_TEXT": "the child's answer"}));
    let (output, printed, _dir) = delegate(&["--provider", "sdk", "--config", &config, "go"]);
    assert_eq!(output.status.code(), Some(0), "{printed}");
    assert_eq!(
        printed,
        json!({"result": {
            "output": [{"type": "text", "text": "the child's answer"}],
            "stopReason": "completed"
        }})
    );
}

#[test]
fn a_configuration_the_provider_does_not_take_is_a_typed_error_line_and_exit_code_1() {
    let (output, printed, _dir) = delegate(&[
        "--provider",
        "codex",
        "--config",
        r#"{"comand": "codex"}"#,
        "go",
    ]);
    assert_eq!(output.status.code(), Some(1), "{printed}");
    assert_eq!(
        printed["error"]["code"],
        json!("INVALID_CONFIG"),
        "{printed}"
    );
    let message = printed["error"]["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("--config is not a codex provider configuration: unknown field `comand`"),
        "{message}"
    );
}

#[test]
fn a_failed_start_is_an_error_line_with_its_code() {
    let config = sdk_config(json!({"ACP_AGENT_MISSING_SESSION_ID": "1"}));
    let (output, printed, _dir) = delegate(&["--provider", "sdk", "--config", &config, "go"]);
    assert_eq!(output.status.code(), Some(1), "{printed}");
    assert_eq!(
        printed,
        json!({"error": {
            "code": "CHILD_START_FAILED",
            "message": "ACP child published without a session id"
        }})
    );
}

// The cancel can land while the child starts (refused before publication) or mid-turn (the
// run settles `aborted`); either way the delegation ends and the agent is reaped.
#[test]
fn cancel_after_ends_a_hanging_child_and_reaps_it() {
    let config = sdk_config(json!({"ACP_AGENT_HANG": "1", "ACP_AGENT_PID_FILE": "{dir}/pid"}));
    let (output, printed, dir) = delegate(&[
        "--provider",
        "sdk",
        "--config",
        &config,
        "--cancel-after-ms",
        "200",
        "go",
    ]);
    match printed.get("result") {
        Some(result) => {
            assert_eq!(output.status.code(), Some(0), "{printed}");
            assert_eq!(result["stopReason"], json!("aborted"), "{printed}");
        }
        None => {
            assert_eq!(output.status.code(), Some(1), "{printed}");
            assert_eq!(
                printed["error"]["code"],
                json!("ABORTED_BEFORE_PUBLICATION"),
                "{printed}"
            );
        }
    }
    let pid_file = dir.path().join("pid");
    // Disposal awaited the agent's exit before the command returned.
    if pid_file.exists() {
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(pid), "the agent outlived its delegation");
    }
}
