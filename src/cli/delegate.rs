//! `subagents delegate`: one one-shot delegation through an out-of-process provider, from the
//! command line. A person tries a provider against their own product (a Codex app-server, the
//! Claude Code CLI, an ACP agent, another `subagents` process) without writing a host, and a
//! script (`scripts/interop.sh`) drives the real products through the same providers a host
//! registers.
//!
//! The provider's configuration is its JSON, in the same keys the library deserializes
//! (`{"command": "…", "env": {…}, "permissionMode": "…"}`). The parent is a root agent of an
//! in-memory runtime whose working directory is `--cwd`; it never runs a turn. One JSON line is
//! printed: `{"result": …}` with the child's result, or `{"error": {"code", "message"}}` when the
//! start or the run failed (exit code 1).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use subagents::testing::ScriptedModel;
use subagents::{
    AcpProvider, AcpProviderConfig, ClaudeCodeProvider, ClaudeCodeProviderConfig, CodexProvider,
    CodexProviderConfig, ContentBlock, CreateAgent, ErrorCode, MemoryStore, Runtime, SdkProvider,
    SdkProviderConfig, SubagentError, SubagentResult, SubagentStartRequest,
};

use super::super::Failure;

/// Which out-of-process provider runs the child.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ProviderKind {
    /// An Agent Client Protocol agent (`command` is required).
    Acp,
    /// Another `subagents` process serving `acp-agent`.
    Sdk,
    /// A Codex app-server.
    Codex,
    /// The Claude Code CLI.
    ClaudeCode,
}

/// `subagents delegate` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DelegateArgs {
    /// The provider that runs the child.
    #[arg(long, value_enum)]
    provider: ProviderKind,
    /// The provider's configuration as JSON, in the library's keys (`command`, `args`, `env`,
    /// `inheritEnv`, `permissionMode` or `permission`, `maxFrameBytes`, `disposeGraceMs`, …).
    #[arg(long, value_name = "JSON", default_value = "{}")]
    config: String,
    /// The parent's working directory, where the child runs (default: this directory).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Cancel the run this long after it started, as a parent aborting its delegation would.
    #[arg(long, value_name = "MS")]
    cancel_after_ms: Option<u64>,
    /// The task, as one text block.
    task: String,
}

/// Parses `config` as the configuration `T` of the provider named `kind`.
fn config<T: serde::de::DeserializeOwned>(kind: &str, config: &str) -> Result<T, SubagentError> {
    serde_json::from_str(config).map_err(|error| {
        SubagentError::new(
            ErrorCode::InvalidConfig,
            format!("--config is not a {kind} provider configuration: {error}"),
        )
    })
}

/// Registers the asked-for provider on `rt` and returns its registry name.
async fn register(rt: &Runtime, args: &DelegateArgs) -> Result<String, SubagentError> {
    let subagents = rt.subagents();
    let registration = match args.provider {
        ProviderKind::Acp => {
            let provider = AcpProvider::new(config::<AcpProviderConfig>("acp", &args.config)?)?;
            subagents.register_provider(provider).await?
        }
        ProviderKind::Sdk => {
            let provider = SdkProvider::new(config::<SdkProviderConfig>("sdk", &args.config)?)?;
            subagents.register_provider(provider).await?
        }
        ProviderKind::Codex => {
            let config = config::<CodexProviderConfig>("codex", &args.config)?;
            subagents
                .register_provider(CodexProvider::new(config)?)
                .await?
        }
        ProviderKind::ClaudeCode => {
            let config = config::<ClaudeCodeProviderConfig>("claude-code", &args.config)?;
            subagents
                .register_provider(ClaudeCodeProvider::new(config)?)
                .await?
        }
    };
    let name = registration.name().to_owned();
    registration.keep();
    Ok(name)
}

/// Runs the delegation and prints its one JSON line to `out`.
pub(crate) async fn run(args: DelegateArgs, out: &mut impl std::io::Write) -> Result<(), Failure> {
    let cwd = match &args.cwd {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().map_err(|error| {
            SubagentError::new(ErrorCode::InvalidArgs, "no current directory").with_source(error)
        })?,
    };
    // The parent never runs a turn: the scripted model is only there to complete the runtime.
    let rt = super::telemetry::instrumented(Runtime::builder())
        .store(MemoryStore::new())
        .model("scripted", ScriptedModel::new())
        .build()?;
    // The delegation's root span: the child continues its trace, in its own process too.
    let outcome = delegate(&rt, &args, cwd)
        .instrument(tracing::info_span!(
            target: "subagents::trace",
            "delegate",
            otel.name = "subagents delegate"
        ))
        .await;
    let shutdown = rt.shutdown().await;
    let line = match outcome {
        Ok(result) => json!({ "result": result }),
        Err(error) => error_json(&error),
    };
    writeln!(out, "{line}")?;
    shutdown?;
    match line.get("error") {
        Some(_) => Err(Failure::Delegation),
        None => Ok(()),
    }
}

fn error_json(error: &SubagentError) -> Value {
    json!({ "error": { "code": error.code().as_str(), "message": error.message() } })
}

/// Starts the child, cancels it when asked, and returns its result after disposing of it.
async fn delegate(
    rt: &Runtime,
    args: &DelegateArgs,
    cwd: PathBuf,
) -> Result<SubagentResult, SubagentError> {
    let provider = register(rt, args).await?;
    let parent = rt.agents().create(CreateAgent::new().cwd(cwd)).await?;
    let cancel = CancellationToken::new();
    let request =
        SubagentStartRequest::new(parent.agent(), vec![ContentBlock::text(args.task.clone())])
            .cancel(cancel.clone());
    // The timer runs from before the start, so a cancel can also land while the child starts.
    let timer = args.cancel_after_ms.map(|ms| {
        let cancel = cancel.clone();
        actix::spawn(async move {
            actix::clock::sleep(Duration::from_millis(ms)).await;
            cancel.cancel();
        })
    });
    let run = rt.subagents().start(&provider, request).await;
    let outcome = match run {
        Ok(run) => {
            let result = run.result().await;
            let disposed = run.dispose().await;
            result.and_then(|result| disposed.map(|()| result))
        }
        Err(error) => Err(error),
    };
    if let Some(timer) = timer {
        timer.abort();
    }
    outcome
}
