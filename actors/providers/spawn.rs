//! Provides [`SpawnInProcess`]: the `spawn` provider — a fresh in-process child per delegation.

use super::{InProcess, InProcessKind};
use crate::actors::providers::in_process::SeedPolicy;

/// The `spawn` kind: each child starts fresh.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spawn;

impl InProcessKind for Spawn {
    const NAME: &'static str = "spawn";
    const SEED: SeedPolicy = SeedPolicy::Fresh;
}

/// The `spawn` provider: each child starts fresh (it does not see the parent's conversation),
/// in the parent's runtime, with every start-time capability. It can also prepare continuable
/// children (which start fresh too).
pub type SpawnInProcess = InProcess<Spawn>;
