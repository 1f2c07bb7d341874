//! `subagents node`: a long-running runtime that joins a cluster on PostgreSQL, heartbeats its
//! membership and serves its peers' deliveries for the children it holds, until SIGTERM or
//! SIGINT (a graceful leave: every child released, then the membership row removed).
//!
//! With `--report`, every continuable child run on the node is granted the `report` tool
//! (waking its parent), and the scripted model reports once in each turn before it answers.
//!
//! With `--drive ROOTS` the node also grows a forest: `ROOTS` root agents, each placing
//! `--children` continuable children round-robin on the `--place-on` nodes (on itself when
//! none are named) and sending each `--followups` follow-ups per round, one round at start and
//! one more for each `round` line read from stdin (an `interrupt` line interrupts every child
//! for its root; a `drain` line drains the descendants of the next root not drained yet, whose
//! later follow-ups are refused `DRAINING`; `quit` or the end of stdin leaves). A process
//! restarted under the driving node's id goes on driving the same forest with
//! `--resume-roots ID,…` (its roots resumed, their children listed from the store, the
//! `--drained N` first roots drained again), from round `--first-round K`, its follow-ups'
//! texts marked ` (LABEL)` by `--label LABEL`.
//!
//! It prints one line per fact, flushed, for a person or a test to follow:
//! `node <id> <name>` once serving; with `--drive`, `child <root> <child> <node>` per placed
//! child, `accepted <child> <message-id>` per accepted follow-up, `refused <child>
//! <round>.<k> <CODE> <message>` per refused one, and `round <k>` once every follow-up of a round was answered;
//! `interrupted <k>` once every child was asked to stop (after round `k`), and
//! `interrupt-refused <child> <CODE> <message>` per refusal; `draining <root>` as a drain
//! begins, `drain-failed <k> <CODE> <message>` if it fails and `drained <k>` once it is over;
//! `left <id>` after a graceful leave. With `--metrics-addr`, `metrics <addr>` follows the
//! `node` line: the Prometheus endpoint listens there.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use subagents::model::OpenAiAdapter;
use subagents::store::{LeaseHolder, PostgresConfig, PostgresStore};
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::tools::REPORT;
use subagents::{
    install_report_tool, AgentHandle, ContentBlock, ContinuableStartSpec, CreateAgent, ErrorCode,
    FollowupOptions, GenerateRequest, InterruptAuthority, MessageSource, ReportDelivery,
    ResumeAgent, Runtime, SessionId, SpawnInProcess, SubagentError,
};
use tokio::io::AsyncBufReadExt;

use super::model::{usage, ModelArgs, ModelPlan};
use super::store::StoreLocation;
use crate::Failure;

