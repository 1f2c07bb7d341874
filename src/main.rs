//! The `subagents` command-line tool.
//!
//! Exit codes: 0 on success, 2 on any error (the cause chain is printed once to stderr).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use subagents::model::{OpenAiAdapter, OpenAiConfig};
use subagents::{
    AgentOptions, ContentBlock, CreateAgent, EventKind, FlushPolicy, Gate, MessageSource, Runtime,
    ScriptStep, ScriptedModel, SessionEvent, SledStore, SubagentError, Tool, ToolOutput,
};

/// Delegate work from an agent to child agents.
#[derive(Debug, Parser)]
#[command(name = "subagents", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a scripted agent that calls a tool, in a sled store, and print its session log.
    Demo(DemoArgs),
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// The sled store directory.
    #[arg(long, default_value = ".subagents")]
    store: PathBuf,
    /// Crash-recovery drill: after the tool step is durable, hold the model's final answer
    /// until the process is killed. Prints `stalled <session-id>` when it is safe to kill.
    #[arg(long)]
    stall: bool,
    /// Which model answers: the deterministic scripted model, or an OpenAI-compatible endpoint.
    #[arg(long, value_enum, default_value_t = ModelChoice::Scripted)]
    model: ModelChoice,
    /// The endpoint's base URL (with `--model openai`), e.g. `https://api.openai.com/v1`.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name to request (with `--model openai`).
    #[arg(long)]
    model_name: Option<String>,
    /// The environment variable holding the API key (with `--model openai`); omit it for
    /// endpoints without authentication (a local vLLM or Ollama).
    #[arg(long)]
    api_key_env: Option<String>,
}

/// Which model the demo runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModelChoice {
    /// The deterministic scripted model (no network).
    Scripted,
    /// An OpenAI-compatible chat-completions endpoint.
    Openai,
}

/// The demo's validated plan: what the command line asked for, before any actor starts.
struct DemoPlan {
    store: PathBuf,
    stall: bool,
    model: DemoModel,
}

/// The model half of the plan.
enum DemoModel {
    Scripted,
    OpenAi(OpenAiConfig),
}

impl DemoPlan {
    fn from_args(args: DemoArgs) -> Result<Self, SubagentError> {
        let model = match args.model {
            ModelChoice::Scripted => DemoModel::Scripted,
            ModelChoice::Openai => {
                let missing = |flag: &str| {
                    SubagentError::new(
                        subagents::ErrorCode::ModelUnavailable,
                        format!("--model openai needs {flag}"),
                    )
                };
                let base_url = args.base_url.ok_or_else(|| missing("--base-url"))?;
                let name = args.model_name.ok_or_else(|| missing("--model-name"))?;
                let mut config = OpenAiConfig::new(base_url, name);
                if let Some(variable) = args.api_key_env {
                    config = config.api_key_env(variable);
                }
                config.validate()?;
                DemoModel::OpenAi(config)
            }
        };
        if args.stall && !matches!(model, DemoModel::Scripted) {
            return Err(SubagentError::new(
                subagents::ErrorCode::ModelUnavailable,
                "--stall drills crash recovery with the scripted model only",
            ));
        }
        Ok(Self {
            store: args.store,
            stall: args.stall,
            model,
        })
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Demo(args) => {
            DemoPlan::from_args(args).and_then(|plan| actix::System::new().block_on(run_demo(plan)))
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::from(2)
        }
    }
}

fn word_count_tool() -> Tool {
    Tool::new(
        "word_count",
        "Counts the words of a text.",
        serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        }),
        |args, _ctx| async move {
            let text = args
                .get("text")
                .and_then(|t| t.as_str())
                .unwrap_or_default();
            let words = text.split_whitespace().count();
            Ok(ToolOutput::text(words.to_string()))
        },
    )
}

async fn run_demo(plan: DemoPlan) -> Result<(), SubagentError> {
    let question = "the quick brown fox jumps over the lazy dog";
    let gate = Gate::new();
    let answer = ScriptStep::text("The sentence has 9 words.");
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call(
            "call-1",
            "word_count",
            serde_json::json!({ "text": question }),
        ),
        if plan.stall {
            answer.gated(&gate)
        } else {
            answer
        },
    ]);
    let store = SledStore::open(&plan.store)?;
    let builder = Runtime::builder().store(store).tool(word_count_tool());
    let builder = match plan.model {
        DemoModel::Scripted => builder.model("scripted", model),
        DemoModel::OpenAi(config) => builder.model("openai", OpenAiAdapter::new(config)?),
    };
    let rt = builder.build()?;
    let cwd = std::env::current_dir().map_err(|e| {
        SubagentError::new(
            subagents::ErrorCode::StoreIo,
            format!("no working directory: {e}"),
        )
    })?;
    let options = AgentOptions {
        model: "scripted-demo".into(),
        flush: if plan.stall {
            FlushPolicy::EveryStep
        } else {
            FlushPolicy::OnRequest
        },
        ..AgentOptions::default()
    };
    let handle = rt
        .agents()
        .create(CreateAgent::new().cwd(cwd).options(options))
        .await?;
    let agent = handle.agent().clone();
    agent
        .followup(
            vec![ContentBlock::text(format!(
                "How many words are in \"{question}\"?"
            ))],
            MessageSource::User,
        )
        .await?;
    if plan.stall {
        gate.reached().await;
        println!("stalled {}", agent.id());
        // Hold the turn open until the process is killed.
        std::future::pending::<()>().await;
    }
    agent.when_idle().await;
    agent.log().flush().await?;
    println!("session {} in {}", agent.id(), plan.store.display());
    for event in agent.log().events() {
        println!("{}", describe(&event));
    }
    handle.dispose().await
}

fn describe(event: &SessionEvent) -> String {
    let detail = match &event.kind {
        EventKind::TurnStart { turn } => format!("turn {turn}"),
        EventKind::TurnEnd { turn, reason } => format!("turn {turn}: {reason:?}"),
        EventKind::StepStart { turn, step } | EventKind::StepEnd { turn, step } => {
            format!("turn {turn} step {step}")
        }
        EventKind::UserMessage(message) => format!("{:?}", message.text()),
        EventKind::AssistantChunk { chunk, .. } => format!("{chunk:?}"),
        EventKind::AssistantMessage { message, .. } => format!("{:?}", message.content),
        EventKind::ToolCall {
            name, arguments, ..
        } => format!("{name}({arguments})"),
        EventKind::ToolResult { message, .. } => format!("{:?}", message.content),
        EventKind::InboxSpliced {
            target,
            inserted,
            removed_count,
            ..
        } => {
            format!(
                "{target:?} +{} -{}",
                inserted.len(),
                removed_count.unwrap_or(0)
            )
        }
        EventKind::EndSeed {} => String::new(),
        EventKind::Extension { data, .. } => data.to_string(),
    };
    format!("{:>4}  {:<20} {detail}", event.seq, event.kind.type_name())
}
