//! Three `subagents node` processes on one PostgreSQL: a forest grown on one node with its
//! children placed on the other two, follow-ups crossing nodes in FIFO order, one node
//! SIGKILLed mid-turn, and its children resumed on a survivor once its membership expired.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use subagents::store::PostgresStore;
use subagents::{EventKind, SessionId, SessionPersistence, TurnEndReason};

use crate::support::postgres::{postgres_or_skip, raw_client};
use crate::support::{delivered, turn_ends};

/// A running `subagents node`.
pub(crate) struct NodeProcess {
    process: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    pub(crate) id: String,
    /// What the node printed for a person.
    stderr: tempfile::NamedTempFile,
}

impl NodeProcess {
    /// Starts a node named `name` on `url` with `extra` flags (a node time-to-live of 1.5 s
    /// unless they set one) and waits until it serves.
    pub(crate) fn start(url: &str, name: &str, extra: &[&str]) -> Self {
        Self::start_with_env(url, name, extra, &[])
    }

    /// [`NodeProcess::start`] with `env` set in the node's environment.
    pub(crate) fn start_with_env(
        url: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        // With NODE_LOGS=<dir>, each process's stderr is kept there (`<name>-…`): with
        // RUST_LOG, what a failing schedule's nodes did.
        let stderr = match std::env::var_os("NODE_LOGS") {
            Some(dir) => tempfile::Builder::new()
                .prefix(&format!("{name}-"))
                .disable_cleanup(true)
                .tempfile_in(dir)
                .unwrap(),
            None => tempfile::NamedTempFile::new().unwrap(),
        };
        // With NODE_WORKERS=<n>, every node spreads its agents over n threads.
        let workers: Vec<String> = std::env::var("NODE_WORKERS")
            .ok()
            .map(|workers| vec!["--workers".to_owned(), workers])
            .unwrap_or_default();
        let mut process = Command::new(env!("CARGO_BIN_EXE_subagents"))
            .args(["node", "--store", url, "--name", name])
            .args(&workers)
            .envs(env.iter().copied())
            .args(if extra.contains(&"--node-ttl-ms") {
                &[][..]
            } else {
                &["--node-ttl-ms", "1500"][..]
            })
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .expect("the node binary starts");
        let stdout = process.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = process.stdin.take();
        let mut node = Self {
            process,
            stdin,
            lines,
            id: String::new(),
            stderr,
        };
        let line = node.next_line();
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("node"), "{line}");
        node.id = words.next().expect("the node's id").to_owned();
        node
    }

    /// The node's next line (safety net: 60 s). A node that ended without it fails the test
    /// with what it wrote to stderr.
    pub(crate) fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|error| {
                panic!(
                    "the node printed its next line (safety net: 60 s): {error}; its stderr:\n{}",
                    self.errors()
                )
            })
    }

    /// Every line up to and including `last`.
    pub(crate) fn lines_until(&self, last: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = self.next_line();
            let done = line == last;
            seen.push(line);
            if done {
                return seen;
            }
        }
    }

    /// Every line the node printed and no one read yet, once it has ended (its output closes
    /// when it dies).
    pub(crate) fn last_lines(&self) -> Vec<String> {
        self.lines.iter().collect()
    }

    /// Writes a command line to the driving node's stdin.
    pub(crate) fn tell(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("the node's stdin is open");
        writeln!(stdin, "{command}").expect("the node reads its stdin");
    }

    /// What the node printed to stderr so far.
    pub(crate) fn errors(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap()
    }

    /// Waits for the process to end; its exit status.
    pub(crate) fn wait(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.process.wait().expect("the node is reaped")
    }

    /// The node's next line, if one comes before `deadline`.
    pub(crate) fn line_within(&self, deadline: Instant) -> Option<String> {
        self.lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()
    }

    /// Waits (bounded) for the process to end: its exit status, or `None` if it still runs.
    pub(crate) fn wait_within(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        exited_within(&mut self.process, bound)
    }

    /// Sends `signal`, whether or not the process still runs.
    pub(crate) fn signal_quietly(&self, signal: &str) {
        let pid = self.process.id().to_string();
        let _ = Command::new("kill")
            .args([signal, &pid])
            .stderr(Stdio::null())
            .status();
    }

    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.process.id().to_string();
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
    }
}

