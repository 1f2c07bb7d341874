//! One trace per delegation tree (issue #19): the spans the narrated tour records, named and
//! attributed after the OpenTelemetry GenAI conventions, each child's turns under the tool
//! call that delegated to it.

use std::time::Duration;

use subagents::tour::{run_tour, TOUR_PROMPT};
use tracing::Instrument as _;

use crate::cluster_nodes::{completed, first_child, until_stored, NodeProcess};
use crate::support::{CapturedSpan, SpanCapture};
use crate::tour::{tour_runtime, tour_runtime_with};

/// The spans below `index`, children first-level only.
fn children(spans: &[CapturedSpan], index: usize) -> Vec<usize> {
    (0..spans.len())
        .filter(|&at| spans[at].parent == Some(index))
        .collect()
}

/// The `execute_tool` span of tool `name`, the n-th one.
fn tool_call(spans: &[CapturedSpan], name: &str, nth: usize) -> usize {
    (0..spans.len())
        .filter(|&at| {
            spans[at].name == "execute_tool"
                && spans[at].fields.get("gen_ai.tool.name").map(String::as_str) == Some(name)
        })
        .nth(nth)
        .unwrap_or_else(|| panic!("no call {nth} of {name} in {spans:#?}"))
}

/// The agent ids of the `invoke_agent` spans directly below `index`, in the order they opened.
fn turns_below(spans: &[CapturedSpan], index: usize) -> Vec<String> {
    children(spans, index)
        .into_iter()
        .filter(|&at| spans[at].name == "invoke_agent")
        .map(|at| spans[at].fields["gen_ai.agent.id"].clone())
        .collect()
}

/// The agent id of the one `invoke_agent` span directly below `index`.
fn delegated_turn(spans: &[CapturedSpan], index: usize) -> String {
    let turns = turns_below(spans, index);
    assert_eq!(turns.len(), 1, "one child turn under {:?}", spans[index]);
    turns[0].clone()
}

/// The root above `index`.
fn root_of(spans: &[CapturedSpan], mut index: usize) -> usize {
    while let Some(parent) = spans[index].parent {
        index = parent;
    }
    index
}

#[actix_rt::test]
async fn the_tours_delegations_nest_each_childs_turn_under_the_tool_call_that_made_it() {
    let capture = SpanCapture::start();
    let rt = tour_runtime().await;
    let demo = tracing::info_span!(target: "subagents::trace", "demo");
    let (parent, _) = run_tour(&rt, Duration::from_secs(30))
        .instrument(demo.clone())
        .await
        .unwrap();
    // A drain asked for within the trace is a span of it.
    let live = rt.agents().get(parent).await.unwrap();
    let drained = demo.in_scope(|| rt.subagents().drain_continuable_descendants(&[live]));
    drained.await.unwrap();
    rt.shutdown().await.unwrap();
    drop(demo);
    let spans = capture.spans();
    let parent = parent.to_string();

    // The parent's first turn continues the trace its prompt was sent from.
    let first_turn = (0..spans.len())
        .find(|&at| spans[at].name == "invoke_agent")
        .unwrap();
    assert_eq!(spans[first_turn].fields["gen_ai.agent.id"], parent);
    assert_eq!(spans[first_turn].parent, Some(0), "{spans:#?}");
    assert_eq!(spans[0].name, "demo");

    // Each delegation's child turn sits under the tool call that delegated it, in the
    // parent's trace: the spawn and fork children, and the continuable child's first epoch.
    let spawn = tool_call(&spans, "subagent", 0);
    let fork = tool_call(&spans, "subagent_fork", 0);
    let continuable = tool_call(&spans, "subagent_continuable", 0);
    let spawned = delegated_turn(&spans, spawn);
    let forked = delegated_turn(&spans, fork);
    let child = delegated_turn(&spans, continuable);
    let ids = [parent.as_str(), &spawned, &forked, &child];
    for (at, id) in ids.iter().enumerate() {
        assert!(!ids[at + 1..].contains(id), "distinct agents: {ids:?}");
    }
    // One trace: the parent's later turns, woken by the continuable child's report and settled
    // notice, continue the trace of the call the message came from.
    for at in 0..spans.len() {
        assert_eq!(root_of(&spans, at), 0, "one trace: {spans:#?}");
        assert_eq!(spans[at].trace_id, spans[0].trace_id);
    }
    // The follow-up's epoch sits under the `send_message` call that sent it, and so does the
    // parent turn its settled notice woke (joined to that call by its context: the call had
    // returned); the turn the child's report woke sits under the child's `report` call.
    let followup = tool_call(&spans, "send_message", 0);
    assert_eq!(
        turns_below(&spans, followup),
        [child.clone(), parent.clone()]
    );
    let report = tool_call(&spans, "report", 0);
    assert_eq!(turns_below(&spans, report), std::slice::from_ref(&parent));
    // The follow-up and the report are events on the spans they were sent from.
    let event = |at: usize, name: &str| {
        spans[at]
            .events
            .iter()
            .find(|(event, _)| event == name)
            .map(|(_, attributes)| attributes.clone())
            .unwrap_or_else(|| panic!("no {name} event on {:?}", spans[at]))
    };
    assert_eq!(event(followup, "followup")["subagents.child"], child);
    assert_eq!(event(followup, "followup")["subagents.outcome"], "accepted");
    assert_eq!(event(report, "report")["subagents.outcome"], "accepted");
    // The first epoch settled and the follow-up found the child absent: the turn its cold
    // resume opened links to the last turn of the epoch it resumes from.
    let turn_of = |call: usize| {
        children(&spans, call)
            .into_iter()
            .find(|&at| {
                spans[at].name == "invoke_agent" && spans[at].fields["gen_ai.agent.id"] == child
            })
            .unwrap_or_else(|| panic!("the child's turn under {:?}", spans[call]))
    };
    let (first_epoch, resumed) = (turn_of(continuable), turn_of(followup));
    let before: u64 = spans[resumed].fields["subagents.turn"]
        .parse::<u64>()
        .unwrap()
        - 1;
    let last_before = (0..spans.len())
        .find(|&at| {
            spans[at].name == "invoke_agent"
                && spans[at].fields["gen_ai.agent.id"] == child
                && spans[at].fields["subagents.turn"] == before.to_string()
        })
        .unwrap();
    assert_eq!(spans[resumed].links, [spans[last_before].span_id]);
    assert!(spans[first_epoch].links.is_empty());
    // The attribute names are the conventions'; a model call records its model and usage.
    let chat = (0..spans.len())
        .find(|&at| spans[at].name == "chat")
        .unwrap();
    assert_eq!(spans[chat].fields["gen_ai.operation.name"], "chat");
    // The tour's model route has a provider and no model name.
    assert_eq!(spans[chat].fields["gen_ai.provider.name"], "tour");
    assert!(!spans[chat].fields.contains_key("gen_ai.request.model"));
    assert!(spans[chat]
        .fields
        .contains_key("gen_ai.response.finish_reasons"));
    assert_eq!(spans[spawn].fields["gen_ai.operation.name"], "execute_tool");
    assert!(spans[spawn].fields.contains_key("gen_ai.tool.call.id"));
    assert_eq!(
        spans[first_turn].fields["gen_ai.operation.name"],
        "invoke_agent"
    );
    let drain = (0..spans.len())
        .find(|&at| spans[at].name == "drain")
        .unwrap();
    assert_eq!(spans[drain].parent, Some(0));
    assert_eq!(spans[drain].fields["subagents.drain.parents"], "1");
    // No content: neither the prompt nor any answer is an attribute.
    for span in &spans {
        for value in span.fields.values() {
            assert!(!value.contains(TOUR_PROMPT), "content in {span:?}");
        }
    }
}

