//! Provides [`Jobs`], the registry of background work (`ctx.jobs`): a producer (such as the
//! `subagent` tool's background one-shot route) starts a job owned by a live agent; the owner
//! reads, waits on and kills it through the job tools ([`tools`]), and hears of its completion
//! in a notice.
//!
//! # Contract
//! - Work starts only while a **controller** is attached (the job tools install one): without
//!   one, [`Jobs::start`] refuses before calling the producer, so nothing starts.
//! - Ids are `<kind>-N`, counted per kind from 1. Access is fenced by the owner's session: a
//!   job of one agent is unknown to every other (`job <id> belongs to another session`).
//! - The producer hands back [`JobHooks`]: a synchronous, idempotent `cancel(reason)` and a
//!   `done` future that resolves once its resources are released. A `done` that panics
//!   settles the job `failed`.
//! - A job whose terminal state somebody already observed (a read, a wait, a kill) is
//!   *reported*: its completion notice is not sent.
//! - The registry stays bounded in a long-running host: an ended job lets go of its owner's
//!   [`AgentRef`] once nothing is owed to it (its notice sent, or its result observed), and
//!   only the [`ENDED_JOBS_PER_OWNER`] most recently ended jobs of each owner, and the
//!   [`ENDED_JOBS`] most recently ended overall, are kept; an older one answers `unknown job`
//!   (running jobs, and ended ones a wait is still returning, are never forgotten).

mod retained;
pub mod tools;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::{BoxFuture, FutureExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use retained::Retained;
pub use retained::{ENDED_JOBS, ENDED_JOBS_PER_OWNER};

/// A job's lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobStatus {
    /// The work is under way.
    Running,
    /// Cancellation was requested; the work has not stopped yet.
    Stopping,
    /// The work finished.
    Completed,
    /// The work was cancelled.
    Killed,
    /// The work broke.
    Failed,
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Killed | Self::Failed)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Completed => "completed",
            Self::Killed => "killed",
            Self::Failed => "failed",
        }
    }
}

/// How a producer's work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    /// `Completed`, `Killed` or `Failed` (anything else is read as `Failed`).
    pub status: JobStatus,
    /// A kind-specific fact for the status line (`max-tokens`, `Error: setup failed`).
    pub detail: Option<String>,
    /// The final output.
    pub output: Option<String>,
}

/// What a producer hands back when its work starts.
pub struct JobHooks {
    /// Requests termination: synchronous, idempotent, and eventually settles `done`.
    pub cancel: Box<dyn Fn(Option<String>) + Send + Sync>,
    /// Resolves once the producer released its resources.
    pub done: BoxFuture<'static, JobOutcome>,
}

/// A read-only view of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSnapshot {
    /// `<kind>-N`.
    pub id: String,
    /// The producer kind.
    pub kind: String,
    /// The one-line label (a delegation's description).
    pub label: String,
    /// The status now.
    pub status: JobStatus,
    /// The producer's detail, once ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub started_at: u64,
    /// Milliseconds since the Unix epoch, once ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
}

impl JobSnapshot {
    /// `[status: <status>]` or `[status: <status>, <detail>]`.
    pub fn status_line(&self) -> String {
        match &self.detail {
            Some(detail) => format!("[status: {}, {detail}]", self.status.as_str()),
            None => format!("[status: {}]", self.status.as_str()),
        }
    }
}

/// Whether a kill requested a cancellation or found the job already ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillOutcome {
    /// `cancel` was called; the job settles once its work stops.
    Requested,
    /// The job had already ended.
    AlreadyFinished,
}

/// Told of every settled job whose completion nobody has observed yet, with its owner.
pub type JobDoneListener = Arc<dyn Fn(&JobSnapshot, &AgentRef) + Send + Sync>;