/// The `node` command's flags.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// The cluster's store: a PostgreSQL connection string (`postgres://…`).
    #[arg(long)]
    store: StoreLocation,
    /// This node's id (a UUID); a fresh one by default. A process restarted under the id of
    /// one that died joins as a new incarnation of the node (the dead one's children pass on
    /// at once); while another process runs the node, joining under its id is refused.
    #[arg(long, value_name = "UUID")]
    node_id: Option<uuid::Uuid>,
    /// The node's name in the membership table.
    #[arg(long, default_value = "node")]
    name: String,
    /// How long the node's membership lives without a heartbeat, in milliseconds (default
    /// 10000): the node's leases pass on that long after it dies.
    #[arg(long, value_name = "MS")]
    node_ttl_ms: Option<u64>,
    /// How long each call to this node's scripted model takes, in milliseconds.
    #[arg(long, value_name = "MS")]
    latency_ms: Option<u64>,
    /// Hold every turn run on this node mid-turn until the process ends (a crash drill; the
    /// scripted model only).
    #[arg(long)]
    hold: bool,
    /// Grant every continuable child run on this node the `report` tool (its reports wake its
    /// parent); the scripted model then reports once in each turn before it answers.
    #[arg(long)]
    report: bool,
    /// Grow a forest from this node: this many root agents.
    #[arg(long, value_name = "ROOTS")]
    drive: Option<u32>,
    /// Continuable children per root (with `--drive`).
    #[arg(long, value_name = "N")]
    children: Option<u32>,
    /// Follow-ups per child in each round (with `--drive`).
    #[arg(long, value_name = "N")]
    followups: Option<u32>,
    /// The nodes the children are placed on, round-robin, as comma-separated ids (with
    /// `--drive`; this node itself when none are named).
    #[arg(long, value_name = "UUID,…", value_delimiter = ',')]
    place_on: Vec<uuid::Uuid>,
    /// Drive the forest these roots grew before (with `--drive`, as many as it names): a node
    /// restarted under its id resumes them here and lists their children from the store
    /// instead of growing a new forest.
    #[arg(long, value_name = "UUID,…", value_delimiter = ',')]
    resume_roots: Vec<SessionId>,
    /// The number of the first round (with `--drive`; 1 by default): a resumed drive goes on
    /// from the round it was stopped in.
    #[arg(long, value_name = "K")]
    first_round: Option<u32>,
    /// How many of the roots were drained before (with `--resume-roots`): they are drained
    /// again at once, and the next `drain` line drains the one after them.
    #[arg(long, value_name = "N")]
    drained: Option<usize>,
    /// Appended to every follow-up's text (with `--drive`), so that two drives of one forest
    /// never send the same text.
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// Page the driven roots' settled events out of memory beyond this many, as
    /// `AgentOptions::resident_events` (with `--drive`; grown and resumed roots alike): the
    /// fault campaign checks its promises across page-outs too.
    #[arg(long, value_name = "N")]
    resident_events: Option<std::num::NonZeroU32>,
    /// Serve the node's metrics in Prometheus's text format at `http://ADDR/metrics` (port 0
    /// picks a free port; the `metrics <addr>` line says which).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Spread the node's agents over this many threads ([`subagents::RuntimeBuilder::workers`]:
    /// 1 runs them all on the node's own thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// The model (the scripted model by default).
    #[command(flatten)]
    model: ModelArgs,
}

/// The forest a driving node grows (or resumes).
struct Drive {
    roots: u32,
    children: u32,
    followups: u32,
    place_on: Vec<uuid::Uuid>,
    /// The roots of a forest grown before, resumed instead of growing one.
    resume_roots: Vec<SessionId>,
    first_round: u32,
    drained: usize,
    /// Appended to each follow-up's text: ` (LABEL)`, or nothing.
    label: String,
    /// The roots' paging ([`subagents::AgentOptions::resident_events`]).
    resident_events: Option<std::num::NonZeroU32>,
}

impl Drive {
    /// The options of the roots, grown or resumed: on `model_name`, paging as asked.
    fn root_options(&self, model_name: &str) -> subagents::AgentOptions {
        subagents::AgentOptions {
            model: model_name.to_owned(),
            resident_events: self.resident_events,
            ..subagents::AgentOptions::default()
        }
    }
}

/// The checked flags.
struct NodePlan {
    url: String,
    node_id: Option<uuid::Uuid>,
    name: String,
    node_ttl: Option<Duration>,
    latency: Option<Duration>,
    hold: bool,
    report: bool,
    drive: Option<Drive>,
    model: ModelPlan,
    model_name: String,
    metrics_addr: Option<std::net::SocketAddr>,
    workers: usize,
}

