//! Provides [`ForkInProcess`]: the `fork` provider — an in-process child seeded with the
//! parent's completed turns.

use super::{InProcess, InProcessKind};
use crate::actors::providers::in_process::SeedPolicy;

/// The `fork` kind: each child is seeded with the parent's completed-turn prefix.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fork;

impl InProcessKind for Fork {
    const NAME: &'static str = "fork";
    const SEED: SeedPolicy = SeedPolicy::CompletedTurns;
}

/// The `fork` provider: each child is seeded with the parent's balanced completed-turn prefix
/// (every event through the parent's last `turn/end`; the in-flight turn is left out), so it
/// continues the parent's conversation, in the parent's runtime, with every start-time
/// capability. A parent with no completed turn forks a fresh child. Continuable fork children
/// capture the prefix once, at creation.
pub type ForkInProcess = InProcess<Fork>;
