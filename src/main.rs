//! The `subagents` command-line tool.
//!
//! Exit codes: 0 on success (and when standard output is closed early, as by `| head`); 2 on any
//! error, whose cause chain is printed once to stderr, for a person to read.

mod allocator;
mod cli;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use subagents::model::{OpenAiAdapter, StreamChunk};
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentOptions, ContentBlock, ContinuableStartSpec, CreateAgent, ErrorCode, EventKind,
    FlushPolicy, MessageSource, Runtime, SessionEvent, SpawnInProcess, SubagentError, Tool,
    ToolOutput, TurnEndReason,
};
use tracing::Instrument as _;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// The binary runs on mimalloc: under many concurrent children glibc's allocator spent a third of
/// a load run in `malloc`/`free` and fragmented the heap (`perf record` on `subagents load`).
#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

/// Delegate work from an agent to child agents.
#[derive(Debug, Parser)]
#[command(name = "subagents", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Export the runtime's spans (one trace per delegation tree) and metrics to this
    /// OpenTelemetry collector over OTLP/HTTP (`/v1/traces` and `/v1/metrics` are appended);
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` does the same, and `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`
    /// sends JSON instead of protobuf.
    #[arg(long, global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Record content on the exported spans: each model call's prompt and output, each tool
    /// call's arguments and result (off by default: they may hold what a trace backend should
    /// not keep).
    #[arg(long, global = true)]
    trace_content: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a load scenario: many concurrent children against a scripted model, with live
    /// progress, a report of throughput, latency and memory, and a verification that fails the
    /// command when it does not hold.
    Load(Box<cli::load::LoadArgs>),
    /// Run the narrated delegation tour on the scripted model: a parent delegates to a `spawn`
    /// and a `fork` child in parallel, starts a continuable child, sends it a follow-up, hears
    /// its report and settled notices, and lists its children; the forest stays in the store
    /// for `tree`. With `--model openai`, one agent calls a tool against the endpoint; the
    /// `--stall`, `--burst` and `--forest` drills are crash-recovery exercises.
    Demo(DemoArgs),
    /// Run the history checker: seeded random schedules over a forest of continuable children
    /// (starts, follow-ups, interrupts, reports, drains, parents disposed and resumed, store
    /// faults, reopens), each history checked for exactly-once delivery, FIFO, one Activation
    /// per child, one notice per epoch, no ghost, durable answers and nothing left live. A
    /// failing schedule is shrunk and printed with the command that replays it; exit code 1.
    Check(cli::check::CheckArgs),
    /// Print the durable forest of delegated children in a store (id, mode, activity, label,
    /// indented by depth), or JSON with `--json`.
    Tree(cli::tree::TreeArgs),
    /// Serve this runtime as an Agent Client Protocol agent over stdio: each session is a root
    /// agent on the scripted model, scripted further by `ACP_AGENT_*` variables. The reference
    /// peer of the ACP and SDK providers.
    AcpAgent(cli::acp_agent::AcpAgentArgs),
    /// Run a long-lived cluster node on PostgreSQL: it heartbeats its membership and serves
    /// its peers' deliveries for the children it holds until SIGTERM or SIGINT; with
    /// `--drive` it also grows a forest of continuable children across the cluster.
    Node(Box<cli::node::NodeArgs>),
    /// Delegate one task to a child through an out-of-process provider (`acp`, `sdk`, `codex`,
    /// `claude-code`) configured by its JSON, and print the child's result (or the error) as
    /// one JSON line: a provider tried against a real product without writing a host.
    Delegate(cli::delegate::DelegateArgs),
    /// A fake product executable (a Codex app-server, a Claude Code CLI) for tests: replays a
    /// recorded NDJSON wire from a fixture file.
    Replay(cli::replay::ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// The store: a sled directory, `memory` (nothing kept), or a `postgres://` URL.
    #[arg(long, default_value = cli::store::DEFAULT_STORE)]
    store: cli::store::StoreLocation,
    /// Crash-recovery drill: after the tool step is durable, hold the model's final answer
    /// until the process is killed. Prints `stalled <session-id>` when it is safe to kill.
    #[arg(long, conflicts_with_all = ["burst", "forest"])]
    stall: bool,
    /// Crash-recovery drill: grow a three-level forest of continuable children under one root
    /// (a child waiting on a grandchild waiting on a great-grandchild that is mid-turn, and a
    /// second child mid-turn), make it durable and hold until killed. Prints
    /// `forest <root> <child> <grandchild> <great-grandchild> <busy-child>` when it is safe
    /// to kill.
    #[arg(long, conflicts_with = "burst")]
    forest: bool,
    /// Crash-recovery drill: run this many turns back to back, each flushed at every step
    /// end, printing `flushed <session-id> <events>` after each acknowledged flush.
    #[arg(long, value_name = "TURNS")]
    burst: Option<u32>,
    /// With `--model openai`: ask this instead of the word-count question, with the delegation
    /// tools offered (`subagent`, `subagent_fork`, `subagent_continuable`, the control tools and
    /// `report`), so the model can delegate to children of its own.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["stall", "burst", "forest"])]
    prompt: Option<String>,
    /// How long a PostgreSQL lease lasts unrenewed, in milliseconds (default 30000): a
    /// drill's process that is paused longer loses its session to whoever takes it next.
    #[arg(long, value_name = "MS")]
    lease_ttl_ms: Option<u64>,
    /// Print the session log of a turn that failed too (a completed turn's is always printed).
    #[arg(long)]
    verbose: bool,
    /// The model (the scripted model records `--model-name`, default `scripted-demo`).
    #[command(flatten)]
    model: cli::model::ModelArgs,
}

