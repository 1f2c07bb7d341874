//! `subagents acp-agent`: this runtime served as an Agent Client Protocol agent over stdio.
//!
//! Each `session/new` creates a root agent (its session in the store, its cwd the one the client
//! announced) on the scripted model (or `--model openai`); each `session/prompt` becomes one turn
//! of that agent, whose answer streams back as `agent_message_chunk` and whose end maps to the ACP
//! stop reason. Sessions' prompts run at once, one at a time in each. `session/cancel` cancels the
//! turn, or a prompt still waiting to start (answered `cancelled`); `session/close` (advertised)
//! cancels it and disposes the session's agent, and the open sessions stay bounded
//! ([`sessions`]). A relative or missing cwd and a prompt without text are invalid params. The
//! `ACP_AGENT_*` variables ([`script::AcpAgentScript`]) script the protocol paths a client must
//! handle: crashes, ignored cancels, missing session ids, permission requests, slow exits. It is
//! the peer the ACP and SDK providers' tests run against, and any ACP client (an editor) can
//! delegate to it.

pub(crate) mod script;
mod sessions;

use std::path::PathBuf;
use std::sync::{Arc, PoisonError};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse,
    ContentBlock as AcpBlock, ContentChunk, InitializeRequest, InitializeResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind,
    PromptCapabilities, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, SessionCapabilities, SessionCloseCapabilities, SessionNotification,
    SessionUpdate, StopReason as AcpStopReason, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{v1, Agent, ByteStreams, Client, Handled, UntypedMessage};
use tokio::sync::mpsc;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use subagents::content::text_of;
use subagents::session::fold::final_assistant_output;
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentEvent, AgentEventKind, CancelCause, ContentBlock, CreateAgent, ErrorCode, EventKind,
    EventScope, InboxPolicy, MessageSource, Runtime, SubagentError, TurnEndReason,
};

use crate::cli::model::ModelPlan;
use script::{AcpAgentScript, ScriptedStop};
use sessions::{Session, Sessions};

/// `subagents acp-agent` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct AcpAgentArgs {
    /// Keep the sessions in a store: a sled directory, `memory` (nothing kept after the
    /// process), or a `postgres://` URL.
    #[arg(long, default_value = super::store::DEFAULT_STORE)]
    store: super::store::StoreLocation,
    /// How many sessions stay open at most: past it, `session/new` closes the least recently
    /// used idle one.
    #[arg(long, default_value_t = sessions::MAX_SESSIONS, value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: u32,
    /// The model the sessions' agents run on (the `ACP_AGENT_*` answers need the scripted one).
    #[command(flatten)]
    model: crate::cli::model::ModelArgs,
}

type AcpError = agent_client_protocol::Error;

/// What the handlers share.
struct Server {
    rt: Runtime,
    /// The scripted model, when the agents run on it (the script's answers go there).
    model: Option<ScriptedModel>,
    script: AcpAgentScript,
    sessions: Sessions,
}

impl Server {
    /// Claims `id` for one prompt: its session and the prompt's cancellation. A session runs
    /// one prompt at a time, as ACP has it.
    fn claim_prompt(&self, id: &str) -> Result<(Arc<Session>, CancellationToken), AcpError> {
        let session = self
            .sessions
            .get(id)
            .ok_or_else(|| AcpError::invalid_params().data(format!("unknown session {id}")))?;
        let cancel = CancellationToken::new();
        {
            let mut running = session
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if running.is_some() {
                return Err(AcpError::invalid_request()
                    .data(format!("session {id} is already running a prompt")));
            }
            *running = Some(cancel.clone());
        }
        Ok((session, cancel))
    }
}