// Issue #19 item 1: with content opted in, a model call carries its input and output messages
// and a tool call its arguments and result, in the GenAI conventions' JSON shapes.
#[actix_rt::test]
async fn with_content_opted_in_model_and_tool_calls_carry_their_messages() {
    let capture = SpanCapture::start();
    let rt = tour_runtime_with(true).await;
    let demo = tracing::info_span!(target: "subagents::trace", "demo");
    run_tour(&rt, Duration::from_secs(30))
        .instrument(demo)
        .await
        .unwrap();
    rt.shutdown().await.unwrap();
    let spans = capture.spans();
    let json = |at: usize, field: &str| -> serde_json::Value {
        let value = spans[at]
            .fields
            .get(field)
            .unwrap_or_else(|| panic!("no {field} on {:?}", spans[at]));
        serde_json::from_str(value).unwrap_or_else(|error| panic!("{field}: {error}: {value}"))
    };
    // The parent's first model call: the tour's prompt in, the delegating calls out.
    let chat = (0..spans.len())
        .find(|&at| spans[at].name == "chat")
        .unwrap();
    let input = json(chat, "gen_ai.input.messages");
    assert_eq!(input[0]["role"], "user", "{input:#}");
    assert_eq!(input[0]["parts"][0]["type"], "text");
    assert_eq!(input[0]["parts"][0]["content"], TOUR_PROMPT);
    let output = json(chat, "gen_ai.output.messages");
    assert_eq!(output[0]["role"], "assistant", "{output:#}");
    assert_eq!(output[0]["finish_reason"], "tool_calls");
    let calls: Vec<&serde_json::Value> = output[0]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|part| part["type"] == "tool_call")
        .collect();
    assert!(!calls.is_empty(), "{output:#}");
    assert!(calls[0]["arguments"].is_object(), "{output:#}");
    // The spawn delegation's call: its arguments as the model wrote them, the child's answer
    // as its result.
    let spawn = tool_call(&spans, "subagent", 0);
    let arguments = json(spawn, "gen_ai.tool.call.arguments");
    assert!(arguments.is_object(), "{arguments}");
    assert!(!spans[spawn].fields["gen_ai.tool.call.result"].is_empty());
    // A later model call of the parent reads the tool's answer back with the role `tool`.
    let answered = (0..spans.len())
        .filter(|&at| spans[at].name == "chat")
        .map(|at| json(at, "gen_ai.input.messages"))
        .find(|input| {
            input
                .as_array()
                .unwrap()
                .iter()
                .any(|message| message["role"] == "tool")
        });
    let answered = answered.expect("a model call after a tool call");
    let response = answered
        .as_array()
        .unwrap()
        .iter()
        .find(|message| message["role"] == "tool")
        .unwrap();
    assert_eq!(response["parts"][0]["type"], "tool_call_response");
}

