//! The contract every out-of-process provider shares: no capabilities, the bounds and cwd
//! checks, and the settlement rules of a published run.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use subagents::out_of_process::{
    out_of_process_run, positive_finite, resolve_child_cwd, settle_attempt, usable_cwd,
    validate_configured_cwd, ChildProcess, CwdLabel, PartialOutput, ProcessSpec, StderrMode,
    NO_START_CAPABILITIES,
};
use subagents::{ContentBlock, ErrorCode, StopReason, SubagentError, SubagentResult};
use tokio_util::sync::CancellationToken;

use crate::support::within;

fn completed(text: &str) -> SubagentResult {
    SubagentResult::with_output(StopReason::Completed, vec![ContentBlock::text(text)])
}

fn message(outcome: subagents::Result<impl std::fmt::Debug>) -> String {
    let error = outcome.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidConfig);
    error.message().to_owned()
}

// OOP-01
#[test]
fn out_of_process_providers_advertise_no_start_capability() {
    let caps = NO_START_CAPABILITIES;
    assert!(!caps.output_schema && !caps.depth_limit && !caps.tool_filter && !caps.persona);
}

// OOP-02
#[test]
fn bounds_must_be_positive_and_finite() {
    assert_eq!(positive_finite("p", "graceMs", 1.0).unwrap(), 1.0);
    assert_eq!(positive_finite("p", "graceMs", 0.5).unwrap(), 0.5);
    for value in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            message(positive_finite("p", "graceMs", value)),
            "p: graceMs must be a positive finite number",
            "{value}"
        );
    }
}

// OOP-03
#[test]
fn a_cwd_must_be_an_absolute_enterable_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        usable_cwd("p", CwdLabel::Config, dir.path()).unwrap(),
        dir.path()
    );
    assert_eq!(
        message(usable_cwd("p", CwdLabel::Config, Path::new("rel/dir"))),
        "p: config cwd must be an absolute path: rel/dir"
    );
    let missing = dir.path().join("missing");
    assert_eq!(
        message(usable_cwd("p", CwdLabel::ParentSession, &missing)),
        format!(
            "p: parent session cwd is not an accessible directory: {}",
            missing.display()
        )
    );
}

// OOP-04
#[test]
fn a_cwd_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    assert_eq!(
        message(usable_cwd("p", CwdLabel::Config, &file)),
        format!(
            "p: config cwd is not an accessible directory: {}",
            file.display()
        )
    );
}

// OOP-05
#[test]
fn a_cwd_without_search_permission_is_refused_unless_the_caller_may_enter_it_anyway() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    let checked = usable_cwd("p", CwdLabel::Config, &locked);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    if rustix::process::geteuid().is_root() {
        // Root searches any directory, so its child could enter this one.
        assert!(checked.is_ok());
    } else {
        assert_eq!(
            message(checked),
            format!(
                "p: config cwd is not an accessible directory: {}",
                locked.display()
            )
        );
    }
}

// OOP-06
#[test]
fn a_configured_cwd_is_optional_never_empty_and_resolved_at_load() {
    let launch = tempfile::tempdir().unwrap();
    std::fs::create_dir(launch.path().join("work")).unwrap();
    assert_eq!(
        validate_configured_cwd("p", None, launch.path()).unwrap(),
        None
    );
    assert_eq!(
        message(validate_configured_cwd(
            "p",
            Some(Path::new("")),
            launch.path()
        )),
        "p: config cwd must not be empty — omit the key to inherit the parent session cwd"
    );
    assert_eq!(
        validate_configured_cwd("p", Some(Path::new("work")), launch.path()).unwrap(),
        Some(launch.path().join("work"))
    );
}

// OOP-07
#[test]
fn the_child_cwd_is_the_override_else_the_checked_parent_cwd_else_a_loud_failure() {
    let over = tempfile::tempdir().unwrap();
    let parent = tempfile::tempdir().unwrap();
    assert_eq!(
        resolve_child_cwd("p", Some(over.path()), Some(parent.path())).unwrap(),
        over.path()
    );
    assert_eq!(
        resolve_child_cwd("p", None, Some(parent.path())).unwrap(),
        parent.path()
    );
    assert_eq!(
        message(resolve_child_cwd("p", None, Some(Path::new("rel")))),
        "p: parent session cwd must be an absolute path: rel"
    );
    assert_eq!(
        message(resolve_child_cwd("p", None, None)),
        "p: no working directory for the child — configure `cwd` or delegate from a parent \
         session that has one"
    );
}

// OOP-08
#[actix_rt::test]
async fn a_successful_attempt_passes_through() {
    let cancel = CancellationToken::new();
    let result = settle_attempt(
        "p",
        async { Ok(completed("done")) },
        &cancel,
        &PartialOutput::default(),
    )
    .await;
    assert_eq!(result, completed("done"));
}

