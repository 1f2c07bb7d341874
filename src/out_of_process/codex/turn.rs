//! Provides [`Turn`]: one Codex turn's association rules, answer selection, unattended
//! decisions and terminal mapping, as a pure state machine over the frames the app-server
//! sends (no I/O, so every rule is testable frame by frame).

use serde_json::{json, Value};

use super::{categorize, facts, Fact, Facts, FailureLine, Stage, PREFIX};
use crate::content::ContentBlock;
use crate::stop_reason::StopReason;

/// A fatal protocol failure: the run fails at `stage` (the message is for the log only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fatal {
    pub(crate) stage: Stage,
    pub(crate) message: String,
}

/// How the turn ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnEnd {
    /// `completed` with an answer.
    Completed(Vec<ContentBlock>),
    /// Any other end: the stop reason, the failure and the output kept.
    Failed {
        stop_reason: StopReason,
        failure: FailureLine,
        message: String,
    },
}

#[derive(Debug)]
enum Window {
    /// `turn/start` not sent yet: the turn's frames are dropped, requests naming a turn fail.
    BeforeTurnStart,
    /// `turn/start` sent, its response not read: frames are held until it commits the id.
    Provisional {
        pending: Option<String>,
        held: Vec<(u64, String, Value)>,
        held_fact: Option<(u64, Fact)>,
    },
    /// The turn id is known.
    Committed(String),
}

/// One turn on one thread.
#[derive(Debug)]
pub(crate) struct Turn {
    thread: String,
    window: Window,
    latest_final: Option<String>,
    latest_unphased: Option<String>,
    facts: Facts,
    next_order: u64,
    end: Option<TurnEnd>,
}

fn fatal(stage: Stage, message: impl std::fmt::Display) -> Fatal {
    Fatal {
        stage,
        message: format!("{PREFIX}: {message}"),
    }
}

fn non_empty_str(value: Option<&Value>) -> Option<&str> {
    value
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
}

impl Turn {
    /// A turn on `thread`, before `turn/start`.
    pub(crate) fn new(thread: String) -> Self {
        Self {
            thread,
            window: Window::BeforeTurnStart,
            latest_final: None,
            latest_unphased: None,
            facts: Facts::default(),
            next_order: 0,
            end: None,
        }
    }

    fn order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// The stage a failure now belongs to.
    fn stage(&self) -> Stage {
        match self.window {
            Window::Committed(_) => Stage::Turn,
            _ => Stage::TurnStart,
        }
    }

    /// The thread and the committed turn id, once known.
    pub(crate) fn ids(&self) -> Option<(&str, &str)> {
        match &self.window {
            Window::Committed(turn) => Some((&self.thread, turn)),
            _ => None,
        }
    }

    /// The answer selected so far: the latest final answer, else the latest unphased one; a
    /// blank choice is no output.
    pub(crate) fn output(&self) -> Vec<ContentBlock> {
        let chosen = self.latest_final.as_ref().or(self.latest_unphased.as_ref());
        match chosen {
            Some(text) if !text.trim().is_empty() => vec![ContentBlock::text(text.as_str())],
            _ => Vec::new(),
        }
    }

    /// The latest unattended decision.
    pub(crate) fn fact(&self) -> Option<Fact> {
        self.facts.latest()
    }

    /// Binds the turn to the thread `thread/start` created (facts already seen stay).
    pub(crate) fn bind(&mut self, thread: String) {
        self.thread = thread;
    }

    /// Records a fact read from stderr (always the newest observation).
    pub(crate) fn observe_stderr(&mut self, fact: Fact) {
        let order = self.order();
        self.facts.record(fact, order);
    }

    /// The turn's end, once a terminal arrived.
    pub(crate) fn end(&self) -> Option<&TurnEnd> {
        self.end.as_ref()
    }

    /// `turn/start` was sent: from now on the turn's frames are held until its response.
    pub(crate) fn turn_start_sent(&mut self) {
        self.window = Window::Provisional {
            pending: None,
            held: Vec::new(),
            held_fact: None,
        };
    }

    /// Notes the turn id a frame names while the turn is provisional.
    fn note_pending(&mut self, turn: &str) -> Result<(), Fatal> {
        if let Window::Provisional { pending, .. } = &mut self.window {
            match pending {
                Some(known) if known != turn => {
                    return Err(fatal(
                        Stage::TurnStart,
                        "app-server referenced conflicting turns",
                    ))
                }
                _ => *pending = Some(turn.to_owned()),
            }
        }
        Ok(())
    }

