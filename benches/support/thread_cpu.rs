//! How long each of this process's threads has run, from the scheduler's own counts
//! (`/proc/self/task/*/schedstat`, nanoseconds): a pass prints where a phase's processor time
//! went, so a phase bound by one thread (the continuation manager's, say) shows as one.

use std::collections::HashMap;
use std::time::Duration;

/// Each thread's run time so far, by thread id; empty where procfs has no schedstat.
pub struct ThreadCpu(HashMap<String, u64>);

impl ThreadCpu {
    /// Reads every thread's run time now.
    pub fn now() -> Self {
        let mut ran = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let stat = std::fs::read_to_string(task.path().join("schedstat")).ok();
                // "<ran> <waited> <timeslices>".
                let nanos =
                    stat.and_then(|stat| stat.split_ascii_whitespace().next()?.parse().ok());
                if let Some(nanos) = nanos {
                    ran.insert(task.file_name().to_string_lossy().into_owned(), nanos);
                }
            }
        }
        Self(ran)
    }

    /// The run time since `before`: this process's main thread's (the one the pass runs on,
    /// with the continuation manager), and every other thread's together.
    pub fn since(&self, before: &Self) -> (Duration, Duration) {
        let main = std::process::id().to_string();
        let (mut on_main, mut elsewhere) = (0, 0);
        for (thread, ran) in &self.0 {
            let spent = ran.saturating_sub(before.0.get(thread).copied().unwrap_or(0));
            if *thread == main {
                on_main += spent;
            } else {
                elsewhere += spent;
            }
        }
        (
            Duration::from_nanos(on_main),
            Duration::from_nanos(elsewhere),
        )
    }
}