impl NodePlan {
    fn from_args(args: NodeArgs) -> Result<Self, SubagentError> {
        let StoreLocation::Postgres(url) = args.store else {
            return Err(usage(
                "subagents node needs a PostgreSQL store: --store postgres://…",
            ));
        };
        let model = args.model.plan()?;
        if matches!(model, ModelPlan::OpenAi(_)) && (args.hold || args.latency_ms.is_some()) {
            return Err(usage(
                "--hold and --latency-ms script the scripted model only",
            ));
        }
        if args.hold && args.report {
            return Err(usage(
                "--hold and --report do not combine: a held turn never gets to report",
            ));
        }
        let drive = match args.drive {
            Some(0) => return Err(usage("--drive needs at least one root")),
            Some(roots) => {
                let resumed = u32::try_from(args.resume_roots.len()).unwrap_or(u32::MAX);
                if !args.resume_roots.is_empty() && resumed != roots {
                    return Err(usage(format!(
                        "--resume-roots names {resumed} roots, --drive {roots}"
                    )));
                }
                let drained = args.drained.unwrap_or(0);
                if args.drained.is_some() && args.resume_roots.is_empty() {
                    return Err(usage("--drained only applies with --resume-roots"));
                }
                if drained > args.resume_roots.len() {
                    return Err(usage("--drained cannot exceed the roots resumed"));
                }
                Some(Drive {
                    roots,
                    children: match args.children {
                        Some(0) => return Err(usage("--children must be at least 1")),
                        children => children.unwrap_or(1),
                    },
                    followups: args.followups.unwrap_or(0),
                    place_on: args.place_on,
                    resume_roots: args.resume_roots,
                    first_round: match args.first_round {
                        Some(0) => return Err(usage("--first-round must be at least 1")),
                        round => round.unwrap_or(1),
                    },
                    drained,
                    label: args
                        .label
                        .map_or_else(String::new, |label| format!(" ({label})")),
                    resident_events: args.resident_events,
                })
            }
            None => {
                for (given, flag) in [
                    (args.children.is_some(), "--children"),
                    (args.followups.is_some(), "--followups"),
                    (!args.place_on.is_empty(), "--place-on"),
                    (!args.resume_roots.is_empty(), "--resume-roots"),
                    (args.first_round.is_some(), "--first-round"),
                    (args.drained.is_some(), "--drained"),
                    (args.label.is_some(), "--label"),
                    (args.resident_events.is_some(), "--resident-events"),
                ] {
                    if given {
                        return Err(usage(format!("{flag} only applies with --drive")));
                    }
                }
                None
            }
        };
        Ok(Self {
            url,
            node_id: args.node_id,
            name: args.name,
            node_ttl: match args.node_ttl_ms {
                Some(0) => return Err(usage("--node-ttl-ms must be at least 1")),
                ms => ms.map(Duration::from_millis),
            },
            latency: args.latency_ms.map(Duration::from_millis),
            hold: args.hold,
            report: args.report,
            drive,
            model,
            metrics_addr: args.metrics_addr,
            workers: usize::from(args.workers),
            model_name: args
                .model
                .model_name
                .unwrap_or_else(|| "scripted-node".into()),
        })
    }
}

/// Serves the node's metrics at `addr` (see [`super::telemetry::serve_prometheus`]) and
/// answers the address it listens on.
async fn metrics_endpoint(addr: std::net::SocketAddr) -> Result<std::net::SocketAddr, Failure> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|error| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("the metrics endpoint cannot listen on {addr}: {error}"),
        )
    })?;
    let bound = listener.local_addr().map_err(|error| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("the metrics endpoint's address is unknown: {error}"),
        )
    })?;
    tokio::spawn(super::telemetry::serve_prometheus(listener));
    Ok(bound)
}

/// Prints one line and flushes it: a test reads the lines as they come. A failure is the
/// output's (a closed pipe ends the node quietly), never the store's.
fn say(line: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(Failure::from)
}