    /// The `turn/start` response: commits the turn id and replays what was held.
    pub(crate) fn commit(&mut self, result: &Value) -> Result<(), Fatal> {
        let invalid = |what: &str| {
            fatal(
                Stage::TurnStart,
                format!("app-server returned invalid {what}"),
            )
        };
        if !result.is_object() {
            return Err(invalid("turn/start response"));
        }
        let turn = result
            .get("turn")
            .ok_or_else(|| invalid("turn/start turn"))?;
        if !turn.is_object() {
            return Err(invalid("turn/start turn"));
        }
        let id = non_empty_str(turn.get("id")).ok_or_else(|| invalid("turn/start turn id"))?;
        if !matches!(self.window, Window::Provisional { .. }) {
            // A second response to turn/start changes nothing.
            return Ok(());
        }
        let window = std::mem::replace(&mut self.window, Window::Committed(id.to_owned()));
        let Window::Provisional {
            pending,
            held,
            held_fact,
        } = window
        else {
            return Ok(());
        };
        if pending.as_deref().is_some_and(|pending| pending != id) {
            return Err(fatal(
                Stage::TurnStart,
                "turn/start response did not match the active turn",
            ));
        }
        if let Some((order, fact)) = held_fact {
            self.facts.record(fact, order);
        }
        for (order, method, params) in held {
            // A replay failure still belongs to the turn's start.
            self.apply(order, &method, &params)
                .map_err(|failure| Fatal {
                    stage: Stage::TurnStart,
                    ..failure
                })?;
        }
        Ok(())
    }

    /// One notification from the app-server.
    pub(crate) fn notify(&mut self, method: &str, params: &Value) -> Result<(), Fatal> {
        if !matches!(method, "turn/started" | "item/completed" | "turn/completed") {
            return Ok(());
        }
        let stage = self.stage();
        let invalid = |what: &str| {
            fatal(
                stage,
                format!("app-server returned invalid {method} {what}"),
            )
        };
        let thread = non_empty_str(params.get("threadId")).ok_or_else(|| invalid("thread id"))?;
        if thread != self.thread {
            return Ok(());
        }
        let order = self.order();
        match &self.window {
            Window::BeforeTurnStart => Ok(()),
            Window::Provisional { .. } => {
                let turn = match method {
                    "item/completed" => {
                        non_empty_str(params.get("turnId")).ok_or_else(|| invalid("turn id"))?
                    }
                    _ => {
                        let turn = params.get("turn").filter(|turn| turn.is_object());
                        let turn = turn.ok_or_else(|| invalid("turn"))?;
                        non_empty_str(turn.get("id")).ok_or_else(|| invalid("turn id"))?
                    }
                };
                let turn = turn.to_owned();
                self.note_pending(&turn)?;
                if method != "turn/started" {
                    if let Window::Provisional { held, .. } = &mut self.window {
                        held.push((order, method.to_owned(), params.clone()));
                    }
                }
                Ok(())
            }
            Window::Committed(_) => self.apply(order, method, params),
        }
    }

    /// Applies a notification for the committed turn.
    fn apply(&mut self, order: u64, method: &str, params: &Value) -> Result<(), Fatal> {
        let Window::Committed(ours) = &self.window else {
            return Ok(());
        };
        let invalid = |what: &str| {
            fatal(
                Stage::Turn,
                format!("app-server returned invalid {method} {what}"),
            )
        };
        match method {
            "item/completed" => {
                let turn = non_empty_str(params.get("turnId")).ok_or_else(|| invalid("turn id"))?;
                if turn != ours {
                    return Ok(());
                }
                let item = params.get("item").filter(|item| item.is_object());
                self.item(order, item.ok_or_else(|| invalid("item"))?)
            }
            "turn/completed" => {
                let turn = params.get("turn").filter(|turn| turn.is_object());
                let turn = turn.ok_or_else(|| invalid("turn"))?;
                let id = non_empty_str(turn.get("id")).ok_or_else(|| invalid("turn id"))?;
                if id != ours {
                    return Ok(());
                }
                self.terminal(order, turn)
            }
            _ => Ok(()),
        }
    }

