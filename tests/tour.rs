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

#[actix_rt::test]
async fn the_tour_delegates_follows_up_hears_back_and_lists_its_agents() {
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .model("tour", TourModel)
        .build()
        .unwrap();
    install_tour(&rt).await.unwrap();
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

#[test]
fn the_demo_command_narrates_the_tour_and_leaves_a_forest_for_tree() {
    let store = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_subagents");
    let demo = std::process::Command::new(binary)
        .args(["demo", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&demo.stdout);
    assert!(
        demo.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&demo.stderr)
    );
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
