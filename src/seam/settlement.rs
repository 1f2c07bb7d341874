//! Provides [`settle_run`]: maps a finished run onto a background job's outcome, disposing the
//! run first on every path.

use crate::seam::SubagentRun;
use crate::stop_reason::StopReason;

/// How a background delegation ended, for a job runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The child completed; `output` is its final text.
    Completed {
        /// The concatenated text of the final output.
        output: String,
    },
    /// The child was cancelled.
    Killed,
    /// The child, or the run's infrastructure, failed.
    Failed {
        /// The stop reason, or the failure(s) in words.
        detail: String,
    },
}

/// Awaits the run's result, disposes the run (always, before reporting), and maps the outcome:
/// `completed` → completed, `aborted` → killed, any other reason (known or not) → failed with
/// the reason as detail; a failed result or disposal is a failure naming both.
pub async fn settle_run(run: &SubagentRun) -> JobOutcome {
    let result = run.result().await;
    let disposed = run.dispose().await;
    match (result, disposed) {
        (Ok(result), Ok(())) => match result.stop_reason {
            StopReason::Completed => JobOutcome::Completed {
                output: result.output.iter().filter_map(|b| b.as_text()).collect(),
            },
            StopReason::Aborted => JobOutcome::Killed,
            other => JobOutcome::Failed {
                detail: match result.diagnostic {
                    Some(diagnostic) => format!("{other}; diagnostic: {diagnostic}"),
                    None => other.to_string(),
                },
            },
        },
        (Err(error), Ok(())) => JobOutcome::Failed {
            detail: error.to_string(),
        },
        (Ok(_), Err(error)) => JobOutcome::Failed {
            detail: format!("dispose failed: {error}"),
        },
        (Err(result), Err(dispose)) => JobOutcome::Failed {
            detail: format!("{result}; dispose failed: {dispose}"),
        },
    }
}