/// The demo's validated plan: what the command line asked for, before any actor starts.
struct DemoPlan {
    store: cli::store::StoreLocation,
    /// A prompt of the user's own, for a real model (with the delegation tools).
    prompt: Option<String>,
    lease_ttl: Option<std::time::Duration>,
    drill: Drill,
    model: DemoModel,
    model_name: String,
    /// Print a failed turn's session log too.
    verbose: bool,
}

/// A crash-recovery drill, or none.
#[derive(Debug, Clone, Copy)]
enum Drill {
    None,
    Stall,
    Burst(u32),
    Forest,
}

use cli::model::{usage, ModelPlan as DemoModel};

impl DemoPlan {
    fn from_args(args: DemoArgs) -> Result<Self, SubagentError> {
        let drill = match (args.stall, args.burst, args.forest) {
            (true, _, _) => Drill::Stall,
            (false, _, true) => Drill::Forest,
            (false, Some(0), false) => return Err(usage("--burst needs at least one turn")),
            (false, Some(turns), false) => Drill::Burst(turns),
            (false, None, false) => Drill::None,
        };
        let model = args.model.plan()?;
        if matches!(model, DemoModel::OpenAi(_)) && !matches!(drill, Drill::None) {
            return Err(usage(
                "--stall, --burst and --forest drill crash recovery with the scripted model only",
            ));
        }
        if args.prompt.is_some() && matches!(model, DemoModel::Scripted) {
            return Err(usage(
                "--prompt needs --model openai: the scripted model answers the tour's own script",
            ));
        }
        Ok(Self {
            store: args.store,
            prompt: args.prompt,
            lease_ttl: match args.lease_ttl_ms {
                Some(0) => return Err(usage("--lease-ttl-ms must be at least 1")),
                ms => ms.map(std::time::Duration::from_millis),
            },
            drill,
            model,
            model_name: args
                .model
                .model_name
                .unwrap_or_else(|| "scripted-demo".into()),
            verbose: args.verbose,
        })
    }
}