struct Job {
    snapshot: JobSnapshot,
    /// The owning session: access is fenced by it.
    owner_id: SessionId,
    /// The owner, while a completion notice may still be owed to it: held until then (it
    /// keeps the owner's log alive) and let go after.
    owner: Option<AgentRef>,
    cancel: Arc<dyn Fn(Option<String>) + Send + Sync>,
    output: Option<String>,
    reported: bool,
    /// Waits in progress: a settlement they will return owes no notice unless they all go
    /// away without returning it.
    waiters: usize,
    /// Flips to `true` at settlement.
    settled: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    jobs: BTreeMap<String, Job>,
    /// The ended jobs still kept, in the order they are forgotten.
    ended: Retained,
    counters: BTreeMap<String, u64>,
    controllers: usize,
    next_listener: u64,
    listeners: Vec<(u64, JobDoneListener)>,
}

/// The background-job registry of one runtime. Cheap to clone.
///
/// A lock-guarded table rather than an actor: every operation is a few synchronous map
/// updates that never await under the lock, producers and tools call it from any thread, and
/// listeners run after the lock is released.
#[derive(Clone, Default)]
pub struct Jobs {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

fn job_error(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidArgs, message)
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change below is a few map and field writes: a panic cannot leave one half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attaches a controller; producers may start work while at least one is attached. The
    /// returned guard detaches it when dropped.
    pub fn attach_controller(&self) -> ControllerGuard {
        self.lock().controllers += 1;
        ControllerGuard {
            jobs: Some(self.clone()),
        }
    }

    /// Adds a completion listener; dropping the returned guard removes it.
    pub fn on_job_done(&self, listener: JobDoneListener) -> ListenerGuard {
        let mut state = self.lock();
        state.next_listener += 1;
        let id = state.next_listener;
        state.listeners.push((id, listener));
        ListenerGuard {
            jobs: Some(self.clone()),
            id,
        }
    }