    fn item(&mut self, order: u64, item: &Value) -> Result<(), Fatal> {
        let kind = item.get("type").and_then(Value::as_str);
        if item.get("status").and_then(Value::as_str) == Some("declined") {
            match kind {
                Some("commandExecution") => self.facts.record(facts::COMMAND_DECLINED, order),
                Some("fileChange") => self.facts.record(facts::FILE_DECLINED, order),
                _ => {}
            }
        }
        if kind != Some("agentMessage") {
            return Ok(());
        }
        let text = item
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| fatal(Stage::Turn, "app-server returned an invalid agent message"))?
            .to_owned();
        match item.get("phase") {
            Some(Value::String(phase)) if phase == "final_answer" => self.latest_final = Some(text),
            Some(Value::Null) => self.latest_unphased = Some(text),
            Some(Value::String(phase)) if phase == "commentary" => {}
            phase => {
                let shown = phase.map_or_else(|| "undefined".to_owned(), Value::to_string);
                return Err(fatal(
                    Stage::Turn,
                    format!("app-server returned an unknown agent message phase {shown}"),
                ));
            }
        }
        Ok(())
    }

    fn terminal(&mut self, order: u64, turn: &Value) -> Result<(), Fatal> {
        let status = turn.get("status");
        let failed =
            |category: String, http_status: Option<u16>, message: String| TurnEnd::Failed {
                stop_reason: StopReason::Error,
                failure: FailureLine {
                    http_status,
                    ..Stage::Turn.failure(category)
                },
                message,
            };
        let end = match status.and_then(Value::as_str) {
            Some("completed") => {
                let output = self.output();
                if output.is_empty() {
                    failed(
                        "unknown".into(),
                        None,
                        format!("{PREFIX}: Codex completed without a final answer"),
                    )
                } else {
                    TurnEnd::Completed(output)
                }
            }
            Some("interrupted") => failed(
                "unknown".into(),
                None,
                format!("{PREFIX}: Codex turn ended with status interrupted"),
            ),
            Some("failed") => {
                let error = turn.get("error").filter(|error| error.is_object());
                let (category, http_status) = categorize(error);
                if category == "sandboxError" {
                    self.facts.record(facts::SANDBOX_FAILED, order);
                }
                let message = format!("{PREFIX}: Codex turn ended with status failed: {category}");
                if category == "contextWindowExceeded" {
                    TurnEnd::Failed {
                        stop_reason: StopReason::MaxTokens,
                        failure: Stage::Turn.failure(category),
                        message,
                    }
                } else {
                    failed(category, http_status, message)
                }
            }
            _ => {
                let shown = match status {
                    Some(Value::String(status)) => status.clone(),
                    Some(other) => other.to_string(),
                    None => "undefined".to_owned(),
                };
                return Err(fatal(
                    Stage::Turn,
                    format!("app-server returned invalid terminal turn status {shown}"),
                ));
            }
        };
        self.end = Some(end);
        Ok(())
    }

    /// One request from the app-server: the reply's result, or a fatal failure (answered
    /// `-32603` with its message).
    pub(crate) fn request(&mut self, method: &str, params: &Value) -> Result<Value, Fatal> {
        let stage = self.stage();
        let order = self.order();
        // An unknown request is refused as such, whatever it names.
        const SERVED: [&str; 5] = [
            "item/commandExecution/requestApproval",
            "item/fileChange/requestApproval",
            "item/permissions/requestApproval",
            "item/tool/requestUserInput",
            "mcpServer/elicitation/request",
        ];
        if !SERVED.contains(&method) {
            return Err(fatal(
                stage,
                format!("unsupported app-server request {}", Value::from(method)),
            ));
        }
        let thread = params.get("threadId").and_then(Value::as_str);
        if thread != Some(self.thread.as_str()) {
            return Err(fatal(stage, "app-server request referenced another thread"));
        }
        let elicitation = method == "mcpServer/elicitation/request";
        let turn = params.get("turnId");
        // An MCP elicitation may name no turn at all; it is then recorded at once.
        let unbound = elicitation && matches!(turn, Some(Value::Null));
        if !unbound {
            let turn = non_empty_str(turn)
                .ok_or_else(|| fatal(stage, "app-server returned invalid server request turn id"))?
                .to_owned();
            match &self.window {
                Window::BeforeTurnStart => {
                    return Err(fatal(
                        stage,
                        "app-server referenced a turn before turn/start",
                    ))
                }
                Window::Provisional { .. } => self.note_pending(&turn)?,
                Window::Committed(ours) if *ours != turn => {
                    return Err(fatal(stage, "app-server request referenced another turn"))
                }
                Window::Committed(_) => {}
            }
        }
        let (reply, fact) = match method {
            "item/commandExecution/requestApproval" | "item/fileChange/requestApproval" => {
                let cancel =
                    unattended_decision(params).map_err(|message| fatal(stage, message))?;
                let request = if method.contains("commandExecution") {
                    "command approval"
                } else {
                    "file approval"
                };
                let decision = if cancel { "cancel" } else { "decline" };
                (
                    json!({ "decision": decision }),
                    facts::approval(request, cancel),
                )
            }
            "item/permissions/requestApproval" => (
                json!({ "permissions": {}, "scope": "turn" }),
                facts::PERMISSION_GRANT,
            ),
            "item/tool/requestUserInput" => (json!({ "answers": {} }), facts::USER_INPUT),
            _ => (
                json!({ "action": "decline", "content": null, "_meta": null }),
                facts::MCP_ELICITATION,
            ),
        };
        match &mut self.window {
            // Held until the turn commits: a mismatched turn must leave no fact behind.
            Window::Provisional { held_fact, .. } if !unbound => *held_fact = Some((order, fact)),
            _ => self.facts.record(fact, order),
        }
        Ok(reply)
    }
}

