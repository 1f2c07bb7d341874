//! Provides the checks every out-of-process provider's configuration shares: positive finite
//! bounds, and the working-directory rules (validated once at load, resolved at each start).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{ErrorCode, Result, SubagentError};

/// The largest grace a provider accepts, in milliseconds (the TypeScript runtime's timer limit).
pub const MAX_GRACE_MS: f64 = 2_147_483_647.0;

/// The default `disposeGraceMs`: 3 s between SIGTERM and SIGKILL.
pub fn default_dispose_grace_ms() -> f64 {
    3000.0
}

/// The default `disposeEofGraceMs`: 6 s to exit after stdin closes (it outlasts the SIGTERM
/// grace, so a child that flushes on EOF can finish).
pub fn default_dispose_eof_grace_ms() -> f64 {
    6000.0
}

/// The default `startupTimeoutMs`: 60 s for a child to finish its handshake and open its
/// session (or thread). A child that has not answered by then fails the start
/// (`CHILD_START_FAILED`, `stage: startup; category: timeout`) and is reaped.
pub fn default_startup_timeout_ms() -> f64 {
    60_000.0
}

fn invalid_config(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidConfig, message)
}

/// The default `maxFrameBytes`: [`DEFAULT_MAX_FRAME_BYTES`](super::DEFAULT_MAX_FRAME_BYTES).
pub fn default_max_frame_bytes() -> usize {
    super::ndjson::DEFAULT_MAX_FRAME_BYTES
}

/// Accepts a positive byte count; refuses 0 with `"<prefix>: <name> must be a positive number
/// of bytes"` (`INVALID_CONFIG`).
pub fn positive_bytes(prefix: &str, name: &str, value: usize) -> Result<usize> {
    if value > 0 {
        Ok(value)
    } else {
        Err(invalid_config(format!(
            "{prefix}: {name} must be a positive number of bytes"
        )))
    }
}

/// Accepts a positive finite `value`; refuses 0, negatives, NaN and ±∞ with
/// `"<prefix>: <name> must be a positive finite number"` (`INVALID_CONFIG`).
pub fn positive_finite(prefix: &str, name: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(invalid_config(format!(
            "{prefix}: {name} must be a positive finite number"
        )))
    }
}

/// A grace in milliseconds: positive, finite and at most [`MAX_GRACE_MS`], else
/// `"<prefix>: <name> must be a positive finite number no greater than 2147483647"`.
pub fn grace_ms(prefix: &str, name: &str, value: f64) -> Result<Duration> {
    if value.is_finite() && value > 0.0 && value <= MAX_GRACE_MS {
        Ok(Duration::from_secs_f64(value / 1000.0))
    } else {
        Err(invalid_config(format!(
            "{prefix}: {name} must be a positive finite number no greater than 2147483647"
        )))
    }
}

/// Which working directory a message talks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CwdLabel {
    /// The provider's configured override.
    Config,
    /// The delegating parent session's cwd.
    ParentSession,
}

impl CwdLabel {
    fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config cwd",
            Self::ParentSession => "parent session cwd",
        }
    }
}

/// Accepts an absolute path to a directory this process may enter.
///
/// # Errors
/// `"<prefix>: <label> must be an absolute path: <cwd>"` for a relative path, and
/// `"<prefix>: <label> is not an accessible directory: <cwd>"` for a missing path, a file, or
/// a directory without search permission (`INVALID_CONFIG`).
pub fn usable_cwd(prefix: &str, label: CwdLabel, cwd: &Path) -> Result<PathBuf> {
    let label = label.as_str();
    if !cwd.is_absolute() {
        return Err(invalid_config(format!(
            "{prefix}: {label} must be an absolute path: {}",
            cwd.display()
        )));
    }
    // `read_dir` needs read permission too; search permission is what entering it takes, and
    // a metadata query of `.` inside it succeeds exactly when the directory can be searched.
    let searchable = cwd.is_dir() && std::fs::metadata(cwd.join(".")).is_ok();
    if searchable {
        Ok(cwd.to_path_buf())
    } else {
        Err(invalid_config(format!(
            "{prefix}: {label} is not an accessible directory: {}",
            cwd.display()
        )))
    }
}

/// Checks a configured cwd override once, at load: `None` means no override; an empty one is
/// refused; a relative one resolves against `launch_dir` (the harness's launch directory) and
/// is then checked like any other.
///
/// # Errors
/// `"<prefix>: config cwd must not be empty — omit the key to inherit the parent session cwd"`,
/// or a [`usable_cwd`] failure (`INVALID_CONFIG`).
pub fn validate_configured_cwd(
    prefix: &str,
    configured: Option<&Path>,
    launch_dir: &Path,
) -> Result<Option<PathBuf>> {
    let Some(configured) = configured else {
        return Ok(None);
    };
    if configured.as_os_str().is_empty() {
        return Err(invalid_config(format!(
            "{prefix}: config cwd must not be empty — omit the key to inherit the parent session cwd"
        )));
    }
    let resolved = launch_dir.join(configured);
    usable_cwd(prefix, CwdLabel::Config, &resolved).map(Some)
}

/// The child's working directory at start: the configured override wins; otherwise the parent
/// session's cwd, checked now. This process's own cwd is never used.
///
/// # Errors
/// A [`usable_cwd`] failure of the parent's cwd, or, when neither exists,
/// `"<prefix>: no working directory for the child — configure `cwd` or delegate from a parent
/// session that has one"` (`INVALID_CONFIG`).
pub fn resolve_child_cwd(
    prefix: &str,
    configured: Option<&Path>,
    parent_cwd: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(configured) = configured {
        return Ok(configured.to_path_buf());
    }
    match parent_cwd {
        Some(parent) => usable_cwd(prefix, CwdLabel::ParentSession, parent),
        None => Err(invalid_config(format!(
            "{prefix}: no working directory for the child — configure `cwd` or delegate from a \
             parent session that has one"
        ))),
    }
}

/// A dispose grace in milliseconds, checked in two steps: `"<prefix>: disposeGraceMs must be
/// a positive finite number"`, then `"<prefix>: disposeGraceMs must be no greater than
/// 2147483647"` (`INVALID_CONFIG`).
pub fn dispose_grace(prefix: &str, value: f64) -> Result<Duration> {
    positive_finite(prefix, "disposeGraceMs", value)?;
    if value > MAX_GRACE_MS {
        return Err(invalid_config(format!(
            "{prefix}: disposeGraceMs must be no greater than 2147483647"
        )));
    }
    Ok(Duration::from_secs_f64(value / 1000.0))
}

/// Refuses an empty `value` for the configuration key `key` (`INVALID_CONFIG`).
pub fn require_non_empty(prefix: &str, key: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(invalid_config(format!("{prefix}: {key} must not be empty")));
    }
    Ok(())
}

/// The refusal of a provider that takes its cwd only from the parent session, for a parent
/// without one (`INVALID_CONFIG`).
pub fn no_parent_cwd(prefix: &str) -> SubagentError {
    invalid_config(format!(
        "{prefix}: no working directory for the child — delegate from a parent session that \
         has one"
    ))
}