/// Why the CLI stops early.
enum Failure {
    /// Standard output was closed (`| head`): not an error.
    ClosedOutput,
    /// Standard output could not be written (a full disk, say): exit code 2.
    Output(std::io::Error),
    /// Anything else: printed for a person, exit code 2.
    Error(SubagentError),
    /// `load --plot` could not write its picture (the report was printed whole): exit code 2.
    Plot(String),
    /// A load run that did not verify: its report says which check failed; exit code 1.
    Unverified,
    /// A load run stopped by Ctrl-C: its partial report was printed; exit code 130.
    Interrupted,
    /// The history checker found anomalies: its output names them; exit code 1.
    Anomalies,
    /// A delegation that failed to start or to run: its JSON line says why; exit code 1.
    Delegation,
}

impl From<SubagentError> for Failure {
    fn from(error: SubagentError) -> Self {
        Self::Error(error)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            Self::ClosedOutput
        } else {
            Self::Output(error)
        }
    }
}

/// Turns transparent huge pages off for this process. mimalloc asks the kernel for huge pages
/// on its arenas, and the way a runtime of many small agents allocates and returns memory made
/// the kernel zero 2 MiB pages again and again: page zeroing was a fifth of a 100,000-child
/// drain's samples, and `load --roots 1 --children 20000` took 0.91× the wall time and a third of
/// the system time with them off (sled 0.92×; whole processes timed in alternated pairs
/// against `MIMALLOC_ALLOW_THP=0`). Best effort: a kernel without the setting changes nothing.
fn without_transparent_huge_pages() {
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// What the command's log shows without `RUST_LOG` (see `main`).
const DEFAULT_LOG: &str = "error,subagents::model::openai=warn,opentelemetry_sdk=warn";

/// The command's log on stderr, showing what `filter` enables, less the SDK's once-a-batch
/// export error: a failed span export is told once and counted at exit (`cli::span_loss`).
///
/// The layer's level hint stays `filter`'s: the subscriber bridges the `log` facade at the
/// most verbose hint of its layers, and a filter with none counts as `TRACE`, so every
/// `log::trace!` on sled's write and flush paths would reach the layers only to be refused.
fn log_layer<S>(filter: tracing_subscriber::EnvFilter) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let once_a_batch = tracing_subscriber::filter::filter_fn(|metadata| {
        !(metadata.target() == "opentelemetry_sdk"
            && metadata.name() == "BatchSpanProcessor.ExportError")
    })
    // It removes one event of its own and hints nothing: `filter`'s hint is the layer's.
    .with_max_level_hint(tracing::level_filters::LevelFilter::TRACE);
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        // A closed stderr (`2>&1 | head`) must not turn every later log line into a panic.
        .log_internal_errors(false)
        .with_filter(filter.and(once_a_batch))
}