/// Runs the node until it is told to leave (or is declared dead: an error).
pub(crate) async fn run(args: NodeArgs) -> Result<(), Failure> {
    let plan = NodePlan::from_args(args)?;
    // Before the node joins: an address it cannot listen on leaves nothing behind.
    let metrics = match plan.metrics_addr {
        Some(addr) => Some(metrics_endpoint(addr).await?),
        None => None,
    };
    let mut config = PostgresConfig::new(plan.url.clone());
    if let Some(ttl) = plan.node_ttl {
        config.node_ttl = ttl;
    }
    let store = Arc::new(PostgresStore::connect_with(config).await?);
    let holder = plan
        .node_id
        .map_or_else(LeaseHolder::new, LeaseHolder::with_id);
    let membership = store.join(&holder, &plan.name).await?;
    let node = membership.node();
    let lost = membership.lost();
    // Held for the process's life: a held turn waits at it until the process ends.
    let hold = Gate::new();
    let builder = super::telemetry::instrumented(Runtime::builder())
        .shared_store(store)
        .lease_holder(holder)
        .cluster(membership)
        .workers(plan.workers);
    let builder = match &plan.model {
        ModelPlan::Scripted => {
            let answer = ScriptStep::text(format!("{} answered", plan.name));
            let model = ScriptedModel::repeating(if plan.hold {
                answer.gated(&hold)
            } else if plan.report {
                reporting(&plan.name)
            } else {
                answer
            });
            if let Some(latency) = plan.latency {
                model.set_latency(latency);
            }
            builder.model("scripted", model)
        }
        ModelPlan::OpenAi(config) => builder.model("openai", OpenAiAdapter::new(config.clone())?),
    };
    let rt = builder.build()?;
    rt.subagents()
        .register_provider(SpawnInProcess::default())
        .await?
        .keep();
    if plan.report {
        install_report_tool(&rt, ReportDelivery::Wakeup).keep();
    }
    // Listened for from now on, whatever the node is doing when one comes.
    let mut signals = Signals::listen()?;
    say(format_args!("node {node} {}", plan.name))?;
    if let Some(bound) = metrics {
        say(format_args!("metrics {bound}"))?;
    }
    let driven = async {
        match &plan.drive {
            // The drive's root span: its starts and follow-ups, on whichever node they run,
            // form one trace.
            Some(drive) => {
                drive_forest(&rt, drive, &plan.model_name, node)
                    .instrument(tracing::info_span!(
                        target: "subagents::trace",
                        "drive",
                        otel.name = "subagents node drive"
                    ))
                    .await
            }
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        outcome = driven => outcome,
        () = signals.next() => Ok(()),
        () = lost.cancelled() => Err(SubagentError::new(
            ErrorCode::LeaseLost,
            format!("node {node} was declared dead (no heartbeat landed within its time-to-live): its children may be another node's now"),
        ).into()),
    };
    // Released child first, then the membership row removed (a lost node's row stays). A
    // second signal cuts a shutdown that waits on others (a parent's node that does not
    // answer, say) short: the node then ends as a killed one does, and the cluster takes
    // over what it held once its leases and its row expire. `leaving` is said, not required:
    // a closed stdout must not skip the release.
    let said = say(format_args!("leaving {node}"));
    let shut = tokio::select! {
        shut = rt.shutdown() => shut,
        () = signals.next() => {
            return Err(SubagentError::new(
                ErrorCode::Cancelled,
                format!(
                    "node {node} stopped at a second signal before its shutdown finished: \
                     what it had not released stays leased until its leases expire"
                ),
            )
            .into())
        }
    };
    outcome?;
    shut?;
    said?;
    say(format_args!("left {node}"))
}

/// The scripted step of a reporting node: a call that may report and has not reported since
/// the turn's last message reports (a call id of its own), any other answers with text.
fn reporting(name: &str) -> ScriptStep {
    let (report, answer) = (format!("{name} reports"), format!("{name} answered"));
    ScriptStep::Respond(Arc::new(move |request: &GenerateRequest| {
        let reported = request
            .messages
            .messages()
            .next_back()
            .is_some_and(|message| matches!(message.source, MessageSource::Tool { .. }));
        let may_report = request.tools.iter().any(|tool| tool.name == REPORT);
        let step = if may_report && !reported {
            let call = format!("report-{}", uuid::Uuid::new_v4());
            ScriptStep::tool_call(&call, REPORT, serde_json::json!({ "output": report }))
        } else {
            ScriptStep::text(answer.clone())
        };
        step.into_chunks().unwrap_or_default()
    }))
}

/// SIGTERM and SIGINT, handled from [`Signals::listen`] on (the default action, ending the
/// process at once, no longer applies: a second signal is how to cut a shutdown short).
struct Signals {
    terms: tokio::signal::unix::Signal,
    interrupts: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> Result<Self, SubagentError> {
        use tokio::signal::unix::{signal, SignalKind};
        let io = |error: std::io::Error| {
            SubagentError::new(ErrorCode::InvalidArgs, format!("handling signals: {error}"))
        };
        Ok(Self {
            terms: signal(SignalKind::terminate()).map_err(io)?,
            interrupts: signal(SignalKind::interrupt()).map_err(io)?,
        })
    }

    /// Resolves at the next SIGTERM or SIGINT.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.terms.recv() => {}
            _ = self.interrupts.recv() => {}
        }
    }
}