// Issue #19 item 1: `--trace-content` is the command line's opt-in.
#[test]
fn the_demo_exports_content_only_when_asked() {
    let collector = Collector::start();
    collector.demo(&["--trace-content"]);
    let spans = collector.spans();
    let inputs: Vec<String> = spans
        .iter()
        .filter(|span| span["name"] == "chat")
        .map(|chat| attribute(chat, "gen_ai.input.messages").expect("its input messages"))
        .collect();
    assert!(
        inputs.iter().any(|input| input.contains(TOUR_PROMPT)),
        "the parent's prompt: {inputs:#?}"
    );
}

/// Each request a [`Collector`] received: its path and its body.
type Received = std::sync::Mutex<Vec<(String, Vec<u8>)>>;

/// An OTLP/HTTP collector on 127.0.0.1 for one test: answers every request `200` and keeps
/// each request's path and body.
pub(crate) struct Collector {
    pub(crate) port: u16,
    received: std::sync::Arc<Received>,
}

impl Collector {
    pub(crate) fn start() -> Self {
        Self::answering(serve)
    }

    /// The same over TLS, with the certificate chain and key in the PEM files `certificate`
    /// and `key`; when `clients` names a PEM file of authorities, only a client presenting a
    /// certificate one of them signed is answered (mutual TLS).
    pub(crate) fn start_tls(certificate: &str, key: &str, clients: Option<&str>) -> Self {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use std::sync::Arc;
        let pems = |file: &str| {
            CertificateDer::pem_file_iter(file)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let config = match clients {
            None => config.with_no_client_auth(),
            Some(authorities) => {
                let mut roots = rustls::RootCertStore::empty();
                for authority in pems(authorities) {
                    roots.add(authority).unwrap();
                }
                config.with_client_cert_verifier(
                    rustls::server::WebPkiClientVerifier::builder_with_provider(
                        Arc::new(roots),
                        provider,
                    )
                    .build()
                    .unwrap(),
                )
            }
        };
        let config = Arc::new(
            config
                .with_single_cert(
                    pems(certificate),
                    PrivateKeyDer::from_pem_file(key).unwrap(),
                )
                .unwrap(),
        );
        // A client that does not trust the certificate, or is not trusted, ends the
        // handshake: nothing is kept from it.
        Self::answering(move |stream, kept| {
            let connection = rustls::ServerConnection::new(Arc::clone(&config));
            serve(rustls::StreamOwned::new(connection.unwrap(), stream), kept);
        })
    }

    /// A collector on a free port of 127.0.0.1, each connection answered by `answer` on a
    /// thread of its own.
    fn answering(answer: impl Fn(std::net::TcpStream, &Received) + Send + Sync + 'static) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = std::sync::Arc::default();
        let kept = std::sync::Arc::clone(&received);
        let answer = std::sync::Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (kept, answer) = (std::sync::Arc::clone(&kept), std::sync::Arc::clone(&answer));
                std::thread::spawn(move || answer(stream, &kept));
            }
        });
        Self { port, received }
    }

    /// Runs `subagents demo --store memory` with `extra` flags, exporting OTLP JSON here, and
    /// waits for it to succeed (it exports what it batched before it exits).
    pub(crate) fn demo(&self, extra: &[&str]) {
        let demo = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .args(["demo", "--store", "memory"])
            .args(extra)
            .arg("--otlp-endpoint")
            .arg(format!("http://127.0.0.1:{}", self.port))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            .output()
            .unwrap();
        assert!(demo.status.success(), "{demo:?}");
        // A collector that takes every span hears nothing about lost ones.
        let stderr = String::from_utf8_lossy(&demo.stderr);
        assert!(
            !stderr.contains("OTLP collector") && !stderr.contains("Dropp"),
            "{stderr}"
        );
    }

    /// Every span exported, decoded from OTLP's JSON encoding.
    pub(crate) fn spans(&self) -> Vec<serde_json::Value> {
        self.exported("/v1/traces", "resourceSpans", "scopeSpans", "spans")
    }

    /// Every metric exported (one entry per export of each), decoded from OTLP's JSON encoding.
    pub(crate) fn metrics(&self) -> Vec<serde_json::Value> {
        self.exported("/v1/metrics", "resourceMetrics", "scopeMetrics", "metrics")
    }

    /// The items of every export posted to `path`.
    fn exported(
        &self,
        path: &str,
        resources: &str,
        scopes: &str,
        items: &str,
    ) -> Vec<serde_json::Value> {
        let received = self.received.lock().unwrap();
        let mut exported = Vec::new();
        for (posted, body) in received.iter() {
            assert!(
                ["/v1/traces", "/v1/metrics"].contains(&posted.as_str()),
                "{posted}"
            );
            if posted != path {
                continue;
            }
            let export: serde_json::Value = serde_json::from_slice(body).unwrap();
            for resource in export[resources].as_array().unwrap() {
                for scope in resource[scopes].as_array().unwrap() {
                    exported.extend(scope[items].as_array().unwrap().iter().cloned());
                }
            }
        }
        exported
    }
}

