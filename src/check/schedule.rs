//! Provides [`Op`] and [`schedule`]: the operations a history-checker schedule is made of, and
//! the pure function from a seed to a schedule, so a seed names its schedule exactly.

use std::fmt;

use serde::Serialize;

use crate::load::mix;
use crate::testing::StoreOperation;

/// A node of the schedule's forest, by position among the nodes known when the operation runs
/// (taken modulo their number): roots first, then children in the order their starts were
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pick(pub u32);

impl Pick {
    /// The position this pick names among `len` candidates, or `None` when there is none.
    pub fn among(self, len: usize) -> Option<usize> {
        (len > 0).then(|| usize::try_from(self.0).unwrap_or(usize::MAX) % len)
    }
}

/// Who sends a follow-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sender {
    /// The child's parent, as the agent live now.
    Parent,
    /// An incarnation of the parent that was disposed (a stale reference): refused.
    StaleParent,
    /// Another root: refused.
    Stranger,
}

/// Under which authority an interrupt is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Authority {
    /// The user, naming the child's parent session: accepted.
    Parent,
    /// The child's root as a live ancestor: accepted while the root is live.
    Ancestor,
    /// The user, naming another session: refused.
    WrongParent,
    /// Another root as an ancestor: refused.
    Stranger,
}

/// How the caller lets go of an operation before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LetGo {
    /// It waits for the answer.
    Never,
    /// Its cancellation token fires after this many scheduler turns.
    Cancel(u8),
    /// Its future is dropped after this many scheduler turns (its outcome is unknown).
    Drop(u8),
}

/// One operation of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// A continuable start under a node (a root, or a resident child as a continuable parent).
    Start {
        /// The parent node.
        parent: Pick,
        /// Through `fork` (seeded with the parent's turns) rather than `spawn`.
        fork: bool,
        /// The child's first turn waits at a gate until a `release`.
        hold: bool,
        /// A budget of this many turns.
        budget: Option<u8>,
        /// How the caller lets go of it.
        let_go: LetGo,
        /// Issued without waiting for its answer (it races what follows).
        background: bool,
    },
    /// A one-shot child under a node: one delegation, one result, always disposed.
    OneShot {
        /// The parent node.
        parent: Pick,
        /// Through `fork` rather than `spawn`.
        fork: bool,
        /// The child's turn waits at a gate until a `release` (the operation then runs in
        /// the background: its result waits for the gate).
        hold: bool,
        /// How the caller lets go of the start and the result.
        let_go: LetGo,
        /// Issued without waiting for its result.
        background: bool,
    },
    /// Follow-ups to a child, sent at once.
    Followup {
        /// The child.
        child: Pick,
        /// How many, sent together.
        burst: u8,
        /// The first one's turn waits at a gate until a `release`.
        hold: bool,
        /// Raises the child's budget.
        raise: bool,
        /// Who sends them.
        sender: Sender,
        /// How the caller lets go of them.
        let_go: LetGo,
        /// Issued without waiting for the answers.
        background: bool,
    },
    /// An interrupt of a child.
    Interrupt {
        /// The child.
        child: Pick,
        /// Under which authority.
        authority: Authority,
    },
    /// A resident child reports to its parent.
    Report {
        /// The child.
        child: Pick,
        /// Quiet (next step, no wake) rather than waking.
        quiet: bool,
    },
    /// A held turn completes.
    Release {
        /// The gate.
        gate: Pick,
    },
    /// A scoped drain below a node.
    Drain {
        /// The node.
        node: Pick,
    },
    /// A root parent's handle is disposed (its children run on).
    DisposeRoot {
        /// The root.
        root: Pick,
    },
    /// A disposed root is resumed by concurrent `Agents::resume` calls.
    ResumeRoot {
        /// The root.
        root: Pick,
        /// How many calls race.
        racers: u8,
    },
    /// A store operation fails (or waits) for the next operations.
    Fault {
        /// The store operation.
        operation: StoreOperation,
        /// Held (it waits) rather than failing.
        hold: bool,
        /// For how many operations.
        ops: u8,
    },
    /// The driver lets the runtime run for a while.
    Pause {
        /// Scheduler turns to yield (over 30: a millisecond's sleep too).
        yields: u8,
    },
    /// The runtime is shut down and a new one opened on the same store (the roots resumed).
    Reopen {
        /// Shut down with the operations in flight and the turns held, rather than once
        /// every operation settled.
        abrupt: bool,
    },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(text) => f.write_str(&text),
            Err(_) => write!(f, "{self:?}"),
        }
    }
}

