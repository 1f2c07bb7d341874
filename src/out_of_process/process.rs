//! Provides [`ChildProcess`]: one external child started in a process group of its own, so the
//! whole tree it starts can be signalled at once, with the terminate ladder (SIGTERM, grace,
//! SIGKILL) and a reaped exit. No process outlives its handle: dropping a handle whose tree is
//! still alive kills the tree.
//!
//! The leader is observed exiting without being reaped (a pidfd on Linux, `waitid(WNOWAIT)`),
//! and reaped only once its whole group is gone. Until then its pid, which is also the group
//! id, cannot be reused, so signalling the group can never reach an unrelated process.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{kill_process_group, Pid, Signal, WaitIdOptions};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::watch;

use crate::error::{ErrorCode, Result, SubagentError};

/// Where the child's stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StderrMode {
    /// The child writes to this process's stderr; nothing parses it.
    Inherit,
    /// A pipe the provider reads (and forwards).
    Piped,
}

/// How to launch one child.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// The executable and its arguments.
    pub argv: Vec<OsString>,
    /// The child's working directory.
    pub cwd: PathBuf,
    /// The child's whole environment (nothing else is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Where the child's stderr goes; stdin and stdout are always piped.
    pub stderr: StderrMode,
    /// How long the tree has between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// How a child ended: its exit code, or the signal that killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitOutcome {
    /// The exit code, when the child exited.
    pub code: Option<i32>,
    /// The signal number, when a signal ended the child.
    pub signal: Option<i32>,
}

/// The conventional name of a signal number (`SIGKILL`), or the number itself.
fn signal_name(signal: i32) -> String {
    const NAMES: [(i32, &str); 12] = [
        (1, "SIGHUP"),
        (2, "SIGINT"),
        (3, "SIGQUIT"),
        (4, "SIGILL"),
        (6, "SIGABRT"),
        (7, "SIGBUS"),
        (8, "SIGFPE"),
        (9, "SIGKILL"),
        (11, "SIGSEGV"),
        (13, "SIGPIPE"),
        (14, "SIGALRM"),
        (15, "SIGTERM"),
    ];
    NAMES
        .iter()
        .find(|(number, _)| *number == signal)
        .map_or_else(|| signal.to_string(), |(_, name)| (*name).to_owned())
}

/// `exit code: N`, `signal: SIGKILL`, both joined by `; `, or nothing when neither was observed.
impl fmt::Display for ExitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), Some(signal)) => {
                write!(f, "exit code: {code}; signal: {}", signal_name(signal))
            }
            (Some(code), None) => write!(f, "exit code: {code}"),
            (None, Some(signal)) => write!(f, "signal: {}", signal_name(signal)),
            (None, None) => Ok(()),
        }
    }
}

/// One live external child and the process group it leads.
///
/// [`ChildProcess::terminate`] ends every process of the group, including grandchildren that
/// outlived the leader; [`ChildProcess::wait_for_tree_exit`] reaps the leader once the whole
/// group is gone.
pub struct ChildProcess {
    pid: u32,
    group: Pid,
    grace: Duration,
    exit: watch::Receiver<Option<ExitOutcome>>,
    pipes: Mutex<Pipes>,
    /// The leader, exited or not, until it is reaped: holding it unreaped pins the group id.
    leader: Arc<Mutex<Option<std::process::Child>>>,
    tree_gone: AtomicBool,
    /// Whether a process of the group is alive ([`group_alive`]; a test's stand-in for a
    /// member that outlives SIGKILL).
    alive: fn(Pid) -> bool,
    /// How long the tree has to be gone once SIGKILLed ([`KILLED_WITHIN`]).
    killed_within: Duration,
}

/// How long a tree SIGKILLed has to be gone before the ladder gives up on it: a process in
/// uninterruptible sleep (a hung network filesystem), or one not ours to signal, outlives
/// SIGKILL, and must not hold a disposal or a shutdown forever.
pub const KILLED_WITHIN: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Pipes {
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
}