fn main() -> ExitCode {
    without_transparent_huge_pages();
    let cli = Cli::parse();
    // Without RUST_LOG: errors only, a model call's retries and the waits before them (a
    // person watching a command against a real endpoint would otherwise see a hang), and the
    // OpenTelemetry SDK's warnings (spans dropped from a full export queue, with their count);
    // the history checker logs nothing, since it injects store faults on purpose.
    let filter = match (&cli.command, std::env::var_os("RUST_LOG")) {
        (Command::Check(_), None) => tracing_subscriber::EnvFilter::new("off"),
        (_, None) => tracing_subscriber::EnvFilter::new(DEFAULT_LOG),
        (_, Some(_)) => tracing_subscriber::EnvFilter::from_default_env(),
    };
    cli::telemetry::trace_content(cli.trace_content);
    let prometheus = matches!(&cli.command, Command::Node(node) if node.metrics_addr.is_some());
    let volume = match &cli.command {
        Command::Load(_) | Command::Node(_) => cli::telemetry::SpanVolume::Heavy,
        _ => cli::telemetry::SpanVolume::Light,
    };
    let telemetry =
        match cli::telemetry::Telemetry::start(cli.otlp_endpoint.as_deref(), prometheus, volume) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                report(&error);
                return ExitCode::from(2);
            }
        };
    tracing_subscriber::registry()
        .with(log_layer(filter))
        .with(
            telemetry
                .as_ref()
                .and_then(cli::telemetry::Telemetry::layer),
        )
        .init();
    let outcome = match cli.command {
        Command::Demo(args) => DemoPlan::from_args(args)
            .map_err(Failure::from)
            .and_then(|plan| actix::System::new().block_on(run_demo(plan))),
        Command::Load(args) => buffered(|out| {
            actix::System::new().block_on(async move { cli::load::run(*args, out).await })
        }),
        Command::Check(args) => buffered(|out| {
            actix::System::new().block_on(async move { cli::check::run(args, out).await })
        }),
        Command::Tree(args) => buffered(|out| {
            actix::System::new().block_on(async move { cli::tree::run(args, out).await })
        }),
        Command::AcpAgent(args) => actix::System::new()
            .block_on(cli::acp_agent::run(args))
            .map_err(Failure::from),
        Command::Node(args) => actix::System::new().block_on(cli::node::run(*args)),
        Command::Delegate(args) => buffered(|out| {
            actix::System::new().block_on(async move { cli::delegate::run(args, out).await })
        }),
        Command::Replay(args) => actix::System::new()
            .block_on(cli::replay::run(args))
            .map_err(Failure::from),
    };
    match outcome {
        Ok(()) | Err(Failure::ClosedOutput) => ExitCode::SUCCESS,
        Err(Failure::Unverified) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: the load run did not verify (see the report)"
            );
            ExitCode::from(1)
        }
        Err(Failure::Interrupted) => {
            let _ = writeln!(
                std::io::stderr(),
                "the load run was interrupted (the report is of what it grew)"
            );
            ExitCode::from(130)
        }
        Err(Failure::Anomalies) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: the history checker found anomalies (see the output)"
            );
            ExitCode::from(1)
        }
        Err(Failure::Delegation) => ExitCode::from(1),
        Err(Failure::Output(error)) => {
            let _ = writeln!(std::io::stderr(), "error: writing the output: {error}");
            ExitCode::from(2)
        }
        Err(Failure::Plot(why)) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: the plot was not drawn ({why}); the report above is whole"
            );
            ExitCode::from(2)
        }
        Err(Failure::Error(error)) => {
            report(&error);
            ExitCode::from(2)
        }
    }
}

/// Runs a command that writes its output to a buffer, then prints the buffer (also when the
/// command failed after writing): standard output is not locked while the command awaits.
fn buffered(run: impl FnOnce(&mut Vec<u8>) -> Result<(), Failure>) -> Result<(), Failure> {
    let mut out = Vec::new();
    let outcome = run(&mut out);
    std::io::stdout().lock().write_all(&out)?;
    outcome
}

/// Prints `error` and its cause chain once, for a person.
fn report(error: &SubagentError) {
    let mut stderr = std::io::stderr().lock();
    // Nothing is left to tell if stderr itself is closed.
    // Once: the message, and the root of its causes (the layers between repeat each other:
    // "error connecting to server", "error connecting to server: Connection refused").
    let mut root = None;
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        root = Some(cause);
        source = cause.source();
    }
    let _ = match root {
        Some(root) if !error.message().contains(&root.to_string()) => {
            writeln!(stderr, "error: {}: {root}", error.message())
        }
        _ => writeln!(stderr, "error: {}", error.message()),
    };
    let _ = writeln!(stderr, "  (code {})", error.code());
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

const QUESTION_TEXT: &str = "the quick brown fox jumps over the lazy dog";

fn question() -> Vec<ContentBlock> {
    vec![ContentBlock::text(format!(
        "How many words are in \"{QUESTION_TEXT}\"?"
    ))]
}

