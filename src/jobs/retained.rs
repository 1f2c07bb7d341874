//! Which ended jobs the registry still keeps: a long-running host starts job after job, so
//! only the most recently ended ones stay readable, per owner and in all.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};

use super::Job;
use crate::ids::SessionId;

/// How many ended jobs the registry keeps per owner (the most recently ended).
pub const ENDED_JOBS_PER_OWNER: usize = 64;

/// How many ended jobs the registry keeps in all (the most recently ended).
pub const ENDED_JOBS: usize = 4096;

/// Ids a queue may hold beyond twice its kept ones before it sweeps out forgotten ones.
const SWEEP_SLACK: usize = 64;

/// Ended jobs in settlement order, and how many of them are still kept. Forgetting a job
/// through one queue leaves its id in the other: such ids are skipped (an id is never reused)
/// and swept once they outnumber the kept ones.
#[derive(Default)]
struct Queue {
    ids: VecDeque<String>,
    kept: usize,
}

impl Queue {
    fn push(&mut self, id: &str) {
        self.ids.push_back(id.to_owned());
        self.kept += 1;
    }

    /// Takes out the oldest kept job nobody waits on.
    fn take_oldest(&mut self, jobs: &BTreeMap<String, Job>) -> Option<String> {
        while self.ids.front().is_some_and(|id| !jobs.contains_key(id)) {
            self.ids.pop_front();
        }
        let index = self
            .ids
            .iter()
            .position(|id| jobs.get(id).is_some_and(Job::forgettable))?;
        self.ids.remove(index)
    }

    fn sweep(&mut self, jobs: &BTreeMap<String, Job>) {
        if self.ids.len() > 2 * self.kept + SWEEP_SLACK {
            self.ids.retain(|id| jobs.contains_key(id));
        }
    }
}

/// The ended jobs a registry keeps: at most [`ENDED_JOBS_PER_OWNER`] per owner and
/// [`ENDED_JOBS`] in all, the oldest forgotten first. A job a wait is still returning is
/// skipped until the wait ends; a running job is never here.
#[derive(Default)]
pub(super) struct Retained {
    all: Queue,
    by_owner: HashMap<SessionId, Queue>,
}

impl Retained {
    /// Records that job `id` of `owner` ended, and forgets what that pushes over a bound.
    pub(super) fn ended(&mut self, owner: SessionId, id: &str, jobs: &mut BTreeMap<String, Job>) {
        self.all.push(id);
        self.by_owner.entry(owner).or_default().push(id);
        self.forget_overflow(owner, jobs);
    }

    /// Forgets the oldest ended jobs beyond `owner`'s share and beyond the overall bound.
    pub(super) fn forget_overflow(&mut self, owner: SessionId, jobs: &mut BTreeMap<String, Job>) {
        loop {
            let owner_over = self
                .by_owner
                .get(&owner)
                .is_some_and(|queue| queue.kept > ENDED_JOBS_PER_OWNER);
            let oldest = if owner_over {
                self.by_owner
                    .get_mut(&owner)
                    .and_then(|queue| queue.take_oldest(jobs))
            } else if self.all.kept > ENDED_JOBS {
                self.all.take_oldest(jobs)
            } else {
                None
            };
            let Some(id) = oldest else { break };
            self.forget(&id, jobs);
        }
        self.all.sweep(jobs);
        if let Some(queue) = self.by_owner.get_mut(&owner) {
            queue.sweep(jobs);
        }
    }

    fn forget(&mut self, id: &str, jobs: &mut BTreeMap<String, Job>) {
        let Some(job) = jobs.remove(id) else { return };
        self.all.kept = self.all.kept.saturating_sub(1);
        if let Entry::Occupied(mut queue) = self.by_owner.entry(job.owner_id) {
            let kept = &mut queue.get_mut().kept;
            *kept = kept.saturating_sub(1);
            if queue.get().kept == 0 {
                queue.remove();
            }
        }
    }
}