// OOP-09
#[actix_rt::test]
async fn cancellation_settles_aborted_with_the_partial_output_whatever_the_attempt_does() {
    let partial = PartialOutput::default();
    partial.push("partial ");
    partial.push("");
    partial.push("answer");
    let aborted = SubagentResult::with_output(
        StopReason::Aborted,
        vec![ContentBlock::text("partial answer")],
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    // A failure after cancellation, a success after cancellation, and an attempt that never
    // ends: all aborted.
    let failed = async { Err(SubagentError::new(ErrorCode::StoreIo, "transport died")) };
    assert_eq!(
        settle_attempt("p", failed, &cancel, &partial).await,
        aborted
    );
    let succeeded = async { Ok(completed("late")) };
    assert_eq!(
        settle_attempt("p", succeeded, &cancel, &partial).await,
        aborted
    );
    let pending = std::future::pending();
    assert_eq!(
        settle_attempt("p", pending, &cancel, &partial).await,
        aborted
    );
}

// OOP-10 OOP-11
#[actix_rt::test]
async fn a_failure_settles_error_with_the_partial_output() {
    let partial = PartialOutput::default();
    partial.push("half");
    let cancel = CancellationToken::new();
    let failed = async { Err(SubagentError::new(ErrorCode::StoreIo, "transport died")) };
    let result = settle_attempt("p", failed, &cancel, &partial).await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.output, vec![ContentBlock::text("half")]);
    assert_eq!(
        settle_attempt("p", failed_empty(), &cancel, &PartialOutput::default())
            .await
            .output,
        Vec::<ContentBlock>::new()
    );
}

async fn failed_empty() -> subagents::Result<SubagentResult> {
    Err(SubagentError::new(ErrorCode::StoreIo, "no output"))
}

// OOP-12
#[actix_rt::test]
async fn dispose_cancels_locally_and_awaits_the_teardown_exactly_once() {
    let teardowns = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = released.shared();
    let cancel = CancellationToken::new();
    let counted = Arc::clone(&teardowns);
    let run = out_of_process_run(
        "p",
        std::future::pending(),
        PartialOutput::default(),
        cancel.clone(),
        move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = released.await;
                Ok(())
            }
            .boxed()
        },
    );
    assert!(run.local_agent().is_none());
    let first = tokio::spawn({
        let run = run.clone();
        async move { run.dispose().await }
    });
    let second = tokio::spawn({
        let run = run.clone();
        async move { run.dispose().await }
    });
    // The local cancellation settles the result before the teardown finishes.
    let result = within("the aborted result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(cancel.is_cancelled());
    assert!(
        !first.is_finished() && !second.is_finished(),
        "dispose awaits the teardown"
    );
    release.send(()).unwrap();
    within("both disposals", async {
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
    })
    .await;
    assert_eq!(teardowns.load(Ordering::SeqCst), 1);
}

fn spec(script: &str, dir: &Path) -> ProcessSpec {
    ProcessSpec {
        argv: ["sh", "-c", script].map(Into::into).to_vec(),
        cwd: dir.to_owned(),
        env: std::env::vars_os().collect(),
        stderr: StderrMode::Inherit,
        grace: std::time::Duration::from_millis(100),
    }
}

fn pid_in(file: &Path) -> u32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

// ACP-24
#[actix_rt::test]
async fn terminate_ends_a_grandchild_that_outlived_its_leader() {
    let dir = tempfile::tempdir().unwrap();
    let process = ChildProcess::spawn(&spec(
        "sleep 600 & echo $! > grandchild; exit 7",
        dir.path(),
    ))
    .unwrap();
    let outcome = within("the leader's exit", process.exited()).await;
    assert_eq!(outcome.code, Some(7));
    assert_eq!(outcome.to_string(), "exit code: 7");
    let grandchild = pid_in(&dir.path().join("grandchild"));
    assert!(
        !process
            .wait_for_tree_exit(Some(std::time::Duration::from_millis(50)))
            .await,
        "the grandchild keeps the tree alive"
    );
    within("the terminate ladder", process.terminate()).await;
    assert!(process.wait_for_tree_exit(None).await);
    crate::support::gone(grandchild).await;
}

// ACP-24
#[actix_rt::test]
async fn dropping_a_handle_kills_its_whole_tree() {
    let dir = tempfile::tempdir().unwrap();
    let process = ChildProcess::spawn(&spec(
        // Renamed into place: the file is complete once it exists.
        "trap '' TERM; sleep 600 & echo $! > grandchild; echo $$ > leader.tmp; mv leader.tmp leader; wait",
        dir.path(),
    ))
    .unwrap();
    let grandchild_file = dir.path().join("grandchild");
    crate::support::appears(&dir.path().join("leader")).await;
    let (leader, grandchild) = (pid_in(&dir.path().join("leader")), pid_in(&grandchild_file));
    drop(process);
    crate::support::gone(leader).await;
    crate::support::gone(grandchild).await;
}

// ACP-24
#[actix_rt::test]
async fn a_signal_names_how_the_leader_ended() {
    let dir = tempfile::tempdir().unwrap();
    let process = ChildProcess::spawn(&spec("kill -KILL $$", dir.path())).unwrap();
    let outcome = within("the leader's exit", process.exited()).await;
    assert_eq!(outcome.signal, Some(9));
    assert_eq!(outcome.to_string(), "signal: SIGKILL");
    assert!(process.wait_for_tree_exit(None).await);
}

// ACP-24
#[test]
fn a_child_cannot_start_outside_the_actor_system() {
    let dir = tempfile::tempdir().unwrap();
    let error = ChildProcess::spawn(&spec("exit 0", dir.path())).unwrap_err();
    assert_eq!(error.code(), ErrorCode::NoActorSystem);
}