/// One scripted turn: a `word_count` call, then the answer.
fn scripted_turn(turn: u32) -> [ScriptStep; 2] {
    [
        ScriptStep::tool_call(
            &format!("call-{turn}"),
            "word_count",
            serde_json::json!({ "text": QUESTION_TEXT }),
        ),
        ScriptStep::text("The sentence has 9 words."),
    ]
}

async fn run_demo(plan: DemoPlan) -> Result<(), Failure> {
    let gate = Gate::new();
    let model = ScriptedModel::new();
    if matches!(
        (&plan.drill, &plan.model),
        (Drill::None, DemoModel::Scripted)
    ) {
        return run_tour_demo(plan).await;
    }
    match plan.drill {
        Drill::Forest => return run_forest(plan).await,
        Drill::None => model.push_all(scripted_turn(1)),
        Drill::Stall => {
            let [call, answer] = scripted_turn(1);
            model.push_all([call, answer.gated(&gate)]);
        }
        Drill::Burst(turns) => (1..=turns).for_each(|turn| model.push_all(scripted_turn(turn))),
    }
    let store = plan.store.open_with(false, plan.lease_ttl).await?;
    let builder = cli::telemetry::instrumented(Runtime::builder())
        .shared_store(store)
        .tool(word_count_tool());
    let builder = match plan.model {
        DemoModel::Scripted => builder.model("scripted", model),
        DemoModel::OpenAi(config) => builder.model("openai", OpenAiAdapter::new(config)?),
    };
    let rt = builder.build()?;
    if plan.prompt.is_some() {
        subagents::tour::install_tour(&rt).await?;
    }
    let cwd = std::env::current_dir().map_err(|e| {
        SubagentError::new(ErrorCode::InvalidArgs, format!("no working directory: {e}"))
    })?;
    let options = AgentOptions {
        model: plan.model_name.clone(),
        flush: match plan.drill {
            Drill::None => FlushPolicy::OnRequest,
            Drill::Stall | Drill::Burst(_) | Drill::Forest => FlushPolicy::EveryStep,
        },
        ..AgentOptions::default()
    };
    let handle = rt
        .agents()
        .create(CreateAgent::new().cwd(cwd).options(options))
        .await?;
    let agent = handle.agent().clone();
    let mut out = std::io::stdout().lock();
    let turns = match plan.drill {
        Drill::Burst(turns) => turns,
        Drill::None | Drill::Stall | Drill::Forest => 1,
    };
    let prompt = match &plan.prompt {
        Some(text) => vec![ContentBlock::text(text.clone())],
        None => question(),
    };
    for _ in 0..turns {
        agent.followup(prompt.clone(), MessageSource::User).await?;
        if matches!(plan.drill, Drill::Stall) {
            gate.reached().await;
            writeln!(out, "stalled {}", agent.id())?;
            out.flush()?;
            // Hold the turn open until the process is killed.
            std::future::pending::<()>().await;
        }
        agent.when_idle().await;
        agent.log().flush().await?;
        if matches!(plan.drill, Drill::Burst(_)) {
            writeln!(out, "flushed {} {}", agent.id(), agent.log().len())?;
            out.flush()?;
        }
    }
    let events = agent.log().events();
    let outcome = turn_outcome(&events);
    writeln!(out, "session {} in {}", agent.id(), plan.store)?;
    // A failure is said once, as an error; its log only when asked for.
    if outcome.is_ok() || plan.verbose {
        for event in &events {
            writeln!(out, "{}", describe(event))?;
        }
    } else {
        writeln!(
            out,
            "({} events logged; --verbose prints them)",
            events.len()
        )?;
    }
    if let Ok(answer) = &outcome {
        writeln!(out, "answer: {answer}")?;
    }
    handle.dispose().await?;
    outcome.map(drop).map_err(Failure::Error)
}