/// Interrupts every child for its root (the user's authority): a running turn ends, what the
/// child accepted stays queued. Says `interrupt-refused <child> <CODE> <message>` for each
/// refusal.
async fn interrupt_all(
    rt: &Runtime,
    roots: &[AgentHandle],
    children: &[(usize, SessionId)],
) -> Result<(), Failure> {
    for (root, child) in children {
        let authority = InterruptAuthority::User {
            parent_session_id: roots[*root].agent().id(),
        };
        if let Err(error) = rt.subagents().interrupt(*child, authority).await {
            say(format_args!(
                "interrupt-refused {child} {} {}",
                error.code(),
                error.message().replace('\n', " ")
            ))?;
        }
    }
    Ok(())
}

/// The roots and each child (with its root's index) of a driven forest.
type Forest = (Vec<AgentHandle>, Vec<(usize, SessionId)>);

/// Grows `drive`'s forest: its roots, each placing its children round-robin on the named
/// nodes (on `node` when none are named).
async fn grow_forest(
    rt: &Runtime,
    drive: &Drive,
    model_name: &str,
    node: uuid::Uuid,
) -> Result<Forest, Failure> {
    let options = drive.root_options(model_name);
    let mut roots: Vec<AgentHandle> = Vec::new();
    let mut children: Vec<(usize, SessionId)> = Vec::new();
    let mut placed = 0_usize;
    for r in 0..drive.roots {
        let root = rt
            .agents()
            .create(CreateAgent::new().options(options.clone()))
            .await?;
        for c in 0..drive.children {
            let target = if drive.place_on.is_empty() {
                node
            } else {
                drive.place_on[placed % drive.place_on.len()]
            };
            placed += 1;
            let spec = ContinuableStartSpec::new(
                "spawn",
                format!("child {r}.{c}"),
                root.agent(),
                vec![ContentBlock::text(format!("task {r}.{c}"))],
            )
            .on_node(target);
            let started = rt.subagents().start_continuable(spec).await?;
            say(format_args!(
                "child {} {} {target}",
                root.agent().id(),
                started.child_id
            ))?;
            children.push((roots.len(), started.child_id));
        }
        roots.push(root);
    }
    Ok((roots, children))
}

/// Resumes the roots of a forest grown before (by a process of this node that stopped), lists
/// their children from the store (`child <root> <child> -` each: where a child runs now is
/// its lease's business), and drains again the roots drained before.
async fn resume_forest(rt: &Runtime, drive: &Drive, model_name: &str) -> Result<Forest, Failure> {
    let options = drive.root_options(model_name);
    let mut roots: Vec<AgentHandle> = Vec::new();
    let mut children: Vec<(usize, SessionId)> = Vec::new();
    for id in &drive.resume_roots {
        let root = resume_root(rt, *id, &options).await?;
        let listed = rt
            .subagents()
            .list_children(*id, subagents::CancellationToken::new())
            .await?;
        for child in listed {
            say(format_args!("child {id} {} -", child.id()))?;
            children.push((roots.len(), child.id()));
        }
        roots.push(root);
    }
    // Admission below a drained root closed with the process that drained it.
    for root in &roots[..drive.drained] {
        drain_root(rt, root, drive.first_round).await?;
    }
    Ok((roots, children))
}