/// Answers the HTTP/1.1 requests of one connection until it closes.
fn serve(stream: impl std::io::Read + std::io::Write, kept: &Received) {
    use std::io::{BufRead as _, Read as _};
    let mut reader = std::io::BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            if header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        kept.lock().unwrap().push((path, body));
        let writer = reader.get_mut();
        writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        writer.flush().unwrap();
    }
}

/// The exported spans named `name`, in the order they were exported.
fn named<'a>(spans: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    spans.iter().filter(|span| span["name"] == name).collect()
}

/// The value of attribute `key` of an exported span, as text.
fn attribute(span: &serde_json::Value, key: &str) -> Option<String> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|attribute| attribute["key"] == key)
        .map(|attribute| {
            let value = &attribute["value"];
            value["stringValue"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| value.to_string())
        })
}

/// The value of attribute `key` of an exported span, when it is an integer (OTLP/JSON writes
/// one as a decimal string under `intValue`).
fn integer(span: &serde_json::Value, key: &str) -> Option<i64> {
    let value = span["attributes"]
        .as_array()?
        .iter()
        .find(|attribute| attribute["key"] == key)?;
    let value = &value["value"]["intValue"];
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

// The narrated demo exported to a collector: one trace, each child's turn under the tool call
// that delegated to it, the conventions' attribute names, and no content.
#[test]
fn the_demo_exports_its_delegation_tree_as_one_trace_over_otlp() {
    let collector = Collector::start();
    collector.demo(&[]);
    // The process exported what it batched before it exited.
    let spans = collector.spans();
    let traces: std::collections::BTreeSet<&str> = spans
        .iter()
        .map(|span| span["traceId"].as_str().unwrap())
        .collect();
    assert_eq!(traces.len(), 1, "one trace: {traces:?}");
    let by_id = |id: &str| {
        spans
            .iter()
            .find(|span| span["spanId"] == id)
            .unwrap_or_else(|| panic!("no span {id}"))
    };
    let named = |name: &str| named(&spans, name);
    assert_eq!(named("subagents demo").len(), 1);
    for tool in [
        "subagent",
        "subagent_fork",
        "subagent_continuable",
        "send_message",
    ] {
        let calls = named(&format!("execute_tool {tool}"));
        assert_eq!(calls.len(), 1, "{tool}");
        assert_eq!(
            attribute(calls[0], "gen_ai.tool.name").as_deref(),
            Some(tool)
        );
        assert!(attribute(calls[0], "gen_ai.tool.call.id").is_some());
        // A child's turn (and, for the follow-up, the parent turn its notice woke) runs
        // under the call.
        let below: Vec<&serde_json::Value> = named("invoke_agent")
            .into_iter()
            .filter(|turn| turn["parentSpanId"] == calls[0]["spanId"])
            .collect();
        assert!(!below.is_empty(), "a turn under {tool}");
        // The call is in a turn of the parent agent.
        let caller = by_id(calls[0]["parentSpanId"].as_str().unwrap());
        assert_eq!(caller["name"], "invoke_agent");
        assert!(attribute(below[0], "gen_ai.agent.id") != attribute(caller, "gen_ai.agent.id"));
    }
    let chat = named("chat")[0];
    assert_eq!(
        attribute(chat, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert!(
        attribute(chat, "gen_ai.usage.input_tokens").is_some()
            || attribute(chat, "gen_ai.response.finish_reasons").is_some()
    );
    // Counts are integers, as the conventions type them, not their text.
    let counted = named("chat")
        .into_iter()
        .filter(|chat| integer(chat, "gen_ai.usage.input_tokens").is_some())
        .count();
    assert!(counted > 0, "a model call with its usage");
    for span in &spans {
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "subagents.turn",
            "subagents.step",
        ] {
            if attribute(span, key).is_some() {
                assert!(integer(span, key).is_some(), "{key} on {span}");
            }
        }
    }
    // No content: the prompt is nowhere in what was exported.
    let exported = format!("{spans:?}");
    assert!(!exported.contains(TOUR_PROMPT));
}

// Issue #19 item 2: a child in another process continues the delegating trace, through the
// W3C `traceparent` in the ACP prompt's `_meta`.
#[test]
fn a_child_in_another_process_continues_the_delegating_trace() {
    let collector = Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let config = serde_json::json!({
        "command": env!("CARGO_BIN_EXE_subagents"),
        "args": ["--store", "memory", "--otlp-endpoint", endpoint],
        // The child inherits no OTEL_* variable: the host passes what it wants.
        "env": {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "ACP_AGENT_TEXT": "traced"},
    });
    let dir = tempfile::tempdir().unwrap();
    let delegated = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "delegate",
            "--provider",
            "sdk",
            "--otlp-endpoint",
            &endpoint,
            "--cwd",
        ])
        .arg(dir.path())
        .arg("--config")
        .arg(config.to_string())
        .arg("go")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .output()
        .unwrap();
    assert!(delegated.status.success(), "{delegated:?}");
    // Both processes exported before they exited (the child first: its run was disposed).
    let spans = collector.spans();
    let named = |name: &str| named(&spans, name);
    let root = named("subagents delegate");
    assert_eq!(root.len(), 1, "{spans:#?}");
    let served = named("session/prompt");
    assert_eq!(
        served.len(),
        1,
        "the child's side of the prompt: {spans:#?}"
    );
    assert_eq!(served[0]["traceId"], root[0]["traceId"]);
    assert_eq!(served[0]["parentSpanId"], root[0]["spanId"]);
    let turn = named("invoke_agent");
    assert_eq!(turn.len(), 1, "{spans:#?}");
    assert_eq!(turn[0]["parentSpanId"], served[0]["spanId"]);
}

