//! Provides [`SessionHeader`]: the frozen record stored beside a session's log.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;

/// The session format this crate writes and reads.
pub const SESSION_FORMAT_VERSION: u32 = 0;

/// The largest integer JavaScript represents exactly (its "safe integer" bound), kept so logs
/// stay readable by the TypeScript runtime.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Where a session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionOrigin {
    /// Created by a delegation.
    Subagent,
}

/// The header of a session: identity and lineage, stored outside the event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionHeader {
    /// Format version; must be [`SESSION_FORMAT_VERSION`].
    pub version: u32,
    /// The session id.
    pub id: SessionId,
    /// Creation time, epoch milliseconds.
    pub created_at: u64,
    /// Working directory; absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The delegating parent's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<SessionId>,
    /// How many inherited events the seed holds (markers excluded); omitted when 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_length: Option<u64>,
    /// Where the seed is stored, when it is stored by reference (a fork child's inherited
    /// prefix, read from its parent's log instead of a copy in its own); omitted when the seed
    /// is stored inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_reference: Option<Box<SeedReference>>,
    /// Set for delegated sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<SessionOrigin>,
    /// The session's delegation depth (0 for a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_depth: Option<u64>,
    /// An agent preset name (kept for format compatibility; unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// (A boxed `str`: two words where a `String` takes three, in a header every live log
    /// holds.)
    pub agent_preset: Option<Box<str>>,
}

impl SessionHeader {
    /// A root header for `id`, created now.
    pub fn new(id: SessionId) -> Self {
        Self {
            version: SESSION_FORMAT_VERSION,
            id,
            created_at: now_ms(),
            cwd: None,
            parent_session: None,
            seed_length: None,
            seed_reference: None,
            origin: None,
            delegation_depth: None,
            agent_preset: None,
        }
    }

    /// The seed length, 0 when omitted.
    pub fn seed_len(&self) -> u64 {
        self.seed_length.unwrap_or(0)
    }

    /// The first seq the session's own stored log holds: its seed length when the seed is
    /// stored by reference, else 0.
    pub fn first_stored_seq(&self) -> u64 {
        self.seed_reference
            .as_ref()
            .map_or(0, |reference| reference.length)
    }

    /// Checks every field rule.
    ///
    /// # Errors
    /// `INVALID_HEADER` naming the first broken rule.
    pub fn validate(&self) -> Result<()> {
        let fail = |why: String| Err(SubagentError::new(ErrorCode::InvalidHeader, why));
        if self.version != SESSION_FORMAT_VERSION {
            return fail(format!(
                "session {}: unsupported format version {}",
                self.id, self.version
            ));
        }
        if self.created_at > MAX_SAFE_INTEGER {
            return fail(format!(
                "session {}: createdAt is not a safe integer",
                self.id
            ));
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.is_absolute() {
                return fail(format!(
                    "session {}: cwd {} is not absolute",
                    self.id,
                    cwd.display()
                ));
            }
        }
        if self.parent_session == Some(self.id) {
            return fail(format!("session {} names itself as its parent", self.id));
        }
        if let Some(reference) = &self.seed_reference {
            if reference.session == self.id {
                return fail(format!("session {} seeds itself from its own log", self.id));
            }
            if reference.length == 0 || self.seed_length != Some(reference.length) {
                return fail(format!(
                    "session {}: its seed reference names {} events, its seedLength says {}",
                    self.id,
                    reference.length,
                    self.seed_len()
                ));
            }
        }
        for (name, value) in [
            ("seedLength", self.seed_length),
            ("delegationDepth", self.delegation_depth),
        ] {
            if value.is_some_and(|v| v > MAX_SAFE_INTEGER) {
                return fail(format!("session {}: {name} is not a safe integer", self.id));
            }
        }
        Ok(())
    }

    /// Whether two headers describe the same session lifecycle (listing's identity rule).
    pub fn same_lifecycle(&self, other: &Self) -> bool {
        self.version == other.version
            && self.id == other.id
            && self.created_at == other.created_at
            && self.cwd == other.cwd
            && self.parent_session == other.parent_session
            && self.seed_length == other.seed_length
            && self.seed_reference == other.seed_reference
            && self.delegation_depth == other.delegation_depth
    }
}

/// A seed stored by reference: the first `length` events of `session`'s log, whose last event
/// must still digest to `tail`.
///
/// A log is append-only and its seqs contiguous, so a prefix never changes once written; the
/// digest guards the one way it could: a parent whose unflushed events a crash lost, and that
/// then wrote others at the same seqs (the fork's creation waits for the prefix to be written,
/// so only a store that breaks its own ordering could show one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedReference {
    /// The session whose log holds the seed (the fork's parent).
    pub session: SessionId,
    /// How many events of its log the seed is (`[0, length)`); equals the header's seedLength.
    pub length: u64,
    /// The digest of the seed's last event (see [`SeedReference::digest`]).
    pub tail: u64,
    /// How many references a reader follows to reach every event of the seed: 1 when
    /// `session` stores its own log whole, one more for each fork of a fork.
    pub links: u32,
}

impl SeedReference {
    /// The digest a reference keeps of its seed's last event: FNV-1a (64-bit) over the event's
    /// JSON encoding, which is canonical for the events this crate writes.
    pub fn digest(event: &crate::session::SessionEvent) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0100_0000_01b3;
        // An event that does not encode cannot be stored either; its digest is never compared.
        serde_json::to_vec(event)
            .unwrap_or_default()
            .iter()
            .fold(OFFSET, |hash, byte| {
                (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
            })
    }
}

/// Now, in epoch milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