/// Waits (bounded) for `process` to end: the kernel announces its exit on a pidfd, waited for
/// with what is left of `bound` as the timeout. Its exit status, or `None` if it still runs.
pub(crate) fn exited_within(
    process: &mut Child,
    bound: Duration,
) -> Option<std::process::ExitStatus> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    let deadline = Instant::now() + bound;
    // Reaped already (a status std keeps): no pidfd can be opened for it any more.
    if let Some(status) = process.try_wait().expect("the process is polled") {
        return Some(status);
    }
    let exit = pidfd_open(Pid::from_child(process), PidfdFlags::empty()).expect("a pidfd");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return process.try_wait().expect("the process is polled");
        }
        let timeout = Timespec::try_from(left).expect("a bound a timespec holds");
        let mut announced = [PollFd::new(&exit, PollFlags::IN)];
        match poll(&mut announced, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(error) => panic!("waiting on the process's pidfd: {error}"),
        }
        if let Some(status) = process.try_wait().expect("the process is polled") {
            return Some(status);
        }
    }
}

/// The store as the nodes see it, read from this process.
pub(crate) fn read(url: &str, child: SessionId) -> Vec<subagents::SessionEvent> {
    actix::System::new().block_on(async {
        let store = PostgresStore::connect_existing(url).await.unwrap();
        store
            .read_from(child, 0)
            .await
            .unwrap()
            .iter()
            .map(|event| (**event).clone())
            .collect()
    })
}