/// A seeded stream of draws (SplitMix64 over a counter).
#[derive(Debug, Clone)]
pub(crate) struct Draws {
    seed: u64,
    counter: u64,
}

impl Draws {
    pub(crate) fn new(seed: u64) -> Self {
        Self { seed, counter: 0 }
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.counter += 1;
        mix(self.seed ^ mix(self.counter))
    }

    /// A draw in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        match n {
            0 => 0,
            n => self.next() % n,
        }
    }

    /// True with `percent` percent probability.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick(&mut self) -> Pick {
        Pick(u32::try_from(self.below(u64::from(u32::MAX))).unwrap_or(0))
    }

    fn small(&mut self, below: u64) -> u8 {
        u8::try_from(self.below(below)).unwrap_or(0)
    }

    fn let_go(&mut self, faults: bool) -> LetGo {
        match self.below(100) {
            0..=9 => LetGo::Cancel(self.small(6)),
            10..=15 if faults => LetGo::Drop(self.small(6)),
            _ => LetGo::Never,
        }
    }
}

/// How many settled events the roots of schedule `seed` keep in memory
/// ([`crate::AgentOptions::resident_events`]): a third of the seeds page their roots' logs out
/// after every turn that allows it (keeping 1, 2 or 3 events), so the promises are checked
/// across page-outs too; the rest keep everything. Drawn apart from the operations, so a seed
/// names the same operations with or without paging.
pub fn roots_resident_events(seed: u64) -> Option<std::num::NonZeroU32> {
    // A stream of its own: the schedule's operations draw from `Draws::new(seed)`.
    let mut draws = Draws::new(mix(seed ^ 0x7061_6769_6e67));
    match draws.below(3) {
        0 => std::num::NonZeroU32::new(1 + u32::try_from(draws.below(3)).unwrap_or(0)),
        _ => None,
    }
}

/// What a schedule may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// How many operations.
    pub ops: usize,
    /// Whether store operations fail or wait, and futures are dropped.
    pub faults: bool,
    /// Whether the runtime is shut down and reopened mid-schedule.
    pub reopen: bool,
}

/// The schedule `seed` names, of the given shape: a pure function of both.
pub fn schedule(seed: u64, shape: Shape) -> Vec<Op> {
    let mut draws = Draws::new(seed);
    (0..shape.ops).map(|_| op(&mut draws, shape)).collect()
}