    /// Starts a job of `kind` labelled `label` for `owner`: checks that a controller serves
    /// it, then calls `run` once and tracks what it returns.
    ///
    /// # Errors
    /// `JOBS_UNAVAILABLE` without a controller (`run` is not called); `INVALID_ARGS` for an
    /// empty kind or label.
    pub fn start(
        &self,
        kind: &str,
        label: &str,
        owner: &AgentRef,
        run: impl FnOnce() -> JobHooks,
    ) -> Result<String> {
        if self.lock().controllers == 0 {
            return Err(SubagentError::new(
                ErrorCode::JobsUnavailable,
                "background jobs unavailable: no job controller serves this agent (install the job tools)",
            ));
        }
        if kind.is_empty() {
            return Err(job_error(
                "invalid job kind: expected a non-empty string".into(),
            ));
        }
        if label.is_empty() {
            return Err(job_error(
                "invalid job label: expected a non-empty string".into(),
            ));
        }
        let hooks = run();
        let (settled, _) = watch::channel(false);
        let id = {
            let mut state = self.lock();
            if state.controllers == 0 {
                // The controller went away while the producer started: no tool could read or
                // kill this job, so it is stopped at once.
                drop(state);
                (hooks.cancel)(Some("no job controller serves this agent".to_owned()));
                return Err(SubagentError::new(
                    ErrorCode::JobsUnavailable,
                    "background jobs unavailable: the job controller was detached",
                ));
            }
            let counter = state.counters.entry(kind.to_owned()).or_insert(0);
            *counter += 1;
            let id = format!("{kind}-{counter}");
            state.jobs.insert(
                id.clone(),
                Job {
                    snapshot: JobSnapshot {
                        id: id.clone(),
                        kind: kind.to_owned(),
                        label: label.to_owned(),
                        status: JobStatus::Running,
                        detail: None,
                        started_at: now_ms(),
                        finished_at: None,
                    },
                    owner_id: owner.id(),
                    owner: Some(owner.clone()),
                    cancel: Arc::from(hooks.cancel),
                    output: None,
                    reported: false,
                    waiters: 0,
                    settled,
                },
            );
            id
        };
        let jobs = self.clone();
        let settling = id.clone();
        tokio::spawn(async move {
            let outcome = std::panic::AssertUnwindSafe(hooks.done)
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(job = %settling, "a job's producer panicked");
                    JobOutcome {
                        status: JobStatus::Failed,
                        detail: Some("the producer failed unexpectedly".into()),
                        output: None,
                    }
                });
            jobs.settle(&settling, outcome);
        });
        Ok(id)
    }

    fn settle(&self, id: &str, outcome: JobOutcome) {
        let (notice, listeners) = {
            let mut state = self.lock();
            let Some(job) = state.jobs.get_mut(id) else {
                return;
            };
            job.snapshot.status = if outcome.status.is_terminal() {
                outcome.status
            } else {
                JobStatus::Failed
            };
            job.snapshot.detail = outcome.detail;
            job.snapshot.finished_at = Some(now_ms());
            job.output = outcome.output;
            job.settled.send_replace(true);
            // A waiter will return the settlement itself; if it goes away without doing so,
            // its guard sends the notice instead.
            let notice = job.owed_notice();
            let owner = job.owner_id;
            let State { jobs, ended, .. } = &mut *state;
            ended.ended(owner, id, jobs);
            (notice, listeners_of(&state))
        };
        notify(notice, &listeners);
    }

    /// A wait ended: `returned` when it handed the terminal state to its caller. The last
    /// waiter of an ended job that nobody observed sends its notice.
    fn wait_ended(&self, id: &str, returned: bool) {
        let (notice, listeners) = {
            let mut state = self.lock();
            let Some(job) = state.jobs.get_mut(id) else {
                return;
            };
            job.waiters = job.waiters.saturating_sub(1);
            let ended = job.snapshot.status.is_terminal();
            if ended && returned {
                job.observed();
            }
            let notice = if ended { job.owed_notice() } else { None };
            let owner = job.owner_id;
            // A wait may have held back the forgetting of this job.
            let State { jobs, ended, .. } = &mut *state;
            ended.forget_overflow(owner, jobs);
            (notice, listeners_of(&state))
        };
        notify(notice, &listeners);
    }

    fn with_job<T>(
        &self,
        id: &str,
        caller: SessionId,
        read: impl FnOnce(&mut Job) -> T,
    ) -> Result<T> {
        let mut state = self.lock();
        let job = state
            .jobs
            .get_mut(id)
            .ok_or_else(|| job_error(format!("unknown job {id}")))?;
        if job.owner_id != caller {
            return Err(SubagentError::new(
                ErrorCode::Unauthorized,
                format!("job {id} belongs to another session"),
            ));
        }
        Ok(read(job))
    }

    /// The jobs `caller` owns, oldest first within each kind.
    pub fn list(&self, caller: SessionId) -> Vec<JobSnapshot> {
        self.lock()
            .jobs
            .values()
            .filter(|job| job.owner_id == caller)
            .map(|job| job.snapshot.clone())
            .collect()
    }

    /// The job `id`, as `caller` sees it.
    ///
    /// # Errors
    /// `INVALID_ARGS` for an unknown job; `UNAUTHORIZED` for another session's job.
    pub fn get(&self, id: &str, caller: SessionId) -> Result<JobSnapshot> {
        self.with_job(id, caller, |job| job.snapshot.clone())
    }

    /// The job's final output (empty until it ends; every later read returns it again) and
    /// its snapshot. Reading an ended job reports it.
    ///
    /// # Errors
    /// As [`Jobs::get`].
    pub fn read(&self, id: &str, caller: SessionId) -> Result<(String, JobSnapshot)> {
        self.with_job(id, caller, |job| {
            let ended = job.snapshot.status.is_terminal();
            if ended {
                job.observed();
            }
            let text = if ended {
                job.output.clone().unwrap_or_default()
            } else {
                String::new()
            };
            (text, job.snapshot.clone())
        })
    }

    /// Waits until the job ends, `timeout` passes, or `cancel` fires; a timed-out wait is not
    /// an error (the job goes on).
    ///
    /// # Errors
    /// As [`Jobs::get`]; `CANCELLED` when `cancel` fired first.
    pub async fn wait(
        &self,
        id: &str,
        caller: SessionId,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<JobSnapshot> {
        let mut settled = self.with_job(id, caller, |job| {
            job.waiters += 1;
            job.settled.subscribe()
        })?;
        // Counts the wait until it ends, however it ends (a dropped caller included).
        let mut guard = WaitGuard {
            jobs: self,
            id,
            returned: false,
        };
        tokio::select! {
            _ = tokio::time::timeout(timeout, settled.wait_for(|ended| *ended)) => {}
            () = cancel.cancelled() => {
                return Err(SubagentError::new(ErrorCode::Cancelled, "wait aborted"));
            }
        }
        let snapshot = self.with_job(id, caller, |job| job.snapshot.clone())?;
        guard.returned = true;
        Ok(snapshot)
    }

    /// Requests the job's cancellation with `reason`; it settles `killed` once its work
    /// stops. Either way nobody is notified of its completion.
    ///
    /// # Errors
    /// As [`Jobs::get`].
    pub fn kill(&self, id: &str, caller: SessionId, reason: Option<String>) -> Result<KillOutcome> {
        let cancel = self.with_job(id, caller, |job| {
            job.reported = true;
            if job.snapshot.status.is_terminal() {
                job.observed();
                return None;
            }
            job.snapshot.status = JobStatus::Stopping;
            Some(Arc::clone(&job.cancel))
        })?;
        // Called outside the lock: a producer's cancel may settle synchronously.
        Ok(match cancel {
            Some(cancel) => {
                cancel(reason);
                KillOutcome::Requested
            }
            None => KillOutcome::AlreadyFinished,
        })
    }
}