// Issue #19 item 2: a start placed on another cluster node and a follow-up served there
// continue the trace of the node that sent them (the delivery carries its `traceparent`).
#[test]
fn a_start_and_a_follow_up_served_by_another_node_continue_the_senders_trace() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let collector = Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let json = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
    let mut b = NodeProcess::start_with_env(&url, "b", &["--otlp-endpoint", &endpoint], &json);
    let mut a = NodeProcess::start_with_env(
        &url,
        "a",
        &[
            "--otlp-endpoint",
            &endpoint,
            "--drive",
            "1",
            "--children",
            "1",
            "--followups",
            "1",
            "--place-on",
            &b.id.clone(),
        ],
        &json,
    );
    let round = a.lines_until("round 1");
    assert_eq!(
        round
            .iter()
            .filter(|line| line.starts_with("accepted "))
            .count(),
        1,
        "{round:?}"
    );
    let child = first_child(&round);
    // The follow-up's turn has run on B (its start's turn, then this one).
    until_stored(&url, &[child], "the follow-up's turn on B", |logs| {
        completed(&logs[0]) == 2
    });
    a.tell("quit");
    assert!(a.wait().success(), "{}", a.errors());
    b.signal("-TERM");
    assert!(b.wait().success(), "{}", b.errors());
    // Each node exported what it batched before it exited.
    let spans = collector.spans();
    let named = |name: &str| named(&spans, name);
    let drive = named("subagents node drive");
    assert_eq!(drive.len(), 1, "{spans:#?}");
    for served in ["serve start", "serve follow-up"] {
        let on_b = named(served);
        assert_eq!(on_b.len(), 1, "{served}: {spans:#?}");
        assert_eq!(on_b[0]["traceId"], drive[0]["traceId"], "{served}");
        assert_eq!(on_b[0]["parentSpanId"], drive[0]["spanId"], "{served}");
    }
    // The child's first epoch runs on B under the start B served.
    let turns: Vec<&serde_json::Value> = named("invoke_agent")
        .into_iter()
        .filter(|turn| attribute(turn, "gen_ai.agent.id") == Some(child.to_string()))
        .collect();
    assert_eq!(turns.len(), 2, "the child's two turns: {spans:#?}");
    let start = &named("serve start")[0]["spanId"];
    assert!(
        turns.iter().any(|turn| turn["parentSpanId"] == *start),
        "{spans:#?}"
    );
    // Its follow-up's turn (on B, or on A after B answered that the child had settled and A
    // resumed it) is in the same trace.
    for turn in turns {
        assert_eq!(turn["traceId"], drive[0]["traceId"], "{turn:#}");
    }
    // B's settled notice reaches the root on A in that trace too, and so does the root's turn
    // it wakes.
    let notices = named("serve notice");
    assert!(!notices.is_empty(), "{spans:#?}");
    for notice in notices {
        assert_eq!(notice["traceId"], drive[0]["traceId"]);
    }
    let root = round
        .iter()
        .find_map(|line| line.strip_prefix("child "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    let woken: Vec<&serde_json::Value> = named("invoke_agent")
        .into_iter()
        .filter(|turn| attribute(turn, "gen_ai.agent.id").as_deref() == Some(root))
        .collect();
    assert!(!woken.is_empty(), "the notices woke the root: {spans:#?}");
    for turn in woken {
        assert_eq!(turn["traceId"], drive[0]["traceId"], "{turn:#}");
    }
}

/// A runtime whose first model call holds at the returned gate, and a root parent on it.
async fn held_first_turn() -> (
    subagents::Runtime,
    subagents::AgentHandle,
    subagents::testing::Gate,
) {
    let model =
        subagents::testing::ScriptedModel::repeating(subagents::testing::ScriptStep::text("ok"));
    let gate = subagents::testing::Gate::new();
    model.push(subagents::testing::ScriptStep::text("held").gated(&gate));
    let rt = crate::support::seam_runtime_on(
        subagents::Runtime::builder().model("scripted", model),
        std::sync::Arc::new(subagents::MemoryStore::new()),
    )
    .await;
    let parent = crate::support::root(&rt).await;
    (rt, parent, gate)
}

// Issue #19 item 1: an interrupt is an event on the span it was asked from, accepted or
// refused with its code.
#[actix_rt::test]
async fn an_interrupt_is_an_event_on_the_span_it_was_asked_from() {
    let capture = SpanCapture::start();
    let (rt, parent, gate) = held_first_turn().await;
    let child = crate::support::start_continuable(&rt, parent.agent(), "task")
        .await
        .child_id;
    gate.reached().await;
    let host = tracing::info_span!(target: "subagents::trace", "host");
    let asked = |parent_session_id| {
        rt.subagents()
            .interrupt(
                child,
                subagents::InterruptAuthority::User { parent_session_id },
            )
            .instrument(host.clone())
    };
    let stranger = subagents::SessionId::new();
    assert_eq!(
        asked(stranger).await.unwrap_err().code(),
        subagents::ErrorCode::Unauthorized
    );
    asked(parent.agent().id()).await.unwrap();
    drop(host);
    rt.shutdown().await.unwrap();
    let spans = capture.spans();
    let host = spans.iter().find(|span| span.name == "host").unwrap();
    let interrupts: Vec<(&str, &str)> = host
        .events
        .iter()
        .filter(|(name, _)| name == "interrupt")
        .map(|(_, attributes)| {
            assert_eq!(attributes["subagents.child"], child.to_string());
            (
                attributes["subagents.outcome"].as_str(),
                attributes.get("error.type").map_or("", String::as_str),
            )
        })
        .collect();
    assert_eq!(
        interrupts,
        [("refused", "UNAUTHORIZED"), ("accepted", "")],
        "{host:?}"
    );
}

/// Two nodes exporting to `endpoint`: B holds every turn, and A drives one root whose one
/// child is placed on B (mid-turn there once A's `round 1` line is read).
fn driving_a_child_held_on_b(url: &str, endpoint: &str) -> (NodeProcess, NodeProcess) {
    let json = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
    let b = NodeProcess::start_with_env(url, "b", &["--otlp-endpoint", endpoint, "--hold"], &json);
    let a = NodeProcess::start_with_env(
        url,
        "a",
        &[
            "--otlp-endpoint",
            endpoint,
            "--drive",
            "1",
            "--children",
            "1",
            "--place-on",
            &b.id.clone(),
        ],
        &json,
    );
    a.lines_until("round 1");
    (a, b)
}

/// Stops both nodes, then checks that B served exactly one `served` span, directly under A's
/// one `sender` span, in its trace.
fn served_under(
    mut a: NodeProcess,
    mut b: NodeProcess,
    collector: &Collector,
    sender: &str,
    served: &str,
) {
    a.tell("quit");
    assert!(a.wait().success(), "{}", a.errors());
    b.signal("-TERM");
    assert!(b.wait().success(), "{}", b.errors());
    let spans = collector.spans();
    let named = |name: &str| named(&spans, name);
    let (sent, served) = (named(sender), named(served));
    assert_eq!(sent.len(), 1, "{spans:#?}");
    assert_eq!(served.len(), 1, "{spans:#?}");
    assert_eq!(served[0]["traceId"], sent[0]["traceId"]);
    assert_eq!(served[0]["parentSpanId"], sent[0]["spanId"]);
}

// Issue #19 item 2: an interrupt of a child on another node is served there in the trace of
// the span it was asked from.
#[test]
fn an_interrupt_served_by_another_node_continues_the_senders_trace() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let collector = Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let (mut a, b) = driving_a_child_held_on_b(&url, &endpoint);
    a.tell("interrupt");
    let interrupted = a.lines_until("interrupted 1");
    assert!(
        !interrupted
            .iter()
            .any(|line| line.starts_with("interrupt-refused")),
        "{interrupted:?}"
    );
    served_under(a, b, &collector, "subagents node drive", "serve interrupt");
}

