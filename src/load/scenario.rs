//! Provides [`Scenario`]: what a load run does, from flags or a TOML or JSON file, checked
//! before anything starts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, Result, SubagentError};

/// Where a load run persists its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(clap::ValueEnum)]
pub enum LoadStore {
    /// The embedded sled store (a fresh temporary directory unless `store_dir` names one).
    #[default]
    Sled,
    /// The in-memory store.
    Memory,
    /// A PostgreSQL database, at `store_url`.
    Postgres,
}

/// When a load run's root agents make their logs durable. Children follow the delegation
/// layer's own rules whatever their parent does: a one-shot child adds no checkpoint of its own, and every
/// continuable epoch ends with a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(clap::ValueEnum)]
pub enum LoadFlush {
    /// Only when asked (disposal drains the log; a continuable epoch ends with a flush).
    #[default]
    OnRequest,
    /// At every step end.
    EveryStep,
}

/// A simulated model latency, in milliseconds. A scenario file gives it as a table
/// (`{kind = "uniform", min = 2, max = 10}`), a number of milliseconds (`latency = 5`), or the
/// flag's text (`latency = "2..10"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Latency {
    /// The same delay for every model call.
    Fixed {
        /// Milliseconds.
        ms: u64,
    },
    /// A delay drawn uniformly from `min..=max` (seeded, so a run repeats).
    Uniform {
        /// The shortest delay, milliseconds.
        min: u64,
        /// The longest delay, milliseconds.
        max: u64,
    },
}

impl Default for Latency {
    fn default() -> Self {
        Self::Fixed { ms: 0 }
    }
}

impl std::str::FromStr for Latency {
    type Err = String;

    /// `5` (fixed) or `2..10` (uniform), in milliseconds.
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let number = |part: &str| {
            part.trim().parse::<u64>().map_err(|_| {
                format!("`{text}` is not a number of milliseconds or a range MIN..MAX")
            })
        };
        match text.split_once("..") {
            Some((min, max)) => Ok(Self::Uniform {
                min: number(min)?,
                max: number(max)?,
            }),
            None => Ok(Self::Fixed { ms: number(text)? }),
        }
    }
}

/// [`Latency`]'s table form.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum LatencyTable {
    Fixed { ms: u64 },
    Uniform { min: u64, max: u64 },
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(LatencyVisitor)
    }
}

/// Reads each form a scenario file may give a latency in.
struct LatencyVisitor;

impl<'de> serde::de::Visitor<'de> for LatencyVisitor {
    type Value = Latency;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(
            "a number of milliseconds, a range \"MIN..MAX\", or a table with kind \"fixed\" \
             (ms) or \"uniform\" (min, max)",
        )
    }

    fn visit_u64<E: serde::de::Error>(self, ms: u64) -> std::result::Result<Latency, E> {
        Ok(Latency::Fixed { ms })
    }

    fn visit_i64<E: serde::de::Error>(self, ms: i64) -> std::result::Result<Latency, E> {
        u64::try_from(ms)
            .map(|ms| Latency::Fixed { ms })
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(ms), &self))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> std::result::Result<Latency, E> {
        text.parse().map_err(E::custom)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        map: A,
    ) -> std::result::Result<Latency, A::Error> {
        let table = LatencyTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(match table {
            LatencyTable::Fixed { ms } => Latency::Fixed { ms },
            LatencyTable::Uniform { min, max } => Latency::Uniform { min, max },
        })
    }
}