impl Job {
    /// The completion notice this ended job owes now, if any: none once its result was
    /// observed, and none while a wait may still return it. Either way, once nothing can be
    /// owed the owner is let go.
    fn owed_notice(&mut self) -> Option<(JobSnapshot, AgentRef)> {
        if self.reported {
            self.owner = None;
            return None;
        }
        if self.waiters > 0 {
            return None;
        }
        self.reported = true;
        self.owner
            .take()
            .map(|owner| (self.snapshot.clone(), owner))
    }

    /// Its terminal state was handed to the owner: no notice is owed.
    fn observed(&mut self) {
        self.reported = true;
        self.owner = None;
    }

    /// Whether forgetting it loses nothing anyone waits on.
    fn forgettable(&self) -> bool {
        self.snapshot.status.is_terminal() && self.waiters == 0
    }
}

/// Ends one wait's count on drop (see [`Jobs::wait`]).
struct WaitGuard<'a> {
    jobs: &'a Jobs,
    id: &'a str,
    returned: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.jobs.wait_ended(self.id, self.returned);
    }
}

fn listeners_of(state: &State) -> Vec<JobDoneListener> {
    state
        .listeners
        .iter()
        .map(|(_, listener)| Arc::clone(listener))
        .collect()
}

/// Tells `listeners` of a settled job's notice, outside the registry's lock.
fn notify(notice: Option<(JobSnapshot, AgentRef)>, listeners: &[JobDoneListener]) {
    if let Some((snapshot, owner)) = notice {
        for listener in listeners {
            listener(&snapshot, &owner);
        }
    }
}

/// Keeps a completion listener registered; dropping it removes the listener.
#[must_use = "dropping the guard removes the listener"]
pub struct ListenerGuard {
    jobs: Option<Jobs>,
    id: u64,
}

impl std::fmt::Debug for ListenerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerGuard")
            .field("id", &self.id)
            .finish()
    }
}

impl ListenerGuard {
    /// Keeps the listener for the registry's whole life.
    pub fn keep(mut self) {
        self.jobs = None;
    }
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        if let Some(jobs) = self.jobs.take() {
            jobs.lock().listeners.retain(|(id, _)| *id != self.id);
        }
    }
}

/// Keeps a controller attached; dropping it detaches the controller.
#[must_use = "dropping the guard detaches the controller"]
#[derive(Debug)]
pub struct ControllerGuard {
    jobs: Option<Jobs>,
}

impl ControllerGuard {
    /// Keeps the controller attached for the registry's whole life.
    pub fn keep(mut self) {
        self.jobs = None;
    }
}

impl Drop for ControllerGuard {
    fn drop(&mut self) {
        if let Some(jobs) = self.jobs.take() {
            let mut state = jobs.lock();
            state.controllers = state.controllers.saturating_sub(1);
        }
    }
}