impl fmt::Debug for ChildProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildProcess")
            .field("pid", &self.pid)
            .field("exit", &*self.exit.borrow())
            .finish_non_exhaustive()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ChildProcess {
    /// Starts the child in a new process group.
    ///
    /// # Errors
    /// `CHILD_START_FAILED` when the executable cannot be started (missing, not executable, bad
    /// cwd), the OS error as the cause; `NO_ACTOR_SYSTEM` outside the actor system (the exit
    /// watch is a task).
    pub fn spawn(spec: &ProcessSpec) -> Result<Self> {
        // The exit watch is a task: without a runtime nothing could ever see the child exit.
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            SubagentError::new(
                ErrorCode::NoActorSystem,
                "a child process must be started inside the actor system",
            )
        })?;
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(SubagentError::new(
                ErrorCode::ChildStartFailed,
                "the child's command line is empty",
            ));
        };
        let program_name = program.to_string_lossy().into_owned();
        let start_failed = |error: std::io::Error| {
            SubagentError::new(
                ErrorCode::ChildStartFailed,
                format!("could not start {program_name}"),
            )
            .with_source(error)
        };
        let mut child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(program)
                .args(args)
                .current_dir(&spec.cwd)
                .env_clear()
                .envs(spec.env.iter().map(|(name, value)| (name, value)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(match spec.stderr {
                    StderrMode::Inherit => Stdio::inherit(),
                    StderrMode::Piped => Stdio::piped(),
                })
                .process_group(0)
                .spawn()
                .map_err(start_failed)?
        };
        let pid = child.id();
        // From here on a failure must not leave the started child behind.
        let adopt = |child: &mut std::process::Child| -> std::io::Result<Pipes> {
            Ok(Pipes {
                stdin: child.stdin.take().map(ChildStdin::from_std).transpose()?,
                stdout: child.stdout.take().map(ChildStdout::from_std).transpose()?,
                stderr: child.stderr.take().map(ChildStderr::from_std).transpose()?,
            })
        };
        let group = i32::try_from(pid).ok().and_then(Pid::from_raw);
        let (pipes, group) = match (adopt(&mut child), group) {
            (Ok(pipes), Some(group)) => (pipes, group),
            (adopted, _) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(match adopted {
                    Err(error) => start_failed(error),
                    Ok(_) => SubagentError::bug(format!("the OS gave child pid {pid}")),
                });
            }
        };
        let (exited, exit) = watch::channel(None);
        runtime.spawn(watch_exit(group, exited));
        tracing::debug!(pid, program = %program_name, "child process started");
        Ok(Self {
            pid,
            group,
            grace: spec.grace,
            exit,
            pipes: Mutex::new(pipes),
            leader: Arc::new(Mutex::new(Some(child))),
            tree_gone: AtomicBool::new(false),
            alive: group_alive,
            killed_within: KILLED_WITHIN,
        })
    }

    /// The leader's process id (also the group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Takes the child's stdin; `None` once taken.
    pub fn take_stdin(&self) -> Option<ChildStdin> {
        locked(&self.pipes).stdin.take()
    }

    /// Takes the child's stdout; `None` once taken.
    pub fn take_stdout(&self) -> Option<ChildStdout> {
        locked(&self.pipes).stdout.take()
    }

    /// Takes the child's stderr; `None` once taken or when it is inherited.
    pub fn take_stderr(&self) -> Option<ChildStderr> {
        locked(&self.pipes).stderr.take()
    }

    /// Closes the child's stdin, if this handle still holds it.
    pub fn close_stdin(&self) {
        drop(self.take_stdin());
    }

    /// How the leader ended, once it has.
    pub fn outcome(&self) -> Option<ExitOutcome> {
        *self.exit.borrow()
    }

    /// Waits until the leader has exited.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn exited(&self) -> ExitOutcome {
        let mut exit = self.exit.clone();
        // The watch only goes away after publishing, so an error still leaves the value.
        let published = exit.wait_for(Option::is_some).await.map(|outcome| *outcome);
        published.ok().flatten().unwrap_or_default()
    }

    /// Waits until the leader has exited and no live process is left in its group, for at
    /// most `within` (no bound with `None`), then reaps the leader. Returns whether the tree
    /// is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_for_tree_exit(&self, within: Option<Duration>) -> bool {
        if self.tree_gone.load(Ordering::Acquire) {
            return true;
        }
        let gone = async {
            self.exited().await;
            // Orphaned grandchildren keep the group; poll it down with a short backoff. The
            // scan reads /proc, so it runs off the actor's thread.
            let mut pause = Duration::from_millis(1);
            loop {
                let (group, probe) = (self.group, self.alive);
                let alive = tokio::task::spawn_blocking(move || probe(group))
                    .await
                    .unwrap_or(true);
                if !alive {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        };
        let gone = match within {
            Some(limit) => tokio::time::timeout(limit, gone).await.is_ok(),
            None => {
                gone.await;
                true
            }
        };
        if gone {
            self.tree_gone.store(true, Ordering::Release);
            // The leader is a zombie by now: reaping it returns at once.
            if let Some(mut leader) = locked(&self.leader).take() {
                let _ = leader.wait();
            }
        }
        gone
    }

    /// The terminate ladder: SIGTERM to the whole group, up to the grace for it to exit, then
    /// SIGKILL, then up to [`KILLED_WITHIN`] for the tree to be gone. Returns whether it is: a
    /// tree that outlived SIGKILL (a process in uninterruptible sleep, or one not ours to
    /// signal) is logged and left to [`Drop`], which signals it again and reaps the leader off
    /// the runtime's threads.
    ///
    /// # Cancel safety
    /// Cancel safe; a ladder dropped before SIGKILL leaves the rest to [`Drop`].
    pub async fn terminate(&self) -> bool {
        if !self.signal_group(Signal::TERM) {
            return self.wait_for_tree_exit(Some(self.killed_within)).await;
        }
        if self.wait_for_tree_exit(Some(self.grace)).await {
            return true;
        }
        tracing::debug!(
            pid = self.pid,
            "child tree outlived SIGTERM; sending SIGKILL"
        );
        self.signal_group(Signal::KILL);
        let gone = self.wait_for_tree_exit(Some(self.killed_within)).await;
        if !gone {
            tracing::warn!(
                pid = self.pid,
                within = ?self.killed_within,
                "a child's process tree outlived SIGKILL (uninterruptible, or not ours to signal); giving up waiting for it"
            );
        }
        gone
    }

    /// Signals every process of the group; false when none is left. Safe while the leader is
    /// unreaped: the group id cannot have been reused.
    fn signal_group(&self, signal: Signal) -> bool {
        if self.tree_gone.load(Ordering::Acquire) {
            return false;
        }
        match kill_process_group(self.group, signal) {
            Ok(()) => true,
            Err(Errno::SRCH) => false,
            Err(error) => {
                // Some member may not be ours to signal (a setuid grandchild): carry on.
                tracing::warn!(pid = self.pid, %error, "signalling a child's process group failed");
                true
            }
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.tree_gone.load(Ordering::Acquire) {
            return;
        }
        // A handle dropped mid-ladder (or never torn down) must not leave its tree running.
        self.signal_group(Signal::KILL);
        if let Some(mut leader) = locked(&self.leader).take() {
            // SIGKILL ends the leader promptly; reap it off this thread.
            let reaped = std::thread::Builder::new()
                .name("subagents-reap".to_owned())
                .spawn(move || {
                    let _ = leader.wait();
                });
            if let Err(error) = reaped {
                tracing::warn!(pid = self.pid, %error, "could not reap a dropped child");
            }
        }
    }
}

/// Publishes the leader's exit without reaping it: a pidfd on Linux, polling elsewhere (or
/// where the kernel has no pidfd).
async fn watch_exit(leader: Pid, exited: watch::Sender<Option<ExitOutcome>>) {
    #[cfg(target_os = "linux")]
    if let Ok(pidfd) = rustix::process::pidfd_open(leader, rustix::process::PidfdFlags::empty()) {
        // `new` is deprecated for types whose fd can be closed behind the reactor's back; an
        // `OwnedFd` moved in is closed only when the `AsyncFd` drops, after deregistration.
        #[allow(deprecated)]
        let registered = tokio::io::unix::AsyncFd::new(pidfd);
        if let Ok(readable) = registered {
            // A pidfd becomes readable when its process exits.
            let _ = readable.readable().await;
            let status = rustix::process::waitid(
                rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(readable.get_ref())),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            );
            exited.send_replace(Some(outcome_of(status)));
            return;
        }
    }
    let mut pause = Duration::from_millis(1);
    loop {
        let status = rustix::process::waitid(
            rustix::process::WaitId::Pid(leader),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        );
        if !matches!(status, Ok(None)) {
            exited.send_replace(Some(outcome_of(status)));
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn outcome_of(status: rustix::io::Result<Option<rustix::process::WaitIdStatus>>) -> ExitOutcome {
    match status {
        Ok(Some(status)) => ExitOutcome {
            code: status.exit_status(),
            signal: status.terminating_signal(),
        },
        Ok(None) | Err(_) => ExitOutcome::default(),
    }
}

/// Whether any process of `group` is alive (zombies awaiting their reaper do not count, so the
/// unreaped leader does not keep its own group alive). Reads /proc; where it cannot, asks the
/// kernel whether the group has any member at all.
#[cfg(target_os = "linux")]
fn group_alive(group: Pid) -> bool {
    let wanted = group.as_raw_pid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return rustix::process::test_kill_process_group(group).is_ok();
    };
    let mut readable = false;
    let alive = entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()));
        let Some(stat) = is_pid
            .then(|| std::fs::read_to_string(entry.path().join("stat")).ok())
            .flatten()
        else {
            return false;
        };
        readable = true;
        live_group_of(&stat) == Some(wanted)
    });
    alive || (!readable && rustix::process::test_kill_process_group(group).is_ok())
}