// Issue #19 item 1: the span a continuable start was called from ends when its caller is done
// with it, while the epoch it opened runs on (an epoch keeps only its context; holding the
// span kept it open until the epoch settled).
#[actix_rt::test]
async fn a_start_calls_span_ends_while_the_epoch_it_opened_runs_on() {
    let capture = SpanCapture::start();
    let (rt, parent, gate) = held_first_turn().await;
    let host = tracing::info_span!(target: "subagents::trace", "host");
    let child = crate::support::start_continuable(&rt, parent.agent(), "task")
        .instrument(host.clone())
        .await
        .child_id;
    drop(host);
    gate.reached().await;
    let spans = capture.spans();
    let host = spans
        .iter()
        .find(|span| span.name == "host")
        .unwrap_or_else(|| panic!("the host's span ended: {spans:#?}"));
    // The held turn is still open: nothing of it is exported yet.
    assert!(!spans
        .iter()
        .any(|span| span.fields.get("gen_ai.agent.id") == Some(&child.to_string())));
    gate.release();
    rt.shutdown().await.unwrap();
    let spans = capture.spans();
    let turn = spans
        .iter()
        .find(|span| {
            span.name == "invoke_agent" && span.fields["gen_ai.agent.id"] == child.to_string()
        })
        .unwrap();
    assert_eq!(turn.trace_id, host.trace_id);
    assert!(host.end <= turn.end);
}

