//! `subagents replay`: a fake product executable (a `codex app-server`, a `claude` CLI) that
//! replays a recorded NDJSON wire from a fixture file, so the out-of-process providers (and a
//! host's own tests) can drive every protocol path without the real product.
//!
//! The fixture is JSON Lines, one step per line, run in order:
//!
//! | step | effect |
//! | --- | --- |
//! | `{"expect": "<method or type>"}` | read frames until one whose `method` (or `type`) is this; with `"reply"`, answer it: `{"result": …}` or `{"error": …}` under the frame's id |
//! | `{"send": <frame>}` | write the frame as one line |
//! | `{"send_raw": "<text>"}` | write the text as one line (malformed frames) |
//! | `{"await_reply": "<id>"}` | read frames until the response to our request `<id>` |
//! | `{"stderr": "<text>"}` | write the text to stderr |
//! | `{"exit": <code>}` | exit with that code |
//! | `{"hang": true}` | stop reading the script; stay alive until stdin closes (or forever with `"ignore_eof": true`) |
//! | `{"trap_sigterm": true}` | ignore SIGTERM from here on |
//!
//! Every frame read is appended to the file named by `SUBAGENTS_REPLAY_RECORD`, if set, so a
//! test can assert what the client sent. When the script ends, the fake waits for stdin to
//! close and exits 0.

use std::io::Write as _;
use std::path::PathBuf;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use subagents::{ErrorCode, SubagentError};

/// `subagents replay` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// The fixture: JSON Lines, one step per line.
    #[arg(long)]
    fixture: PathBuf,
    /// Ignored words, so the fake accepts a product's own arguments (`app-server --stdio`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

fn invalid(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidConfig, message)
}

/// Reads the fixture, then replays it against stdin and stdout.
pub(crate) async fn run(args: ReplayArgs) -> Result<(), SubagentError> {
    let text = std::fs::read_to_string(&args.fixture).map_err(|error| {
        invalid(format!(
            "cannot read the fixture {}",
            args.fixture.display()
        ))
        .with_source(error)
    })?;
    let steps = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(at, line)| {
            serde_json::from_str::<Value>(line)
                .map_err(|error| invalid(format!("fixture line {}: {error}", at + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let record = std::env::var_os("SUBAGENTS_REPLAY_RECORD").map(PathBuf::from);
    let mut wire = Wire {
        lines: BufReader::new(tokio::io::stdin()).lines(),
        out: tokio::io::stdout(),
        record,
    };
    for (at, step) in steps.iter().enumerate() {
        let fail = |what: &str| invalid(format!("fixture step {}: {what}", at + 1));
        if let Some(expected) = step.get("expect").and_then(Value::as_str) {
            let Some(frame) = wire.read_until(|frame| kind(frame) == Some(expected)).await else {
                return Ok(());
            };
            if let Some(reply) = step.get("reply") {
                let mut response = serde_json::json!({"jsonrpc": "2.0", "id": frame["id"]});
                for key in ["result", "error"] {
                    if let Some(value) = reply.get(key) {
                        response[key] = value.clone();
                    }
                }
                wire.write(&response.to_string()).await;
            }
        } else if let Some(frame) = step.get("send") {
            wire.write(&frame.to_string()).await;
        } else if let Some(raw) = step.get("send_raw").and_then(Value::as_str) {
            wire.write(raw).await;
        } else if let Some(id) = step.get("await_reply") {
            let answered = wire
                .read_until(|frame| frame.get("method").is_none() && frame.get("id") == Some(id))
                .await;
            if answered.is_none() {
                return Ok(());
            }
        } else if let Some(text) = step.get("stderr").and_then(Value::as_str) {
            let _ = writeln!(std::io::stderr(), "{text}");
        } else if let Some(code) = step.get("exit").and_then(Value::as_i64) {
            std::process::exit(i32::try_from(code).map_err(|_| fail("exit code out of range"))?);
        } else if step.get("trap_sigterm").and_then(Value::as_bool) == Some(true) {
            trap_sigterm()?;
        } else if step.get("hang").and_then(Value::as_bool) == Some(true) {
            if step.get("ignore_eof").and_then(Value::as_bool) == Some(true) {
                std::future::pending::<()>().await;
            }
            break;
        } else {
            return Err(fail(&format!("unknown step {step}")));
        }
    }
    // Hold until the client closes stdin, recording what it still sends.
    while wire.read_until(|_| false).await.is_some() {}
    Ok(())
}

/// A frame's method, or its `type` (the Claude CLI's stream-json).
fn kind(frame: &Value) -> Option<&str> {
    frame
        .get("method")
        .or_else(|| frame.get("type"))
        .and_then(Value::as_str)
}

fn trap_sigterm() -> Result<(), SubagentError> {
    let mut terms = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|error| invalid("cannot trap SIGTERM".to_owned()).with_source(error))?;
    tokio::spawn(async move { while terms.recv().await.is_some() {} });
    Ok(())
}

struct Wire {
    lines: tokio::io::Lines<BufReader<tokio::io::Stdin>>,
    out: tokio::io::Stdout,
    record: Option<PathBuf>,
}

impl Wire {
    /// Reads frames until `wanted` holds for one (returned), or stdin ends (`None`).
    async fn read_until(&mut self, wanted: impl Fn(&Value) -> bool) -> Option<Value> {
        loop {
            let line = self.lines.next_line().await.ok().flatten()?;
            if let Some(record) = &self.record {
                if let Ok(mut file) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(record)
                {
                    let _ = writeln!(file, "{line}");
                }
            }
            if let Ok(frame) = serde_json::from_str::<Value>(&line) {
                if wanted(&frame) {
                    return Some(frame);
                }
            }
        }
    }

    async fn write(&mut self, line: &str) {
        // A closed stdout means the client is gone; the script then ends at its next read.
        let _ = self.out.write_all(format!("{line}\n").as_bytes()).await;
        let _ = self.out.flush().await;
    }
}
