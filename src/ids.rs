//! Provides the identifier newtypes: [`SessionId`], [`MessageId`], [`RunId`] and [`CallId`].
//!
//! Session, message and run ids are UUIDs (v7 for sessions, so keys sort by creation time in the
//! store; v4 elsewhere). A tool-call id is whatever the model sent, so it is a string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A hash map for the runtime's hot lookups by id: foldhash, seeded per process, in place of
/// SipHash. Ids are minted UUIDs (or a caller's), so the keys are short and the map needs no
/// more than a per-process seed against a crafted collision.
pub(crate) type FastHashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The set form of [`FastHashMap`].
pub(crate) type FastHashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $mint:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        // The UUID's own order compares its bytes as a slice; as one big-endian integer the
        // order is the same, in a few instructions (a drain sorts its hundred thousand
        // children by id).
        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.0.as_u128().cmp(&other.0.as_u128())
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            /// Mints a fresh, unique id.
            pub fn new() -> Self {
                Self(Uuid::$mint())
            }

            /// Wraps an existing UUID.
            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// The UUID inside.
            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }

            /// The 16 big-endian bytes of the UUID, as stored in keys.
            pub const fn as_bytes(&self) -> &[u8; 16] {
                self.0.as_bytes()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// Identifies a session, and so the agent that runs it: a child's id is its session id.
    SessionId,
    now_v7
);
uuid_id!(
    /// Identifies one message; unique across an agent's pending inbox.
    MessageId,
    new_v4
);
uuid_id!(
    /// Identifies one observed subagent run (one-shot) or one Activation epoch (continuable).
    RunId,
    new_v4
);

/// Identifies one tool call within an assistant message, as the model named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(String);

impl CallId {
    /// Wraps the model's call id.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Ids sort as their stored keys do: by their 16 big-endian bytes.
        #[test]
        fn ids_order_as_their_bytes(a in any::<[u8; 16]>(), b in any::<[u8; 16]>()) {
            let (left, right) = (
                SessionId::from_uuid(Uuid::from_bytes(a)),
                SessionId::from_uuid(Uuid::from_bytes(b)),
            );
            prop_assert_eq!(left.cmp(&right), a.cmp(&b));
            prop_assert_eq!(left.cmp(&left), std::cmp::Ordering::Equal);
        }
    }
}