/// The narrated tour: a scripted parent delegates to a `spawn` and a `fork` child in parallel,
/// starts a continuable child, sends it a follow-up, hears its report and its settled notice,
/// and lists its agents. The store is left behind for `subagents tree`.
async fn run_tour_demo(plan: DemoPlan) -> Result<(), Failure> {
    let rt = cli::telemetry::instrumented(Runtime::builder())
        .shared_store(plan.store.open_with(false, plan.lease_ttl).await?)
        .model("tour", subagents::tour::TourModel)
        .build()?;
    subagents::tour::install_tour(&rt).await?;
    let (parent, transcript) = subagents::tour::run_tour(&rt, std::time::Duration::from_secs(30))
        // The tour's root: its parent's turns and every delegation below form one trace.
        .instrument(tracing::info_span!(
            target: "subagents::trace",
            "demo",
            otel.name = "subagents demo"
        ))
        .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "parent {parent} in {}", plan.store)?;
    for line in &transcript {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "inspect the forest with: subagents tree {parent} --store {}",
        plan.store.argument()
    )?;
    drop(out);
    rt.shutdown().await?;
    Ok(())
}

/// The `--forest` drill: grows the forest one node at a time (each node's first turn held at
/// its own gate until the next level exists), makes every log durable, prints the ids and
/// holds until the process is killed.
async fn run_forest(plan: DemoPlan) -> Result<(), Failure> {
    let model = ScriptedModel::new();
    let rt = cli::telemetry::instrumented(Runtime::builder())
        .shared_store(plan.store.open_with(false, plan.lease_ttl).await?)
        .model("scripted", model.clone())
        .build()?;
    rt.subagents()
        .register_provider(SpawnInProcess::default())
        .await?
        .keep();
    let options = AgentOptions {
        model: plan.model_name.clone(),
        flush: FlushPolicy::EveryStep,
        ..AgentOptions::default()
    };
    let root = rt
        .agents()
        .create(CreateAgent::new().options(options))
        .await?;
    // Starts a child of `parent` whose first answer waits at a gate, and waits until the
    // child's turn reached it: the child is mid-turn.
    let grow = |parent: subagents::AgentRef, label: &'static str| {
        let rt = rt.clone();
        let model = model.clone();
        async move {
            let gate = Gate::new();
            model.push(ScriptStep::text(format!("{label} answered")).gated(&gate));
            let started = rt
                .subagents()
                .start_continuable(ContinuableStartSpec::new(
                    "spawn",
                    label,
                    &parent,
                    vec![ContentBlock::text(format!("{label}: work on your part"))],
                ))
                .await?;
            gate.reached().await;
            let agent = rt.agents().get(started.child_id).await.ok_or_else(|| {
                SubagentError::new(ErrorCode::ReportableBug, "a started child is not live")
            })?;
            Ok::<_, SubagentError>((agent, gate))
        }
    };
    let (child, child_gate) = grow(root.agent().clone(), "child").await?;
    let (grandchild, grandchild_gate) = grow(child.clone(), "grandchild").await?;
    let (great, _held) = grow(grandchild.clone(), "great-grandchild").await?;
    let (busy, _held_too) = grow(root.agent().clone(), "busy child").await?;
    // The upper two finish their turns and wait on the child they own; the others stay
    // mid-turn until the kill.
    for (agent, gate) in [(&grandchild, grandchild_gate), (&child, child_gate)] {
        gate.release();
        agent.when_idle().await;
    }
    for agent in [root.agent(), &child, &grandchild, &great, &busy] {
        agent.log().flush().await?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "forest {} {} {} {} {}",
        root.agent().id(),
        child.id(),
        grandchild.id(),
        great.id(),
        busy.id()
    )?;
    out.flush()?;
    drop(out);
    std::future::pending::<()>().await;
    Ok(())
}