/// `cancel` when offered, else `decline` (also when nothing is listed); a list offering
/// neither is an error.
fn unattended_decision(params: &Value) -> Result<bool, &'static str> {
    match params.get("availableDecisions") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Array(offered)) => {
            let offers =
                |decision: &str| offered.iter().any(|item| item.as_str() == Some(decision));
            if offers("cancel") {
                Ok(true)
            } else if offers("decline") {
                Ok(false)
            } else {
                Err("app-server offered no unattended approval decision")
            }
        }
        Some(_) => Err("app-server offered no unattended approval decision"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed() -> Turn {
        let mut turn = Turn::new("thread-1".into());
        turn.turn_start_sent();
        turn.commit(&json!({"turn": {"id": "turn-1"}})).unwrap();
        turn
    }

    fn message(text: &str, phase: Value) -> Value {
        json!({"threadId": "thread-1", "turnId": "turn-1",
               "item": {"type": "agentMessage", "text": text, "phase": phase}})
    }

    // CODEX-40 (reference 11, 12)
    #[test]
    fn the_latest_final_answer_wins_over_unphased_and_commentary() {
        let mut turn = committed();
        turn.notify("item/completed", &message("unphased", Value::Null))
            .unwrap();
        turn.notify(
            "item/completed",
            &message("first final", json!("final_answer")),
        )
        .unwrap();
        turn.notify(
            "item/completed",
            &message("last final", json!("final_answer")),
        )
        .unwrap();
        turn.notify("item/completed", &message("thinking", json!("commentary")))
            .unwrap();
        assert_eq!(turn.output(), vec![ContentBlock::text("last final")]);
    }

    // CODEX-41 (reference 17)
    #[test]
    fn a_missing_phase_is_an_unknown_phase() {
        let mut turn = committed();
        let item = json!({"threadId": "thread-1", "turnId": "turn-1",
                          "item": {"type": "agentMessage", "text": "x"}});
        let failure = turn.notify("item/completed", &item).unwrap_err();
        assert_eq!(
            failure.message,
            "subagent-codex: app-server returned an unknown agent message phase undefined"
        );
    }

    // CODEX-42 (reference 28, 29)
    #[test]
    fn held_frames_replay_at_commit_and_a_mismatch_is_a_turn_start_failure() {
        let mut turn = Turn::new("thread-1".into());
        turn.turn_start_sent();
        turn.notify(
            "turn/started",
            &json!({"threadId": "thread-1", "turn": {"id": "turn-early"}}),
        )
        .unwrap();
        let failure = turn
            .commit(&json!({"turn": {"id": "turn-response"}}))
            .unwrap_err();
        assert_eq!(failure.stage, Stage::TurnStart);
        assert_eq!(
            failure.message,
            "subagent-codex: turn/start response did not match the active turn"
        );
    }

    // CODEX-43 (reference 25)
    #[test]
    fn an_older_replayed_fact_never_replaces_a_newer_one() {
        let mut turn = Turn::new("thread-1".into());
        turn.turn_start_sent();
        let declined = json!({"threadId": "thread-1", "turnId": "turn-1",
                              "item": {"type": "fileChange", "status": "declined"}});
        turn.notify("item/completed", &declined).unwrap();
        let request =
            json!({"threadId": "thread-1", "turnId": "turn-1", "availableDecisions": ["cancel"]});
        turn.request("item/commandExecution/requestApproval", &request)
            .unwrap();
        turn.commit(&json!({"turn": {"id": "turn-1"}})).unwrap();
        assert_eq!(turn.fact(), Some(facts::approval("command approval", true)));
    }

    // CODEX-46 (reference 29, 30)
    #[test]
    fn a_mismatched_early_item_or_request_leaves_no_fact() {
        let mut early_item = Turn::new("thread-1".into());
        early_item.turn_start_sent();
        let declined = json!({"threadId": "thread-1", "turnId": "turn-early",
                              "item": {"type": "commandExecution", "status": "declined"}});
        early_item.notify("item/completed", &declined).unwrap();
        assert!(early_item
            .commit(&json!({"turn": {"id": "turn-response"}}))
            .is_err());
        assert_eq!(early_item.fact(), None);

        let mut early_request = Turn::new("thread-1".into());
        early_request.turn_start_sent();
        let request = json!({"threadId": "thread-1", "turnId": "turn-early",
                             "availableDecisions": ["cancel"]});
        let reply = early_request.request("item/commandExecution/requestApproval", &request);
        assert_eq!(
            reply.unwrap(),
            json!({"decision": "cancel"}),
            "answered at once"
        );
        assert!(early_request
            .commit(&json!({"turn": {"id": "turn-response"}}))
            .is_err());
        assert_eq!(early_request.fact(), None);
    }

    // CODEX-47 (reference 31)
    #[test]
    fn a_turn_named_before_turn_start_or_two_early_turns_fail() {
        let mut before = Turn::new("thread-1".into());
        let request = json!({"threadId": "thread-1", "turnId": "turn-1"});
        let failure = before
            .request("item/fileChange/requestApproval", &request)
            .unwrap_err();
        assert_eq!(
            failure.message,
            "subagent-codex: app-server referenced a turn before turn/start"
        );
        let mut early = Turn::new("thread-1".into());
        early.turn_start_sent();
        early
            .notify(
                "turn/started",
                &json!({"threadId": "thread-1", "turn": {"id": "turn-1"}}),
            )
            .unwrap();
        let failure = early
            .notify("item/completed", &message_in("turn-2", "x"))
            .unwrap_err();
        assert_eq!(failure.stage, Stage::TurnStart);
        assert_eq!(
            failure.message,
            "subagent-codex: app-server referenced conflicting turns"
        );
    }

    // CODEX-48 (reference 33)
    #[test]
    fn frames_before_turn_start_and_for_other_turns_are_ignored() {
        let mut turn = Turn::new("thread-1".into());
        turn.notify("item/completed", &message_in("turn-before", "early"))
            .unwrap();
        let completed = json!({"threadId": "thread-1",
                               "turn": {"id": "turn-before", "status": "completed"}});
        turn.notify("turn/completed", &completed).unwrap();
        turn.notify("future/notification", &json!({})).unwrap();
        assert_eq!(turn.end(), None);
        turn.turn_start_sent();
        turn.commit(&json!({"turn": {"id": "turn-1"}})).unwrap();
        turn.notify("item/completed", &message_in("turn-2", "not ours"))
            .unwrap();
        assert_eq!(turn.output(), Vec::<ContentBlock>::new());
    }

    // CODEX-49 (reference 26, 17)
    #[test]
    fn an_invalid_held_terminal_fails_at_turn_start() {
        let mut turn = Turn::new("thread-1".into());
        turn.turn_start_sent();
        let bad = json!({"threadId": "thread-1", "turn": {"id": "turn-1", "status": "inProgress"}});
        turn.notify("turn/completed", &bad).unwrap();
        let failure = turn.commit(&json!({"turn": {"id": "turn-1"}})).unwrap_err();
        assert_eq!(failure.stage, Stage::TurnStart);
        assert_eq!(
            failure.message,
            "subagent-codex: app-server returned invalid terminal turn status inProgress"
        );
    }

    fn message_in(turn: &str, text: &str) -> Value {
        json!({"threadId": "thread-1", "turnId": turn,
               "item": {"type": "agentMessage", "text": text, "phase": "final_answer"}})
    }
}