/// Polls another process's progress in the store until `holds` (bounded: the other process
/// announces nothing this test can wait on).
pub(crate) fn until_stored(
    url: &str,
    children: &[SessionId],
    what: &str,
    holds: impl Fn(&[Vec<subagents::SessionEvent>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs: Vec<_> = children.iter().map(|child| read(url, *child)).collect();
        if holds(&logs) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `events` ran one turn at a time, numbered in order: a log two residents wrote at
/// once would interleave turns.
pub(crate) fn one_turn_at_a_time(events: &[subagents::SessionEvent]) -> bool {
    let mut open = None;
    let mut last = 0;
    for event in events {
        match &event.kind {
            EventKind::TurnStart { turn } => {
                if open.is_some() || *turn <= last {
                    return false;
                }
                open = Some(*turn);
                last = *turn;
            }
            EventKind::TurnEnd { turn, .. } => {
                if open != Some(*turn) {
                    return false;
                }
                open = None;
            }
            _ => {}
        }
    }
    true
}

/// The first child a driving node placed, from its `child <root> <child> <node>` lines.
pub(crate) fn first_child(lines: &[String]) -> SessionId {
    lines
        .iter()
        .find_map(|line| line.strip_prefix("child "))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .expect("a placed child")
        .parse()
        .expect("a session id")
}

/// How many of `events`' turns completed.
pub(crate) fn completed(events: &[subagents::SessionEvent]) -> usize {
    turn_ends(events)
        .iter()
        .filter(|reason| **reason == TurnEndReason::Completed)
        .count()
}

/// The one value `sql` selects from the cluster's database.
fn scalar<T: for<'a> tokio_postgres::types::FromSql<'a>>(url: &str, sql: &str) -> T {
    actix::System::new().block_on(async {
        let client = raw_client(url).await;
        client.query_one(sql, &[]).await.unwrap().get(0)
    })
}

#[test]
fn a_forest_spread_over_three_nodes_survives_one_killed_mid_turn() {
    let url = postgres_or_skip!().fresh_database();
    let b = NodeProcess::start(&url, "b", &[]);
    let c = NodeProcess::start(&url, "c", &["--hold"]);
    let place_on = format!("{},{}", b.id, c.id);
    let mut a = NodeProcess::start(
        &url,
        "a",
        &[
            "--drive",
            "2",
            "--children",
            "2",
            "--followups",
            "2",
            "--place-on",
            &place_on,
        ],
    );
    let first = a.lines_until("round 1");
    let placed: Vec<(SessionId, String)> = first
        .iter()
        .filter_map(|line| line.strip_prefix("child "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            (words[1].parse().unwrap(), words[2].to_owned())
        })
        .collect();
    assert_eq!(placed.len(), 4, "{first:?}");
    let on = |node: &str| -> Vec<SessionId> {
        placed
            .iter()
            .filter(|(_, at)| at == node)
            .map(|(child, _)| *child)
            .collect()
    };
    let (on_b, on_c) = (on(&b.id), on(&c.id));
    assert_eq!((on_b.len(), on_c.len()), (2, 2), "placed round-robin");
    assert_eq!(
        first
            .iter()
            .filter(|line| line.starts_with("accepted "))
            .count(),
        8,
        "two follow-ups to each child, each accepted once"
    );
    // B's children finish their three turns there; C's hold their first turn, with their
    // two follow-ups durably accepted behind it.
    until_stored(&url, &on_b, "B's children to finish", |logs| {
        logs.iter().all(|events| completed(events) == 3)
    });
    until_stored(&url, &on_c, "C's children to be mid-turn", |logs| {
        logs.iter().all(|events| {
            !delivered(events).is_empty()
                && events
                    .iter()
                    .any(|event| matches!(event.kind, EventKind::TurnStart { .. }))
        })
    });
    // Each of C's children is leased by C alone (B's settled and released theirs).
    for child in &on_c {
        let holder: String = scalar(
            &url,
            &format!("SELECT holder::text FROM subagents_leases WHERE session = '{child}'"),
        );
        assert_eq!(holder, c.id, "{child} is resident on C alone");
    }
    for child in &on_b {
        let leases: i64 = scalar(
            &url,
            &format!("SELECT count(*) FROM subagents_leases WHERE session = '{child}'"),
        );
        assert_eq!(leases, 0, "{child} settled on B and was released");
    }
    // C dies mid-turn. The next round reaches C's children only once C's membership has
    // expired: they resume on A (the caller's node) with everything C flushed.
    let mut c = c;
    c.process.kill().expect("SIGKILL delivered");
    c.process.wait().expect("the killed node is reaped");
    a.tell("round");
    let second = a.lines_until("round 2");
    assert_eq!(
        second
            .iter()
            .filter(|line| line.starts_with("accepted "))
            .count(),
        8,
        "{second:?}"
    );
    let all: Vec<SessionId> = placed.iter().map(|(child, _)| *child).collect();
    until_stored(&url, &all, "every child to finish round 2", |logs| {
        logs.iter()
            .all(|events| delivered(events).len() == 5 && turn_ends(events).len() == 5)
    });
    a.tell("quit");
    let left = a.lines_until(&format!("left {}", a.id));
    assert!(left.iter().all(|line| !line.starts_with("accepted")));
    assert!(
        a.wait().success(),
        "the driving node leaves cleanly: {}",
        a.errors()
    );
    let mut b = b;
    b.signal("-TERM");
    assert!(b.wait().success(), "node B leaves cleanly on SIGTERM");
    for (child, node) in &placed {
        let events = read(&url, *child);
        let label = events
            .iter()
            .find_map(|event| match &event.kind {
                EventKind::UserMessage(message) => Some(message.text()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            delivered(&events),
            [
                label.as_str(),
                "round 1 message 1",
                "round 1 message 2",
                "round 2 message 1",
                "round 2 message 2"
            ],
            "each follow-up delivered once, in order ({child})"
        );
        assert!(
            one_turn_at_a_time(&events),
            "one resident at a time ({child})"
        );
        let ends = turn_ends(&events);
        if *node == c.id {
            // The turn C died in was repaired; A ran the rest.
            assert_ne!(ends[0], TurnEndReason::Completed, "{ends:?}");
            assert_eq!(completed(&events), 4, "{ends:?}");
        } else {
            assert_eq!(completed(&events), 5, "{ends:?}");
        }
    }
    // Every lease released: the survivors left cleanly, and A took over and released C's.
    assert_eq!(
        scalar::<i64>(&url, "SELECT count(*) FROM subagents_leases"),
        0
    );
    // C's row stays, expired: the record that it died.
    assert_eq!(
        scalar::<i64>(
            &url,
            "SELECT count(*) FROM subagents_nodes WHERE expires_at > now()"
        ),
        0
    );
    assert_eq!(
        scalar::<i64>(&url, "SELECT count(*) FROM subagents_nodes"),
        1
    );
}

#[test]
fn a_paused_node_that_wakes_past_its_membership_is_fenced_out_and_faults() {
    let url = postgres_or_skip!().fresh_database();
    // C's model answers slowly: the child is mid-call when C is paused.
    let mut c = NodeProcess::start(&url, "c", &["--latency-ms", "3000"]);
    let place_on = c.id.clone();
    let mut a = NodeProcess::start(
        &url,
        "a",
        &[
            "--drive",
            "1",
            "--children",
            "1",
            "--followups",
            "1",
            "--place-on",
            &place_on,
        ],
    );
    let child = first_child(&a.lines_until("round 1"));
    until_stored(&url, &[child], "the child's first turn on C", |logs| {
        logs[0]
            .iter()
            .any(|event| matches!(event.kind, EventKind::TurnStart { .. }))
    });
    c.signal("-STOP");
    // Past C's membership, A's next follow-up takes the child over and runs it to the end.
    a.tell("round");
    a.lines_until("round 2");
    until_stored(&url, &[child], "the child to finish on A", |logs| {
        completed(&logs[0]) == 2
    });
    let taken_over = read(&url, child).len();
    // C wakes: its model call answers, its write is refused, and it learns it was declared
    // dead; it exits with the error, having landed nothing.
    c.signal("-CONT");
    let status = c.wait();
    assert_eq!(status.code(), Some(2), "{}", c.errors());
    let said = c.errors();
    assert!(said.contains("(code LEASE_LOST)"), "{said}");
    // Its write was attempted and refused by the newer epoch (logged as the session faulted).
    assert!(said.contains("fenced by a newer one"), "{said}");
    let events = read(&url, child);
    assert_eq!(
        events.len(),
        taken_over,
        "nothing of C's after A took the child over"
    );
    assert!(
        events.iter().all(|event| match &event.kind {
            EventKind::AssistantMessage { message, .. } => !message.text().contains("c answered"),
            _ => true,
        }),
        "C's answer never landed"
    );
    assert_eq!(
        delivered(&events),
        ["task 0.0", "round 1 message 1", "round 2 message 1"]
    );
    assert!(one_turn_at_a_time(&events));
    a.tell("quit");
    assert!(a.wait().success(), "{}", a.errors());
}

// A reporting node's turns report before they answer, which a held turn never gets to: the
// two flags are refused together, by name, before the node connects anywhere.
#[test]
fn a_node_refuses_to_hold_turns_that_must_report() {
    let output = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["node", "--store", "postgres://nowhere.invalid/db"])
        .args(["--hold", "--report"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--hold and --report"), "{stderr}");
}

// A node whose output cannot be written says that, not a store failure, and leaves.
#[test]
fn a_node_that_cannot_write_its_output_says_so() {
    let url = postgres_or_skip!().fresh_database();
    let output = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["node", "--store", &url, "--name", "full"])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    crate::support::assert_output_failure_said(&output);
}

#[test]
fn a_parent_hears_that_its_childs_node_stopped() {
    let url = postgres_or_skip!().fresh_database();
    let mut c = NodeProcess::start(&url, "c", &["--hold"]);
    let place_on = c.id.clone();
    let mut a = NodeProcess::start(
        &url,
        "a",
        &["--drive", "1", "--children", "2", "--place-on", &place_on],
    );
    let first = a.lines_until("round 1");
    let placed: Vec<(SessionId, SessionId)> = first
        .iter()
        .filter_map(|line| line.strip_prefix("child "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            (words[0].parse().unwrap(), words[1].parse().unwrap())
        })
        .collect();
    let root = placed[0].0;
    let children: Vec<SessionId> = placed.iter().map(|(_, child)| *child).collect();
    until_stored(&url, &children, "the children mid-turn on C", |logs| {
        logs.iter().all(|events| {
            events
                .iter()
                .any(|event| matches!(event.kind, EventKind::TurnStart { .. }))
        })
    });
    c.process.kill().expect("SIGKILL delivered");
    c.process.wait().expect("the killed node is reaped");
    // No notice can come from C: once its membership expired, the root's node tells the root.
    until_stored(&url, &[root], "the root to hear of both children", |logs| {
        let heard: Vec<String> = crate::support::delivered(&logs[0]);
        children.iter().all(|child| {
            heard
                .iter()
                .any(|text| text.contains(&child.to_string()) && text.contains("(node-stopped)"))
        })
    });
    // A blank line asks for nothing (it used to be refused as an unknown command).
    a.tell("");
    a.tell("quit");
    assert!(a.wait().success(), "{}", a.errors());
}

// A node whose shutdown waits on what does not answer (here the store: every connection's
// server process stopped, as a paused machine's are) stops at a second SIGTERM, saying so,
// instead of ignoring it for as long as its calls' deadlines add up. Before, the first
// signal's handler swallowed every later one.
#[test]
fn a_second_signal_stops_a_node_whose_shutdown_waits() {
    let url = postgres_or_skip!().fresh_database();
    let mut a = NodeProcess::start(&url, "a", &["--hold", "--drive", "1", "--children", "1"]);
    let child = first_child(&a.lines_until("round 1"));
    until_stored(&url, &[child], "the child mid-turn", |logs| {
        logs[0]
            .iter()
            .any(|event| matches!(event.kind, EventKind::TurnStart { .. }))
    });
    let runtime = crate::store::store_runtime();
    let _entered = runtime.enter();
    let stopped = crate::store_postgres::stop_client_backends(&url);
    a.signal("-TERM");
    let leaving = format!("leaving {}", a.id);
    a.lines_until(&leaving);
    // Its shutdown now waits on the store (a minute a call); a second signal ends it.
    a.signal("-TERM");
    let status = a
        .wait_within(Duration::from_secs(10))
        .expect("the node stopped at the second signal");
    assert_eq!(status.code(), Some(2), "{}", a.errors());
    let said = a.errors();
    assert!(
        said.contains("(code CANCELLED)") && said.contains("second signal"),
        "{said}"
    );
    drop(stopped);
}

// A node whose output is gone by the time it leaves (whoever read it stopped) still releases
// what it holds and removes its membership: saying `leaving` is not a step the release
// depends on. (A closed output ends a command quietly, as for any reader that stopped.)
#[test]
fn a_node_whose_output_closed_still_leaves_cleanly() {
    let url = postgres_or_skip!().fresh_database();
    let mut node = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["node", "--store", &url, "--name", "quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("node "), "{first}");
    assert_eq!(
        scalar::<i64>(&url, "SELECT count(*) FROM subagents_nodes"),
        1
    );
    drop(lines);
    let pid = node.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let status = exited_within(&mut node, Duration::from_secs(30)).expect("the node left");
    assert!(status.success(), "{status}");
    assert_eq!(
        scalar::<i64>(&url, "SELECT count(*) FROM subagents_nodes"),
        0,
        "its membership was removed: it left"
    );
}