/// The last turn's answer, or the error it ended with.
fn turn_outcome(events: &[SessionEvent]) -> Result<String, SubagentError> {
    let reason = events.iter().rev().find_map(|event| match &event.kind {
        EventKind::TurnEnd { reason, .. } => Some(reason),
        _ => None,
    });
    match reason {
        Some(TurnEndReason::Completed) => {
            let answer = subagents::session::final_assistant_output(events);
            Ok(answer
                .iter()
                .filter_map(ContentBlock::as_text)
                .collect::<Vec<_>>()
                .join(""))
        }
        Some(TurnEndReason::Error { error }) => Err(SubagentError::new(
            ErrorCode::ModelUnavailable,
            format!("the turn failed: {} ({})", error.message, error.code),
        )),
        Some(other) => Err(SubagentError::new(
            ErrorCode::ModelUnavailable,
            format!("the turn did not complete: {}", wire_name(other, "kind")),
        )),
        None => Err(SubagentError::new(
            ErrorCode::ReportableBug,
            "the demo's turn never ended",
        )),
    }
}

/// The blocks of a message as text: tool calls as `name(arguments)`, results by their content.
fn text_of(content: &[ContentBlock]) -> String {
    content
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text } | ContentBlock::Reasoning { text } => text.clone(),
            ContentBlock::ToolCall {
                name, arguments, ..
            } => format!("{name}({arguments})"),
            ContentBlock::ToolResult { content, .. } => text_of(content),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The serde tag `field` of `value` (its name on the wire), for display.
fn wire_name(value: &impl serde::Serialize, field: &str) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.get(field)?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// One line of the session log, for a person: text rather than `Debug` dumps.
fn describe(event: &SessionEvent) -> String {
    let detail = match &event.kind {
        EventKind::TurnStart { turn } => format!("turn {turn}"),
        EventKind::TurnEnd { turn, reason, .. } => {
            format!("turn {turn}: {}", wire_name(reason, "kind"))
        }
        EventKind::StepStart { turn, step } | EventKind::StepEnd { turn, step } => {
            format!("turn {turn} step {step}")
        }
        EventKind::UserMessage(message) => message.text(),
        EventKind::AssistantChunk { chunk, .. } => match chunk {
            StreamChunk::TextDelta { text, .. } | StreamChunk::ReasoningDelta { text, .. } => {
                format!("{} {text:?}", wire_name(chunk, "type"))
            }
            other => wire_name(other, "type"),
        },
        EventKind::AssistantMessage { message, .. } => text_of(&message.content),
        EventKind::ToolCall {
            name, arguments, ..
        } => format!("{name}({arguments})"),
        EventKind::ToolResult { message, .. } => text_of(&message.content),
        EventKind::InboxSpliced {
            target,
            inserted,
            removed_count,
            ..
        } => format!(
            "{} +{} -{}",
            serde_json::to_value(target)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default(),
            inserted.len(),
            removed_count.unwrap_or(0)
        ),
        EventKind::EndSeed {} => String::new(),
        EventKind::Extension { data, .. } => data.to_string(),
        // A kind added after this CLI was written: its type name says enough.
        _ => String::new(),
    };
    format!("{:>4}  {:<20} {detail}", event.seq, event.kind.type_name())
}

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt as _;

    // The log's filter once lost its level hint (a filter without one, combined with it, hints
    // nothing), and the `log` facade was bridged at `TRACE`: sled's trace records were all
    // dispatched to the layers only to be refused.
    #[test]
    fn the_log_bridges_the_log_facade_at_its_filters_level() {
        for (directives, level) in [
            (super::DEFAULT_LOG, LevelFilter::WARN),
            ("info", LevelFilter::INFO),
            ("off", LevelFilter::OFF),
        ] {
            let subscriber = tracing_subscriber::registry().with(super::log_layer(
                tracing_subscriber::EnvFilter::new(directives),
            ));
            assert_eq!(
                tracing::Subscriber::max_level_hint(&subscriber),
                Some(level),
                "{directives}"
            );
        }
    }

    #[test]
    fn the_process_runs_without_transparent_huge_pages() {
        super::without_transparent_huge_pages();
        assert_eq!(
            rustix::thread::transparent_huge_pages_are_disabled().ok(),
            Some(true)
        );
    }
}