/// Runs the agent until the client closes stdin, then applies the script's EOF behaviour.
pub(crate) async fn run(args: AcpAgentArgs) -> Result<(), SubagentError> {
    let script = AcpAgentScript::from_env()?;
    let plan = args.model.plan()?;
    start_process_script(&script)?;
    let (builder, model) = match plan {
        ModelPlan::Scripted => {
            let model = ScriptedModel::new();
            // A long session would otherwise keep a copy of every request's whole history.
            model.set_recording(false);
            let builder = crate::cli::telemetry::instrumented(Runtime::builder())
                .model("scripted", model.clone());
            (builder, Some(model))
        }
        ModelPlan::OpenAi(config) => {
            let adapter = subagents::model::OpenAiAdapter::new(config)?;
            (
                crate::cli::telemetry::instrumented(Runtime::builder()).model("openai", adapter),
                None,
            )
        }
    };
    let builder = builder.shared_store(args.store.open(false).await?);
    let server = Arc::new(Server {
        rt: builder.build()?,
        model,
        script,
        sessions: Sessions::new(usize::try_from(args.max_sessions).unwrap_or(usize::MAX)),
    });
    let served = serve(Arc::clone(&server)).await;
    if let Err(error) = served {
        tracing::warn!(%error, "the ACP connection ended with an error");
    }
    on_eof(&server.script).await;
    server.rt.shutdown().await
}

/// The script's process-level behaviour: the pid file, the grandchild, SIGTERM handling.
fn start_process_script(script: &AcpAgentScript) -> Result<(), SubagentError> {
    let io = |what: &str, error: std::io::Error| {
        SubagentError::new(ErrorCode::StoreIo, format!("acp-agent: {what}")).with_source(error)
    };
    if let Some(file) = &script.pid_file {
        std::fs::write(file, std::process::id().to_string())
            .map_err(|error| io("could not write the pid file", error))?;
    }
    if let Some(file) = &script.grandchild_pid_file {
        // Same process group: the provider's tree kill must reach it.
        let grandchild = std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|error| io("could not start the grandchild", error))?;
        std::fs::write(file, grandchild.id().to_string())
            .map_err(|error| io("could not write the grandchild pid file", error))?;
    }
    if script.trap_sigterm || script.sigterm_file.is_some() {
        let mut terms = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|error| io("could not handle SIGTERM", error))?;
        let file = script.sigterm_file.clone().filter(|_| !script.trap_sigterm);
        tokio::spawn(async move {
            while terms.recv().await.is_some() {
                if let Some(file) = &file {
                    let _ = std::fs::write(file, "sigterm");
                    std::process::exit(0);
                }
            }
        });
    }
    Ok(())
}

/// What happens once stdin closed: flush and exit, stay alive, or end normally.
async fn on_eof(script: &AcpAgentScript) {
    if let Some(file) = &script.flush_on_eof {
        tokio::time::sleep(script.flush_delay).await;
        let _ = std::fs::write(file, "flushed");
        std::process::exit(0);
    }
    if script.ignore_eof {
        std::future::pending::<()>().await;
    }
}

fn touch(file: Option<&PathBuf>) {
    if let Some(file) = file {
        let _ = std::fs::write(file, "");
    }
}