// Issue #19 item 2: a drain's releases of children on another node are served there in the
// drain's trace.
#[test]
fn a_drains_release_served_by_another_node_continues_the_drains_trace() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let collector = Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let (mut a, b) = driving_a_child_held_on_b(&url, &endpoint);
    a.tell("drain");
    let drained = a.lines_until("drained 1");
    assert!(
        !drained.iter().any(|line| line.starts_with("drain-failed")),
        "{drained:?}"
    );
    served_under(a, b, &collector, "drain", "serve release");
}

// Issue #19 item 3: OTLP goes over HTTP. A protocol this build does not speak (`grpc`, or a
// misspelling) is refused by name before the command runs; before, the exporter quietly sent
// HTTP to the port the user had chosen for gRPC.
#[test]
fn an_otlp_protocol_other_than_http_is_refused_before_the_command_runs() {
    let collector = Collector::start();
    for (variable, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobof"),
    ] {
        let demo = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .args(["demo", "--store", "memory", "--otlp-endpoint"])
            .arg(format!("http://127.0.0.1:{}", collector.port))
            .env(variable, value)
            .output()
            .unwrap();
        assert_eq!(demo.status.code(), Some(2), "{demo:?}");
        let stderr = String::from_utf8_lossy(&demo.stderr);
        assert!(stderr.contains("INVALID_CONFIG"), "{stderr}");
        assert!(stderr.contains(&format!("{variable}={value}")), "{stderr}");
        assert!(demo.stdout.is_empty(), "the demo did not run: {demo:?}");
    }
    assert!(collector.spans().is_empty() && collector.metrics().is_empty());
}

// Issue #19 item 3: spans that do not reach the collector are said, not lost in silence.
// Before, a run pointed at a port nothing listens on printed nothing, and a person looked at an
// empty trace viewer. Now the collector is named once (not once a batch) and the run goes on
// and passes; spans dropped from a full export queue (one span here, while the exporter
// retries the first batch) are counted by the SDK's own warning.
#[test]
fn spans_that_do_not_reach_the_collector_are_said_once_and_the_run_goes_on() {
    // A port nothing listens on: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let collector = format!("http://127.0.0.1:{closed}");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args("load --store memory --roots 1 --children 20 --otlp-endpoint".split(' '))
        .arg(&collector)
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "1")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("verification passed"));
    let stderr = String::from_utf8_lossy(&run.stderr);
    let told: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("spans are not reaching the OTLP collector"))
        .collect();
    assert_eq!(told.len(), 1, "told once: {stderr}");
    assert!(
        told[0].contains(&format!("{collector}/v1/traces")),
        "{stderr}"
    );
    assert!(
        stderr.contains("BatchSpanProcessor.SpanDroppingStarted"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("BatchSpanProcessor.ExportError"),
        "{stderr}"
    );
}

// Issue #19 item 3: at exit the batch processor exports every batch it still holds within a
// five-second deadline, and the OTLP exporter retries each failed batch with backoff. Before,
// the main job pointed at a closed port queued a few thousand spans, spent the whole deadline
// retrying them batch after batch, and exited without ever saying how many spans were lost.
// Now a collector that failed the last export is not tried again once the exit has begun: the
// loss is counted and said.
#[test]
fn a_run_whose_collector_is_gone_says_at_exit_how_many_spans_it_lost() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args("load --store memory --otlp-endpoint".split(' '))
        .arg(format!("http://127.0.0.1:{closed}"))
        .env_remove("RUST_LOG")
        .env_remove("OTEL_BSP_MAX_QUEUE_SIZE")
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !stderr.contains("BatchSpanProcessor.Shutdown.Timeout"),
        "the exit waited out the deadline: {stderr}"
    );
    let said = stderr
        .lines()
        .find(|line| line.contains("spans were not exported to the OTLP collector"))
        .unwrap_or_else(|| panic!("the loss is said: {stderr}"));
    let lost: u64 = said
        .split_once("lost=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("a count: {said}"));
    // The main job's thousand children record a span for each turn, model call and tool call.
    assert!(lost > 1_000, "{said}");
    assert!(said.contains("exported=0"), "{said}");
}

