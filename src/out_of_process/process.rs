//! Provides [`ChildProcess`]: one external child started in a process group of its own, so the
//! whole tree it starts can be signalled at once, with the terminate ladder (SIGTERM, grace,
//! SIGKILL) and a reaped exit. No process outlives its handle: dropping a handle whose tree is
//! still alive kills the tree.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rustix::process::{kill_process_group, Pid, Signal};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
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

impl ExitOutcome {
    fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

/// `exit code: N`, `signal: N`, both joined by `; `, or nothing when neither was observed.
impl fmt::Display for ExitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), Some(signal)) => write!(f, "exit code: {code}; signal: {signal}"),
            (Some(code), None) => write!(f, "exit code: {code}"),
            (None, Some(signal)) => write!(f, "signal: {signal}"),
            (None, None) => Ok(()),
        }
    }
}

/// One live external child and the process group it leads.
///
/// The leader is reaped by a task of its own as soon as it exits, so it never lingers as a
/// zombie; [`ChildProcess::terminate`] ends every process of the group, including grandchildren
/// that outlived the leader.
pub struct ChildProcess {
    pid: u32,
    group: Pid,
    grace: Duration,
    exit: watch::Receiver<Option<ExitOutcome>>,
    pipes: Mutex<Pipes>,
    tree_gone: AtomicBool,
}

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

impl ChildProcess {
    /// Starts the child in a new process group. Must run inside the actor system (its reaper
    /// is a task).
    ///
    /// # Errors
    /// `CHILD_START_FAILED` when the executable cannot be started (missing, not executable, bad
    /// cwd); the OS error is the cause.
    pub fn spawn(spec: &ProcessSpec) -> Result<Self> {
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(SubagentError::new(
                ErrorCode::ChildStartFailed,
                "the child's command line is empty",
            ));
        };
        let mut command = Command::new(program);
        command
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
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|error| {
            SubagentError::new(
                ErrorCode::ChildStartFailed,
                format!("could not start {}", program.to_string_lossy()),
            )
            .with_source(error)
        })?;
        let pid = child.id().unwrap_or_default();
        let group = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| SubagentError::bug(format!("the OS gave child pid {pid}")))?;
        let pipes = Pipes {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
        };
        let (exited, exit) = watch::channel(None);
        tokio::spawn(async move {
            let outcome = match child.wait().await {
                Ok(status) => ExitOutcome::from_status(status),
                Err(error) => {
                    tracing::warn!(pid, %error, "waiting for a child process failed");
                    ExitOutcome::default()
                }
            };
            exited.send_replace(Some(outcome));
        });
        tracing::debug!(pid, program = %program.to_string_lossy(), "child process started");
        Ok(Self {
            pid,
            group,
            grace: spec.grace,
            exit,
            pipes: Mutex::new(pipes),
            tree_gone: AtomicBool::new(false),
        })
    }

    /// The leader's process id (also the group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn pipes(&self) -> std::sync::MutexGuard<'_, Pipes> {
        self.pipes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the child's stdin; `None` once taken.
    pub fn take_stdin(&self) -> Option<ChildStdin> {
        self.pipes().stdin.take()
    }

    /// Takes the child's stdout; `None` once taken.
    pub fn take_stdout(&self) -> Option<ChildStdout> {
        self.pipes().stdout.take()
    }

    /// Takes the child's stderr; `None` once taken or when it is inherited.
    pub fn take_stderr(&self) -> Option<ChildStderr> {
        self.pipes().stderr.take()
    }

    /// Closes the child's stdin, if this handle still holds it.
    pub fn close_stdin(&self) {
        drop(self.take_stdin());
    }

    /// How the leader ended, once it has.
    pub fn outcome(&self) -> Option<ExitOutcome> {
        *self.exit.borrow()
    }

    /// Waits until the leader has exited and been reaped.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn exited(&self) -> ExitOutcome {
        let mut exit = self.exit.clone();
        // The reaper only goes away after publishing, so an error still leaves the value.
        let published = exit.wait_for(Option::is_some).await.map(|outcome| *outcome);
        published.ok().flatten().unwrap_or_default()
    }

    /// Waits until the leader has exited and no live process is left in its group, for at
    /// most `within` (no bound with `None`). Returns whether the tree is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_for_tree_exit(&self, within: Option<Duration>) -> bool {
        let gone = async {
            self.exited().await;
            // Orphaned grandchildren keep the group; poll it down with a short backoff.
            let mut pause = Duration::from_millis(2);
            while group_alive(self.group) {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            self.tree_gone.store(true, Ordering::Release);
        };
        match within {
            Some(limit) => tokio::time::timeout(limit, gone).await.is_ok(),
            None => {
                gone.await;
                true
            }
        }
    }

    /// The terminate ladder: SIGTERM to the whole group, up to the grace for it to exit, then
    /// SIGKILL, then an unbounded wait until the tree is gone.
    ///
    /// # Cancel safety
    /// Cancel safe; a ladder dropped before SIGKILL leaves the rest to [`Drop`].
    pub async fn terminate(&self) {
        if !self.signal_group(Signal::TERM) {
            self.wait_for_tree_exit(None).await;
            return;
        }
        if self.wait_for_tree_exit(Some(self.grace)).await {
            return;
        }
        tracing::debug!(
            pid = self.pid,
            "child tree outlived SIGTERM; sending SIGKILL"
        );
        self.signal_group(Signal::KILL);
        self.wait_for_tree_exit(None).await;
    }

    /// Signals every process of the group; false when none is left.
    fn signal_group(&self, signal: Signal) -> bool {
        kill_process_group(self.group, signal).is_ok()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // A handle dropped mid-ladder (or never torn down) must not leave its tree running.
        if !self.tree_gone.load(Ordering::Acquire)
            && (self.outcome().is_none() || group_alive(self.group))
        {
            self.signal_group(Signal::KILL);
        }
    }
}

/// Whether any process of `group` is alive (zombies awaiting their reaper do not count).
#[cfg(target_os = "linux")]
fn group_alive(group: Pid) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return rustix::process::test_kill_process_group(group).is_ok();
    };
    let wanted = group.as_raw_pid();
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| live_group_of(&stat))
                == Some(wanted)
    })
}

/// The process group of a `/proc/<pid>/stat` line, unless the process is a zombie.
#[cfg(target_os = "linux")]
fn live_group_of(stat: &str) -> Option<i32> {
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    (state != "Z" && state != "X").then_some(group)
}

#[cfg(not(target_os = "linux"))]
fn group_alive(group: Pid) -> bool {
    rustix::process::test_kill_process_group(group).is_ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::live_group_of;

    #[test]
    fn reads_the_group_after_a_command_name_with_parentheses() {
        assert_eq!(live_group_of("42 (a) b) S 1 777 777 0"), Some(777));
        assert_eq!(live_group_of("42 (sleep) Z 1 777 777 0"), None);
        assert_eq!(live_group_of("garbage"), None);
    }
}