/// Drains `root`'s descendants; a failure is said (`drain-failed <round> <CODE> <message>`)
/// and the drive goes on.
async fn drain_root(rt: &Runtime, root: &AgentHandle, round: u32) -> Result<(), Failure> {
    let drain = rt
        .subagents()
        .drain_continuable_descendants(std::slice::from_ref(root.agent()));
    if let Err(error) = drain.await {
        say(format_args!(
            "drain-failed {round} {} {}",
            error.code(),
            error.message().replace('\n', " ")
        ))?;
    }
    Ok(())
}

/// Resumes root `id`, waiting out a peer that holds it for a moment (a child's node storing
/// a settled notice in its inbox while no node had it live); bounded.
async fn resume_root(
    rt: &Runtime,
    id: SessionId,
    options: &subagents::AgentOptions,
) -> Result<AgentHandle, SubagentError> {
    let mut attempts = 0;
    loop {
        match rt
            .agents()
            .resume(ResumeAgent::new(id).options(options.clone()))
            .await
        {
            Err(error) if error.code() == ErrorCode::SessionLeased && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            resumed => return resumed,
        }
    }
}

/// Grows (or resumes) the forest, sends the first round, then one round per `round` line on
/// stdin (an `interrupt` line interrupts every child; a `drain` line drains the next root's
/// descendants) until `quit` or the end of stdin (a signal ends it from outside).
async fn drive_forest(
    rt: &Runtime,
    drive: &Drive,
    model_name: &str,
    node: uuid::Uuid,
) -> Result<(), Failure> {
    let (roots, children) = if drive.resume_roots.is_empty() {
        grow_forest(rt, drive, model_name, node).await?
    } else {
        resume_forest(rt, drive, model_name).await?
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut round = drive.first_round;
    // How many roots a `drain` line drained, first to last.
    let mut drained = drive.drained;
    loop {
        for (root, child) in &children {
            for i in 1..=drive.followups {
                let text = format!("round {round} message {i}{}", drive.label);
                let sent = rt
                    .subagents()
                    .followup(
                        roots[*root].agent(),
                        *child,
                        vec![ContentBlock::text(text)],
                        FollowupOptions::new(MessageSource::User),
                    )
                    .await;
                // A refusal is the answer a fault may earn (the follow-up was not accepted):
                // said, and the round goes on.
                match sent {
                    Ok(id) => say(format_args!("accepted {child} {id}"))?,
                    Err(error) => say(format_args!(
                        "refused {child} {round}.{i} {} {}",
                        error.code(),
                        error.message().replace('\n', " ")
                    ))?,
                }
            }
        }
        say(format_args!("round {round}"))?;
        // Commands until the next round: `interrupt` interrupts every child once.
        loop {
            let next = lines.next_line().await.map_err(|error| {
                SubagentError::new(ErrorCode::InvalidArgs, format!("reading stdin: {error}"))
            })?;
            match next.as_deref().map(str::trim) {
                Some("round") => {
                    round += 1;
                    break;
                }
                Some("interrupt") => {
                    interrupt_all(rt, &roots, &children).await?;
                    say(format_args!("interrupted {round}"))?;
                }
                Some("drain") => {
                    // The next root not drained yet: its children are released, and its
                    // admission stays closed from now on (later follow-ups are refused).
                    if let Some(root) = roots.get(drained) {
                        drained += 1;
                        say(format_args!("draining {}", root.agent().id()))?;
                        drain_root(rt, root, round).await?;
                    }
                    say(format_args!("drained {round}"))?;
                }
                Some("quit") | None => return Ok(()),
                // A blank line (an extra newline from a script) asks for nothing.
                Some("") => {}
                Some(other) => {
                    return Err(usage(format!(
                        "unknown command {other:?}: a driving node reads `round`, \
                         `interrupt`, `drain` or `quit`"
                    ))
                    .into())
                }
            }
        }
    }
}