/// What a load run does. Every field has a default that finishes in seconds on two cores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Root agents (host-owned parents).
    pub roots: u64,
    /// Children each parent delegates to.
    pub children: u64,
    /// Delegation levels below each root: continuable children at a level below `depth`
    /// delegate `children` continuable children of their own, from their own turn.
    pub depth: u64,
    /// The share of one-shot children started through `fork` (the rest through `spawn`). Every
    /// share picks evenly spread members by position, so counts are exact and repeatable.
    #[serde(alias = "fork-share")]
    pub fork_share: f64,
    /// The share of each root's direct children that are continuable (the rest one-shot).
    #[serde(alias = "continuable-share")]
    pub continuable_share: f64,
    /// Follow-ups sent to each continuable child, each after the previous epoch settled (so
    /// each one cold-resumes the child).
    pub followups: u64,
    /// The share of each root's continuable children that report to it (quietly) from their
    /// first turn, through a `report` tool.
    #[serde(alias = "report-share")]
    pub report_share: f64,
    /// The share of continuable children interrupted right after their last follow-up.
    #[serde(alias = "interrupt-share")]
    pub interrupt_share: f64,
    /// The share of continuable children started with a one-turn budget: their follow-ups are
    /// refused with `BUDGET_EXHAUSTED`.
    #[serde(alias = "budget-share")]
    pub budget_share: f64,
    /// The simulated model latency.
    pub latency: Latency,
    /// Where sessions are persisted.
    pub store: LoadStore,
    /// The sled directory (default: a fresh temporary directory, removed afterwards).
    #[serde(alias = "store-dir")]
    pub store_dir: Option<PathBuf>,
    /// The PostgreSQL connection string (required with the `postgres` store). Never written
    /// out: the report's JSON leaves it out, as it may hold a password.
    #[serde(skip_serializing, alias = "store-url")]
    pub store_url: Option<String>,
    /// The sled store's page cache, in MiB (default [`DEFAULT_STORE_CACHE_MIB`]). The run
    /// writes far more than it reads back, and mostly what it wrote moments before (the
    /// store keeps its most recent sessions decoded besides), so a cache of sled's own default
    /// (1 GiB, which it overshoots) grew a run's memory without making it faster.
    #[serde(alias = "store-cache-mib", skip_serializing_if = "Option::is_none")]
    pub store_cache_mib: Option<u64>,
    /// Cluster nodes on the PostgreSQL store (1: no cluster). The roots live on the first
    /// node and place their direct children round-robin on every node; a child placed on
    /// another node is sent its first follow-up at once, which chases it there while its
    /// first turn runs (a cross-node follow-up), and its later follow-ups cold-resume it on
    /// the roots' node.
    pub nodes: u64,
    /// When the root agents flush (children follow their own rules; see [`LoadFlush`]).
    pub flush: LoadFlush,
    /// The roots page out their settled events beyond this many
    /// ([`crate::AgentOptions::resident_events`]), so a root that settles a million children
    /// holds a bounded log; 0 keeps each root's whole log in memory.
    #[serde(alias = "resident-events")]
    pub resident_events: u32,
    /// Threads agents run on, the harness's own among them (0: one per core; at most 256).
    pub workers: usize,
    /// The most direct children of the roots in flight at once, across the run (a child's
    /// whole life counts: start, follow-ups, settlement). A window keeps memory bounded, so
    /// a million children run in the memory of `in_flight`.
    #[serde(alias = "in-flight")]
    pub in_flight: u64,
    /// The seed of every choice and drawn latency: a run with the same seed makes the same
    /// choices.
    pub seed: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            roots: 4,
            children: 250,
            depth: 1,
            fork_share: 0.25,
            continuable_share: 0.5,
            followups: 1,
            report_share: 0.1,
            interrupt_share: 0.1,
            budget_share: 0.1,
            latency: Latency::default(),
            store: LoadStore::Sled,
            store_dir: None,
            store_url: None,
            store_cache_mib: None,
            nodes: 1,
            flush: LoadFlush::OnRequest,
            resident_events: DEFAULT_RESIDENT_EVENTS,
            workers: 0,
            in_flight: 10_000,
            seed: 1,
        }
    }
}

/// How many of its newest events a root keeps in memory, unless the scenario says otherwise:
/// a few turns' worth (a root's turn is about ten events), paged out in steps of this many.
pub const DEFAULT_RESIDENT_EVENTS: u32 = 4096;

/// The most cluster nodes a run starts.
const MAX_NODES: u64 = 16;

/// The sled page cache of a run that does not choose one, in MiB. At
/// `--roots 1 --children 200000` a run grew as fast with 64 MiB, 256 MiB or sled's own
/// 1 GiB, and peaked at 890 MiB, 1,084 MiB and 2,000 MiB of RSS; its listing of the whole
/// forest took 3.1 s, 3.1 s and 2.4 s.
pub const DEFAULT_STORE_CACHE_MIB: u64 = 256;

/// The largest sled page cache a run asks for, in MiB (1 TiB): its size in bytes must fit.
const MAX_STORE_CACHE_MIB: u64 = 1 << 20;

/// The longest simulated model call: an hour.
const MAX_LATENCY_MS: u64 = 3_600_000;

/// The most threads a run's agents spread over: beyond the cores they only add switching, and
/// each holds file descriptors of its own (a hundred thousand ran out of them).
const MAX_WORKERS: usize = 256;

/// An out-of-range field, named as the flag that sets it and as the scenario file's field.
fn invalid(field: &str, detail: &str) -> SubagentError {
    let flag = match field {
        "store_url" => "--store".to_owned(),
        field => format!("--{}", field.replace('_', "-")),
    };
    SubagentError::new(
        ErrorCode::InvalidArgs,
        format!("`{flag}` (scenario field `{field}`) {detail}"),
    )
}

