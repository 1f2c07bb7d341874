//! The narrated tour `subagents demo` runs (#11 item 4), as a test so it cannot rot: its key
//! transcript lines, and the store it leaves behind as `subagents tree` lists it.

use std::time::Duration;

use subagents::tour::{install_tour, run_tour, TourModel, TOUR_DONE, TOUR_PROMPT};
use subagents::{MemoryStore, Runtime};

fn position(transcript: &[String], what: &str, holds: impl Fn(&str) -> bool) -> usize {
    transcript
        .iter()
        .position(|line| holds(line))
        .unwrap_or_else(|| panic!("no line for {what} in:\n{}", transcript.join("\n")))
}

/// A runtime on the tour's model with the tour's providers and tools installed.
pub async fn tour_runtime() -> Runtime {
    tour_runtime_with(false).await
}

/// The tour's runtime, recording content on its spans when `trace_content`.
pub async fn tour_runtime_with(trace_content: bool) -> Runtime {
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .model("tour", TourModel)
        .trace_content(trace_content)
        .build()
        .unwrap();
    install_tour(&rt).await.unwrap();
    rt
}

#[actix_rt::test]
async fn the_tour_delegates_follows_up_hears_back_and_lists_its_agents() {
    let rt = tour_runtime().await;
    let (_, transcript) = run_tour(&rt, Duration::from_secs(30)).await.unwrap();
    assert_eq!(transcript[0], format!("user: {TOUR_PROMPT}"));
    // Both one-shot delegations go out in one response and both answers come back.
    let spawn = position(&transcript, "the spawn call", |l| {
        l.starts_with("call subagent {")
    });
    let fork = position(&transcript, "the fork call", |l| {
        l.starts_with("call subagent_fork ")
    });
    assert_eq!(fork, spawn + 1, "one response, two calls");
    position(&transcript, "the spawn answer", |l| {
        l == "result: Three fixes and one feature since v0.1."
    });
    position(&transcript, "the fork answer", |l| {
        l == "result: Announcing v0.2: children you can talk to again."
    });
    let started = position(&transcript, "the continuable start", |l| {
        l.starts_with("result: started subagent ")
    });
    let child = transcript[started]
        .trim_start_matches("result: started subagent ")
        .to_owned();
    let queued = position(&transcript, "the follow-up", |l| {
        *l == format!("result: message queued as the next turn for subagent {child}")
    });
    let report = position(&transcript, "the report", |l| {
        *l == format!("report: Background subagent {child} reported: CI is green on main.")
    });
    let last_notice = position(&transcript, "the final notice", |l| {
        l.starts_with("notice:") && l.contains("The flaky test passed three times in a row.")
    });
    let listed = position(&transcript, "the listing", |l| {
        l.starts_with(&format!("result: {child} [")) && l.ends_with("] — watch CI")
    });
    assert!(queued < last_notice && report > started && last_notice < listed);
    assert_eq!(transcript.last().unwrap(), &format!("parent: {TOUR_DONE}"));
    rt.shutdown().await.unwrap();
}

/// Runs `subagents demo` into a fresh store: the store, and what the demo printed.
fn demo_store() -> (tempfile::TempDir, String) {
    let store = tempfile::tempdir().unwrap();
    let demo = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["demo", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&demo.stdout).into_owned();
    assert!(
        demo.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    (store, stdout)
}

#[test]
fn the_demo_command_narrates_the_tour_and_leaves_a_forest_for_tree() {
    let (store, stdout) = demo_store();
    let binary = env!("CARGO_BIN_EXE_subagents");
    assert!(stdout.contains(&format!("parent: {TOUR_DONE}")), "{stdout}");
    let tree = std::process::Command::new(binary)
        .args(["tree", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.status.success());
    for label in [
        "\"survey the changelog\"",
        "\"draft the announcement\"",
        "\"watch CI\"",
    ] {
        assert!(listing.contains(label), "{label} missing from:\n{listing}");
    }
    assert!(listing.contains("continuable"), "{listing}");
    // Its help says what it runs (it described an earlier one-tool demo).
    let help = std::process::Command::new(binary)
        .args(["demo", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("delegation tour"), "{help}");
}

/// Runs `subagents tree --store DIR` as a user who may read `dir` but not write it: as root
/// (who may write anywhere), as `nobody` through `runuser`; else with `dir` made read-only.
fn tree_without_write_access(dir: &std::path::Path) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    fn set_mode(path: &std::path::Path, file_mode: u32, dir_mode: u32) {
        for entry in std::fs::read_dir(path).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                set_mode(&entry.path(), file_mode, dir_mode);
            } else {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(file_mode))
                    .unwrap();
            }
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    }
    let binary = env!("CARGO_BIN_EXE_subagents");
    let root = rustix::process::geteuid().is_root();
    set_mode(dir, 0o444, 0o555);
    let output = if root {
        std::process::Command::new("runuser")
            .args(["-u", "nobody", "--", binary, "tree", "--store"])
            .arg(dir)
            .output()
            .unwrap()
    } else {
        std::process::Command::new(binary)
            .args(["tree", "--store"])
            .arg(dir)
            .output()
            .unwrap()
    };
    // Writable again, so the temporary directory can be removed.
    set_mode(dir, 0o644, 0o755);
    output
}

#[test]
fn a_store_this_process_cannot_write_is_listed_from_a_copy() {
    let (store, _) = demo_store();
    let before = std::fs::read(store.path().join("db")).unwrap();
    let tree = tree_without_write_access(store.path());
    let listing = String::from_utf8_lossy(&tree.stdout);
    let stderr = String::from_utf8_lossy(&tree.stderr);
    assert!(tree.status.success(), "{listing}{stderr}");
    assert!(listing.contains("\"watch CI\""), "{listing}");
    assert!(stderr.contains("listing a copy"), "{stderr}");
    assert_eq!(
        std::fs::read(store.path().join("db")).unwrap(),
        before,
        "the store itself is left as it was"
    );
}