async fn serve(server: Arc<Server>) -> Result<(), AcpError> {
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    let (for_missing, for_new, for_prompt, for_cancel, for_close) = (
        Arc::clone(&server),
        Arc::clone(&server),
        Arc::clone(&server),
        Arc::clone(&server),
        Arc::clone(&server),
    );
    Agent
        .v1()
        .name("subagents")
        .on_receive_request(
            async |_: InitializeRequest,
                   responder: v1::Responder<InitializeResponse>,
                   _cx: v1::ConnectionTo<Client>| {
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(
                            AgentCapabilities::new()
                                .load_session(false)
                                .prompt_capabilities(PromptCapabilities::new())
                                .session_capabilities(
                                    SessionCapabilities::new()
                                        .close(SessionCloseCapabilities::new()),
                                ),
                        )
                        .auth_methods(vec![]),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        // Tried before the typed handler: a scripted `session/new` reply without a session id.
        .on_receive_request(
            async move |request: UntypedMessage,
                        responder: v1::Responder<serde_json::Value>,
                        _cx: v1::ConnectionTo<Client>| {
                if request.method == "session/new" && for_missing.script.missing_session_id {
                    responder.respond(serde_json::json!({}))?;
                    return Ok(Handled::Yes);
                }
                Ok(Handled::No {
                    message: (request, responder),
                    retry: false,
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest,
                        responder: v1::Responder<NewSessionResponse>,
                        cx: v1::ConnectionTo<Client>| {
                let server = Arc::clone(&for_new);
                // Runs beside the dispatch loop: creating the agent awaits the runtime.
                cx.spawn(async move {
                    let created = new_session(&server, request.cwd).await;
                    responder.respond_with_result(created.map(NewSessionResponse::new))
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest,
                        responder: v1::Responder<PromptResponse>,
                        cx: v1::ConnectionTo<Client>| {
                let server = Arc::clone(&for_prompt);
                // Claimed here, in the dispatch loop, so a session/cancel dispatched next
                // always finds the prompt it cancels.
                let claimed = server.claim_prompt(&request.session_id.0);
                cx.clone().spawn(async move {
                    let answered = match claimed {
                        Ok((session, cancel)) => {
                            let answered = prompt(&server, &cx, &session, &cancel, request).await;
                            session.release_prompt();
                            answered
                        }
                        Err(error) => Err(error),
                    };
                    // A failed reply means the client is gone; the connection ends on its own.
                    let _ = responder.respond_with_result(answered);
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest,
                        responder: v1::Responder<CloseSessionResponse>,
                        cx: v1::ConnectionTo<Client>| {
                let server = Arc::clone(&for_close);
                // Runs beside the dispatch loop: disposing the agent awaits the runtime.
                cx.spawn(async move {
                    let id = request.session_id.0;
                    let closed = match server.sessions.remove(&id) {
                        Some(session) => {
                            session.close().await;
                            Ok(CloseSessionResponse::new())
                        }
                        None => {
                            Err(AcpError::invalid_params().data(format!("unknown session {id}")))
                        }
                    };
                    responder.respond_with_result(closed)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |cancel: CancelNotification, _cx: v1::ConnectionTo<Client>| {
                let script = &for_cancel.script;
                touch(script.cancel_file.as_ref());
                if script.crash_on_cancel {
                    std::process::exit(1);
                }
                if !script.ignore_cancel {
                    if let Some(session) = for_cancel.sessions.get(&cancel.session_id.0) {
                        session.cancel_prompt();
                    }
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await
}

fn internal(error: impl std::fmt::Display) -> AcpError {
    AcpError::internal_error().data(error.to_string())
}

/// Creates the session's root agent in `cwd`; answers its protocol id.
async fn new_session(server: &Server, cwd: PathBuf) -> Result<String, AcpError> {
    // The client's mistake, said as one: ACP requires an absolute cwd, and a session there
    // must be able to work in it.
    if !cwd.is_absolute() {
        return Err(AcpError::invalid_params()
            .data(format!("cwd must be an absolute path: {}", cwd.display())));
    }
    if !cwd.is_dir() {
        return Err(AcpError::invalid_params().data(format!(
            "cwd is not an accessible directory: {}",
            cwd.display()
        )));
    }
    touch(server.script.new_session_ready.as_ref());
    if let Some(go) = &server.script.new_session_go {
        while !go.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    // With the scripted model each session's agent calls a model name of its own, whose
    // script only its prompts fill.
    let script = server
        .model
        .as_ref()
        .map(|_| format!("acp-session-{}", subagents::SessionId::new()));
    let mut create = CreateAgent::new().cwd(cwd.clone());
    if let Some(name) = &script {
        create = create.options(subagents::AgentOptions {
            model: name.clone(),
            ..subagents::AgentOptions::default()
        });
    }
    let handle = server.rt.agents().create(create).await.map_err(internal)?;
    let id = server
        .script
        .session_id
        .clone()
        .unwrap_or_else(|| handle.agent().id().to_string());
    let displaced = server
        .sessions
        .insert(id.clone(), Arc::new(Session::new(handle, cwd, script)));
    for session in displaced {
        session.close().await;
    }
    Ok(id)
}

fn chunk(
    session: &str,
    update: fn(ContentChunk) -> SessionUpdate,
    text: &str,
) -> SessionNotification {
    SessionNotification::new(
        session.to_owned(),
        update(ContentChunk::new(AcpBlock::from(text.to_owned()))),
    )
}

/// The prompt's text blocks: a prompt with no text (empty, or images and resources only) is
/// refused as invalid params, since this agent reads text alone and would run an empty turn.
fn prompt_text(request: &PromptRequest) -> Result<Vec<ContentBlock>, AcpError> {
    let prompt: Vec<ContentBlock> = request
        .prompt
        .iter()
        .filter_map(|block| match block {
            AcpBlock::Text(text) => Some(ContentBlock::text(text.text.as_str())),
            _ => None,
        })
        .collect();
    let readable = request.prompt.iter().any(|block| match block {
        AcpBlock::Text(text) => !text.text.trim().is_empty(),
        _ => false,
    });
    if readable {
        Ok(prompt)
    } else {
        Err(AcpError::invalid_params()
            .data("a prompt needs text: this agent reads text blocks only"))
    }
}

/// One prompt: the scripted preliminaries, then one turn of the session's agent.
async fn prompt(
    server: &Server,
    cx: &v1::ConnectionTo<Client>,
    session: &Session,
    cancel: &CancellationToken,
    request: PromptRequest,
) -> Result<PromptResponse, AcpError> {
    let script = &server.script;
    if script.crash_on_prompt {
        std::process::exit(1);
    }
    if let Some(text) = &script.prompt_error {
        return Err(AcpError::internal_error().data(text.clone()));
    }
    let id = request.session_id.0.to_string();
    let prompt = prompt_text(&request)?;
    // The turn continues the client's trace when its `_meta` names one (W3C `traceparent`).
    let traceparent = request
        .meta
        .as_ref()
        .and_then(|meta| meta.get("traceparent"))
        .and_then(serde_json::Value::as_str);
    let served = subagents::trace::served_span("session/prompt", traceparent);
    // A cancel that arrives while the prompt waits (a scripted delay) ends it `cancelled`
    // before its turn starts, as ACP requires. Sessions' prompts run at once, one at a time
    // in each session (its prompt is claimed at dispatch).
    let cancelled = || Ok(PromptResponse::new(AcpStopReason::Cancelled));
    if let Some(delay) = script.delay {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return cancelled(),
            () = tokio::time::sleep(delay) => {}
        }
    }
    if script.thought {
        cx.send_notification(chunk(&id, SessionUpdate::AgentThoughtChunk, "thinking…"))?;
    }
    if script.permission && !ask_permission(cx, &id, script.no_allow).await? {
        return Ok(PromptResponse::new(AcpStopReason::Cancelled));
    }
    let answer = if script.ask_fs {
        ask_fs(cx, &id, &session.cwd).await
    } else {
        script.answer(&session.cwd)
    };
    let step = match script.stop {
        ScriptedStop::MaxTokens => ScriptStep::max_tokens(answer.as_str()),
        ScriptedStop::Refusal => ScriptStep::refusal(answer.as_str()),
        _ => ScriptStep::text(answer.as_str()),
    };
    let step = if script.hang {
        // The answer streams now as a partial; the turn then holds until cancelled. A request
        // the client does not implement comes back only after the client dispatched the chunk
        // before it, so the ready file below means the partial has arrived.
        cx.send_notification(chunk(&id, SessionUpdate::AgentMessageChunk, &answer))?;
        if let Ok(ping) = UntypedMessage::new("_subagents/ping", serde_json::json!({})) {
            let _ = cx.send_request(ping).block_task().await;
        }
        step.gated(&Gate::new())
    } else {
        step
    };
    if let (Some(model), Some(name)) = (&server.model, &session.script) {
        model.push_for_model(name.clone(), [step]);
    }
    if cancel.is_cancelled() {
        return cancelled();
    }
    let (turn, reason) = run_turn(&server.rt, session, prompt, cancel, script)
        .instrument(served)
        .await
        .map_err(internal)?;
    if !script.hang {
        let output = session.handle.agent().log().with_events(|events| {
            let start = events
                .iter()
                .rev()
                .find(|event| matches!(event.kind, EventKind::TurnStart { turn: started } if Some(started) == turn))
                .map_or(events.len(), |event| usize::try_from(event.seq).unwrap_or(usize::MAX));
            text_of(&final_assistant_output(events.iter_from(start)))
        });
        if !output.is_empty() {
            cx.send_notification(chunk(&id, SessionUpdate::AgentMessageChunk, &output))?;
        }
    }
    let stop = match (script.stop, reason) {
        (ScriptedStop::Cancelled, _) => AcpStopReason::Cancelled,
        (ScriptedStop::MaxTurnRequests, _) | (_, TurnEndReason::BudgetExhausted { .. }) => {
            AcpStopReason::MaxTurnRequests
        }
        (_, TurnEndReason::Completed) => AcpStopReason::EndTurn,
        (_, TurnEndReason::MaxTokens) => AcpStopReason::MaxTokens,
        (_, TurnEndReason::Blocked) => AcpStopReason::Refusal,
        (_, TurnEndReason::Aborted { .. } | TurnEndReason::Interrupted) => AcpStopReason::Cancelled,
        (_, TurnEndReason::Error { error }) => return Err(internal(error.message)),
        // A turn end added later: the client cannot tell it from an error.
        (_, other) => return Err(internal(format!("the turn ended {other:?}"))),
    };
    Ok(PromptResponse::new(stop))
}

/// Calls the client's `fs/read_text_file`; answers how it went.
async fn ask_fs(cx: &v1::ConnectionTo<Client>, session: &str, cwd: &std::path::Path) -> String {
    let read = UntypedMessage::new(
        "fs/read_text_file",
        serde_json::json!({ "sessionId": session, "path": cwd.join("README.md") }),
    );
    match read {
        Ok(read) => match cx.send_request(read).block_task().await {
            Ok(_) => "fs ok".to_owned(),
            Err(error) => format!("fs {}", error.code.value()),
        },
        Err(error) => format!("fs unsent: {}", error.message),
    }
}

/// Asks the client's permission; true when it selected an option.
async fn ask_permission(
    cx: &v1::ConnectionTo<Client>,
    session: &str,
    no_allow: bool,
) -> Result<bool, AcpError> {
    let mut options = Vec::new();
    if !no_allow {
        options.push(PermissionOption::new(
            "yes",
            "Yes",
            PermissionOptionKind::AllowOnce,
        ));
    }
    options.push(PermissionOption::new(
        "no",
        "No",
        PermissionOptionKind::RejectOnce,
    ));
    let asked = RequestPermissionRequest::new(
        session.to_owned(),
        ToolCallUpdate::new(
            "scripted-tool",
            ToolCallUpdateFields::new().title("run the scripted tool".to_owned()),
        ),
        options,
    );
    let answer = cx.send_request(asked).block_task().await?;
    Ok(matches!(
        answer.outcome,
        RequestPermissionOutcome::Selected(_)
    ))
}

/// Runs one turn of the session's agent on `prompt` and returns its number (none when the
/// prompt was discarded unrun) and how it ended; `cancel` cancels the turn.
async fn run_turn(
    rt: &Runtime,
    session: &Session,
    prompt: Vec<ContentBlock>,
    cancel: &CancellationToken,
    script: &AcpAgentScript,
) -> Result<(Option<u64>, TurnEndReason), SubagentError> {
    let agent = session.handle.agent();
    let (sender, mut events) = mpsc::unbounded_channel();
    // Subscribed before the send, so no event of the turn is missed.
    let _subscription =
        rt.events()
            .subscribe(EventScope::Key(agent.id()), move |event: &AgentEvent| {
                let _ = sender.send(event.kind.clone());
            });
    let message = agent.followup(prompt, MessageSource::User).await?;
    touch(script.ready_file.as_ref());
    let mut turn = None;
    let mut cancelled = false;
    loop {
        let kind = tokio::select! {
            kind = events.recv() => kind,
            () = cancel.cancelled(), if !cancelled => {
                cancelled = true;
                agent.cancel(CancelCause::User, InboxPolicy::Discard).await?;
                continue;
            }
        };
        match kind {
            Some(AgentEventKind::InboxClaimed {
                message: claimed,
                turn: claiming,
            }) if claimed == message => {
                turn = Some(claiming);
            }
            Some(AgentEventKind::TurnEnded {
                turn: ended,
                reason,
            }) if Some(ended) == turn => {
                return Ok((turn, reason));
            }
            Some(AgentEventKind::InboxDiscarded { message: discarded }) if discarded == message => {
                let reason = TurnEndReason::Aborted {
                    reason: CancelCause::User,
                };
                return Ok((None, reason));
            }
            Some(_) => {}
            None => {
                return Err(SubagentError::new(
                    ErrorCode::AgentDisposed,
                    "the session's agent went away mid-turn",
                ))
            }
        }
    }
}