impl Scenario {
    /// Reads a scenario file: TOML (`.toml`) or JSON (anything else); fields left out keep
    /// their defaults, and each may be spelled in snake_case or kebab-case (`in_flight` or
    /// `in-flight`). The result is validated.
    ///
    /// # Errors
    /// `INVALID_ARGS` naming the file and what is wrong with it (an unknown field, a value of
    /// the wrong type, a value out of range).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("cannot read scenario file {}: {error}", path.display()),
            )
        })?;
        let parsed: std::result::Result<Self, String> = if path
            .extension()
            .is_some_and(|extension| extension == "toml")
        {
            toml::from_str(&text).map_err(|error| error.to_string())
        } else {
            serde_json::from_str(&text).map_err(|error| {
                if error.is_syntax() || error.is_eof() {
                    format!("expected TOML (a `.toml` file) or JSON: {error}")
                } else {
                    error.to_string()
                }
            })
        };
        let scenario = parsed.map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("scenario file {}: {}", path.display(), error.trim()),
            )
        })?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks every field's range.
    ///
    /// # Errors
    /// `INVALID_ARGS` naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        if self.roots == 0 {
            return Err(invalid("roots", "must be at least 1"));
        }
        if self.children == 0 {
            return Err(invalid("children", "must be at least 1"));
        }
        if self.depth == 0 {
            return Err(invalid("depth", "must be at least 1"));
        }
        if self.workers > MAX_WORKERS {
            return Err(invalid(
                "workers",
                "must be at most 256 (0 runs one per core)",
            ));
        }
        if self.in_flight == 0 {
            return Err(invalid("in_flight", "must be at least 1"));
        }
        for (field, share) in [
            ("fork_share", self.fork_share),
            ("continuable_share", self.continuable_share),
            ("report_share", self.report_share),
            ("interrupt_share", self.interrupt_share),
            ("budget_share", self.budget_share),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(invalid(field, "must be a share between 0 and 1"));
            }
        }
        match self.latency {
            Latency::Uniform { min, max } if min > max => {
                return Err(invalid("latency", "must have min <= max"));
            }
            Latency::Fixed { ms } | Latency::Uniform { max: ms, .. } if ms > MAX_LATENCY_MS => {
                return Err(invalid("latency", "must be at most an hour (3600000 ms)"));
            }
            _ => {}
        }
        if self.store != LoadStore::Sled && self.store_dir.is_some() {
            return Err(invalid("store_dir", "applies only to the sled store"));
        }
        match self.store_cache_mib {
            Some(_) if self.store != LoadStore::Sled => {
                return Err(invalid("store_cache_mib", "applies only to the sled store"));
            }
            Some(mib) if !(1..=MAX_STORE_CACHE_MIB).contains(&mib) => {
                return Err(invalid(
                    "store_cache_mib",
                    "must be between 1 and 1048576 (MiB)",
                ));
            }
            _ => {}
        }
        match (self.store, &self.store_url) {
            (LoadStore::Postgres, None) => {
                return Err(invalid("store_url", "is required with the postgres store"));
            }
            (LoadStore::Sled | LoadStore::Memory, Some(_)) => {
                return Err(invalid("store_url", "applies only to the postgres store"));
            }
            _ => {}
        }
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return Err(invalid("nodes", "must be between 1 and 16"));
        }
        if self.nodes > 1 && self.store != LoadStore::Postgres {
            return Err(invalid(
                "nodes",
                "above 1 needs the postgres store (the nodes share it)",
            ));
        }
        if self.total_children().is_none() {
            return Err(invalid("children", "makes a forest too large to count"));
        }
        Ok(())
    }

    /// The sled page cache the run opens its store with, in bytes.
    pub fn store_cache_bytes(&self) -> u64 {
        self.store_cache_mib
            .unwrap_or(DEFAULT_STORE_CACHE_MIB)
            .min(MAX_STORE_CACHE_MIB)
            << 20
    }

    /// How many children the run creates in all, when that fits in a `u64`.
    pub fn total_children(&self) -> Option<u64> {
        // Level 1: every root's children; each deeper level: every continuable child above
        // it delegates `children` continuable children.
        let first = self.roots.checked_mul(self.children)?;
        let mut level = self
            .roots
            .checked_mul(share_count(self.children, self.continuable_share))?;
        let mut total = first;
        for _ in 1..self.depth {
            level = level.checked_mul(self.children)?;
            total = total.checked_add(level)?;
        }
        Some(total)
    }
}

/// Whether the `index`-th of a sequence is in a `share` of it: the chosen ones are spread
/// evenly, and exactly `share_count(n, share)` of the first `n` are chosen.
#[allow(clippy::cast_precision_loss)] // Indexes past 2^53 would only blur the spacing.
pub fn in_share(index: u64, share: f64) -> bool {
    let before = (index as f64 * share).floor();
    let after = ((index + 1) as f64 * share).floor();
    after > before
}

/// How many of the first `n` of a sequence [`in_share`] chooses.
// A validated share is within 0..=1, so the product is within 0..=n and fits.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
pub fn share_count(n: u64, share: f64) -> u64 {
    (n as f64 * share).floor() as u64
}