// Issue #19 item 3: an `https://` collector whose certificate a private authority signed is
// trusted through `OTEL_EXPORTER_OTLP_CERTIFICATE`, and only then; one that asks for a client
// certificate gets the one `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `…_CLIENT_KEY` name; a
// file holding nothing of its kind, or half a client identity, is refused by name before the
// command runs.
#[test]
fn the_demo_exports_over_tls_to_a_collector_whose_authority_it_is_told_to_trust() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/otlp_tls");
    let file = |name: &str| format!("{fixtures}/{name}");
    let demo = |collector: &Collector, files: &[(&str, &str)]| {
        let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        demo.args(["demo", "--store", "memory", "--otlp-endpoint"])
            .arg(format!("https://127.0.0.1:{}", collector.port))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
        for (variable, name) in files {
            demo.env(variable, file(name));
        }
        demo.output().unwrap()
    };
    let exported = |collector: &Collector| {
        collector
            .spans()
            .iter()
            .any(|span| span["name"] == "subagents demo")
    };
    let collector = |clients: Option<&str>| {
        Collector::start_tls(
            &file("server.pem"),
            &file("server-key.pem"),
            clients.map(file).as_deref(),
        )
    };
    let authority = ("OTEL_EXPORTER_OTLP_CERTIFICATE", "ca.pem");
    let identity = [
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "client.pem"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "client-key.pem"),
    ];

    let trusted = collector(None);
    let run = demo(&trusted, &[authority]);
    assert!(run.status.success(), "{run:?}");
    assert!(exported(&trusted), "the demo's trace arrived over TLS");
    assert!(!trusted.metrics().is_empty());

    // Without the authority the collector's certificate is not trusted: the demo runs, and
    // nothing is exported.
    let untrusted = collector(None);
    let run = demo(&untrusted, &[]);
    assert!(run.status.success(), "{run:?}");
    assert!(untrusted.spans().is_empty() && untrusted.metrics().is_empty());

    // A collector that asks for a client certificate gets the one named, and nothing from a
    // client without one.
    let mutual = collector(Some("ca.pem"));
    let run = demo(&mutual, &[authority, identity[0], identity[1]]);
    assert!(run.status.success(), "{run:?}");
    assert!(
        exported(&mutual),
        "the demo's trace arrived over mutual TLS"
    );
    let anonymous = collector(Some("ca.pem"));
    let run = demo(&anonymous, &[authority]);
    assert!(run.status.success(), "{run:?}");
    assert!(anonymous.spans().is_empty());

    for (files, says) in [
        (
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", "server-key.pem")],
            "OTEL_EXPORTER_OTLP_CERTIFICATE=",
        ),
        (
            vec![authority, identity[0]],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE is set alone",
        ),
        (
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", "missing.pem")],
            "missing.pem",
        ),
    ] {
        let refused = demo(&untrusted, &files);
        assert_eq!(refused.status.code(), Some(2), "{refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("INVALID_CONFIG"), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(
            refused.stdout.is_empty(),
            "the demo did not run: {refused:?}"
        );
    }
}

// Issue #19 item 1: a cold resume in a runtime other than the one that saw the epoch end (a
// restarted process, another node) links back to the epoch it resumes from: the link is the
// `traceparent` stored with the turn that ended it. Before, it lived in the memory of the
// runtime that saw the epoch settle, and this resume had no link.
#[actix_rt::test]
async fn a_cold_resume_after_a_restart_links_back_to_the_epoch_it_resumes_from() {
    use std::sync::Arc;
    use subagents::testing::{ScriptStep, ScriptedModel};
    use subagents::{EventScope, MemoryStore, ResumeAgent, Runtime, SessionPersistence};

    use crate::support::{
        followup_child, released, root, seam_runtime_on, settled, start_continuable, SeamRecorder,
    };

    async fn runtime_on(store: Arc<dyn SessionPersistence>) -> Runtime {
        let model = ScriptedModel::repeating(ScriptStep::text("ok"));
        seam_runtime_on(Runtime::builder().model("scripted", model), store).await
    }

    let capture = SpanCapture::start();
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let first = runtime_on(Arc::clone(&store)).await;
    let parent = root(&first).await;
    let parent_id = parent.agent().id();
    let recorder = SeamRecorder::new(&first, EventScope::Key(parent_id));
    let child = start_continuable(&first, parent.agent(), "child task")
        .await
        .child_id;
    settled(&recorder, child, 1).await;
    released(&first, child).await;
    parent.dispose().await.unwrap();
    first.shutdown().await.unwrap();

    let second = runtime_on(Arc::clone(&store)).await;
    let parent = second
        .agents()
        .resume(ResumeAgent::new(parent_id))
        .await
        .unwrap();
    let recorder = SeamRecorder::new(&second, EventScope::Key(parent_id));
    followup_child(&second, parent.agent(), child, "continue")
        .await
        .unwrap();
    settled(&recorder, child, 1).await;
    second.shutdown().await.unwrap();

    let spans = capture.spans();
    let turn = |number: &str| {
        spans
            .iter()
            .find(|span| {
                span.name == "invoke_agent"
                    && span.fields["gen_ai.agent.id"] == child.to_string()
                    && span.fields["subagents.turn"] == number
            })
            .unwrap_or_else(|| panic!("the child's turn {number}: {spans:#?}"))
    };
    let (before, resumed) = (turn("1"), turn("2"));
    assert_eq!(resumed.links, [before.span_id]);
    assert!(before.links.is_empty());
    // The stored link is the ended turn's own context.
    let stored = store.read_from(child, 0).await.unwrap();
    let traceparents: Vec<String> = stored
        .iter()
        .filter_map(|event| match &event.kind {
            subagents::EventKind::TurnEnd { traceparent, .. } => traceparent.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(traceparents.len(), 2, "each turn keeps its traceparent");
    assert!(traceparents[0].contains(&before.span_id.to_string()));
}