/// The process group of a `/proc/<pid>/stat` line, unless the process is dead: a zombie whose
/// only thread exited (a leader that called `pthread_exit` shows `Z` while its other threads
/// run, and counts as alive).
#[cfg(target_os = "linux")]
fn live_group_of(stat: &str) -> Option<i32> {
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .collect();
    let state = *fields.first()?;
    let group = fields.get(2)?.parse().ok()?;
    let threads: u32 = fields.get(17).and_then(|n| n.parse().ok()).unwrap_or(1);
    let dead = state == "X" || (state == "Z" && threads <= 1);
    (!dead).then_some(group)
}

/// Elsewhere only the leader is awaited: without /proc, an unreaped leader cannot be told from
/// a live grandchild.
#[cfg(not(target_os = "linux"))]
fn group_alive(_group: Pid) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A stand-in for a tree with a member that outlives SIGKILL (uninterruptible, or not
    /// ours to signal): the probe reports the group alive whatever the kernel did.
    fn never_gone(_: Pid) -> bool {
        true
    }

    #[test]
    fn a_tree_that_outlives_sigkill_does_not_hold_the_ladder() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let spec = ProcessSpec {
                argv: ["sleep", "30"].map(OsString::from).to_vec(),
                cwd: std::env::temp_dir(),
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                stderr: StderrMode::Inherit,
                grace: Duration::from_millis(50),
            };
            let mut child = ChildProcess::spawn(&spec).expect("sleep starts");
            child.alive = never_gone;
            child.killed_within = Duration::from_millis(200);
            let began = Instant::now();
            let gone = tokio::time::timeout(Duration::from_secs(20), child.terminate())
                .await
                .expect("the ladder ends though the tree outlives SIGKILL");
            assert!(!gone, "the tree is reported not gone");
            assert!(began.elapsed() < Duration::from_secs(10));
            // The leader itself was signalled to its end.
            assert!(child.exited().await.signal.is_some());
        });
    }

    #[test]
    fn reads_the_group_after_a_command_name_with_parentheses() {
        let tail = "0 0 0 0 0 0 0 0 0 0 0 0 0";
        assert_eq!(
            live_group_of(&format!("42 (a) b) S 1 777 777 {tail} 1")),
            Some(777)
        );
        assert_eq!(
            live_group_of(&format!("42 (sleep) Z 1 777 777 {tail} 1")),
            None
        );
        assert_eq!(
            live_group_of(&format!("42 (threads) Z 1 777 777 {tail} 3")),
            Some(777),
            "a zombie leader whose other threads run is alive"
        );
        assert_eq!(live_group_of("garbage"), None);
    }
}