fn op(draws: &mut Draws, shape: Shape) -> Op {
    const FAULTED: [StoreOperation; 8] = [
        StoreOperation::Append,
        StoreOperation::Create,
        StoreOperation::Flush,
        StoreOperation::Inspect,
        StoreOperation::AcquireLease,
        StoreOperation::ReleaseLease,
        StoreOperation::CachePut,
        StoreOperation::Read,
    ];
    let roll = draws.below(100);
    match roll {
        0..=21 => Op::Start {
            parent: draws.pick(),
            fork: draws.chance(25),
            hold: draws.chance(30),
            budget: draws.chance(10).then(|| 1 + draws.small(2)),
            let_go: draws.let_go(shape.faults),
            background: draws.chance(35),
        },
        22..=47 => Op::Followup {
            child: draws.pick(),
            burst: match draws.chance(20) {
                true => 1 + draws.small(4),
                false => 1,
            },
            hold: draws.chance(25),
            raise: draws.chance(15),
            sender: match draws.below(100) {
                0..=7 => Sender::StaleParent,
                8..=13 => Sender::Stranger,
                _ => Sender::Parent,
            },
            let_go: draws.let_go(shape.faults),
            background: draws.chance(40),
        },
        48..=55 => Op::Interrupt {
            child: draws.pick(),
            authority: match draws.below(4) {
                0 => Authority::Parent,
                1 => Authority::Ancestor,
                2 => Authority::WrongParent,
                _ => Authority::Stranger,
            },
        },
        56..=61 => Op::Report {
            child: draws.pick(),
            quiet: draws.chance(50),
        },
        62..=75 => Op::Release { gate: draws.pick() },
        76..=79 => Op::Drain { node: draws.pick() },
        80..=83 => Op::DisposeRoot { root: draws.pick() },
        84..=88 => Op::ResumeRoot {
            root: draws.pick(),
            racers: 1 + draws.small(3),
        },
        89..=92 if shape.faults => Op::Fault {
            operation: FAULTED[usize::try_from(draws.below(8)).unwrap_or(0)],
            hold: draws.chance(40),
            ops: 1 + draws.small(4),
        },
        93 if shape.reopen => Op::Reopen {
            abrupt: draws.chance(50),
        },
        94..=97 => Op::OneShot {
            parent: draws.pick(),
            fork: draws.chance(25),
            hold: draws.chance(30),
            let_go: draws.let_go(shape.faults),
            background: draws.chance(35),
        },
        _ => Op::Pause {
            yields: draws.small(40),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_its_schedule() {
        let shape = Shape {
            ops: 64,
            faults: true,
            reopen: true,
        };
        assert_eq!(schedule(7, shape), schedule(7, shape));
        assert_ne!(schedule(7, shape), schedule(8, shape));
        let ops = schedule(7, shape);
        assert!(ops.iter().any(|op| matches!(op, Op::Start { .. })));
        assert!(ops.iter().any(|op| matches!(op, Op::Followup { .. })));
        assert!(ops.iter().any(|op| matches!(op, Op::OneShot { .. })));
    }

    #[test]
    fn reopens_come_both_settled_and_abrupt() {
        let shape = Shape {
            ops: 512,
            faults: true,
            reopen: true,
        };
        let reopens: Vec<bool> = (0..8)
            .flat_map(|seed| schedule(seed, shape))
            .filter_map(|op| match op {
                Op::Reopen { abrupt } => Some(abrupt),
                _ => None,
            })
            .collect();
        assert!(
            reopens.contains(&true) && reopens.contains(&false),
            "{reopens:?}"
        );
    }

    #[test]
    fn a_third_of_the_seeds_page_their_roots_out() {
        let paging = (0..3000u64)
            .filter_map(roots_resident_events)
            .map(std::num::NonZeroU32::get)
            .collect::<Vec<_>>();
        assert!(
            (800..1200).contains(&paging.len()),
            "{} of 3000",
            paging.len()
        );
        assert!(paging.iter().all(|keep| (1..=3).contains(keep)));
        assert_eq!(roots_resident_events(7), roots_resident_events(7));
    }

    #[test]
    fn a_schedule_without_faults_has_none() {
        let shape = Shape {
            ops: 512,
            faults: false,
            reopen: false,
        };
        let ops = schedule(3, shape);
        assert!(!ops
            .iter()
            .any(|op| matches!(op, Op::Fault { .. } | Op::Reopen { .. })));
        assert!(!ops.iter().any(|op| matches!(
            op,
            Op::Start {
                let_go: LetGo::Drop(_),
                ..
            } | Op::Followup {
                let_go: LetGo::Drop(_),
                ..
            } | Op::OneShot {
                let_go: LetGo::Drop(_),
                ..
            }
        )));
    }
}
