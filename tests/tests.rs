//! The integration suite: one module per area, linked once.

mod support;

/// Durability of live agents: faults on failed writes, leases.
mod agent_durability;
/// Agent inbox: follow-up FIFO, inject, steer, cancel with and without keep-inbox.
mod agent_inbox;
/// The registry: create/resume transactions, exact identity, disposal.
mod agent_registry;
/// The turn driver: tools, stop reasons, cancellation records.
mod agent_turn;
/// The cluster's seeded fault campaign: node processes under a nemesis, then a checker.
mod campaign;
/// `subagents delegate`: one delegation through a provider from the command line.
mod cli_delegate;
/// A cluster of runtimes: children placed on another node, asked across nodes.
mod cluster;
/// A cluster under faults: late answers, dead and restarted nodes, hand-overs, drains.
mod cluster_faults;
/// Three `subagents node` processes: a forest across them, one node killed mid-turn.
mod cluster_nodes;
/// A cold resume reads its child's log once and repairs an interrupted turn durably.
mod cold_resume;
/// Continuable children: start, follow-up, interrupt, reports, notices, drains.
mod continuable;
/// Continuable children: who reaches a child (only its parent, through the manager), who hears
/// from it (the parent session), and interrupt authority whatever the residency.
mod continuable_authority;
/// Continuable children: per-child budgets of turns, tokens and wall time.
mod continuable_budget;
/// Continuable children at the edges: notices, collisions, cancellation, policy, the lifecycle
/// invariant.
mod continuable_edges;
/// Bad input at the seam: empty content, budgets that cannot be recorded, unknown ids.
mod continuable_inputs;
/// Continuable children: the model-based property test over random forests.
mod continuable_model;
/// Continuable children: teardown failures, drains, notices to a closing lineage, setup, policy.
mod continuable_teardown;
/// Continuable children in narrow windows: races with tokens, drains, the final flush.
mod continuable_windows;
/// Killing a writer process mid-turn and recovering its store.
mod crash;
/// The error surface: every code's string is pinned.
mod errors;
/// The event bus: listener containment and scopes.
mod events;
/// Fork seeds stored by reference (issue #16).
mod fork_reference;
/// The history checker: seeded random schedules, every promise checked.
mod histories;
/// Background jobs: the registry, the job tools, and background one-shot delegations.
mod jobs;
/// Durable listing: list_children and list_descendants, the identity ladder, the cache.
mod listing;
/// The load harness: a small scenario verifies and reports; a broken scenario is refused.
mod load;
/// The metrics a runtime records with a meter, read back as Prometheus text and over OTLP.
mod metrics;
/// The scripted model and the block assembler.
mod model;
/// Cluster membership on PostgreSQL: one process per node id, takeovers, leaves.
mod node_membership;
/// The OpenAI-compatible adapter against a scripted local server; one turn through the runtime.
mod openai;
/// The out-of-process contract: capabilities, bounds, cwd rules, settlement.
mod out_of_process;
/// Ownership: edges, retiring owners, child-first disposal and shutdown, drop safety.
mod ownership;
/// A long-lived agent that pages out its settled events (issue #16).
mod paging;
/// Session projections: the timing and identity units, the registry's cells.
mod projection;
/// The ACP provider against the reference peer, `subagents acp-agent`.
mod provider_acp;
/// The Claude Code provider against a replayed stream-json CLI.
mod provider_claude;
/// The Codex app-server provider against a replayed NDJSON wire.
mod provider_codex;
/// The PostgreSQL schema migration: once across runtimes, refused when newer, bounded waits.
mod schema_migration;
/// The seam: descriptor, persona, tool filter, delegated policy.
mod seam_composition;
/// The seam: fork seeding.
mod seam_fork;
/// The seam: one-shot runs, depth and settlement.
mod seam_one_shot;
/// The seam: output selection.
mod seam_output;
/// The seam: provider registry, capability validation, lifecycle events.
mod seam_registry;
/// The seam: structured output and the schema subset.
mod seam_structured;
/// Session log envelope, invariants, seeds, folds.
mod session_log;
/// Waiting for continuable children: each epoch's settlement, per child.
mod settlements;
/// Stores: the model-based property test, corruption, repair, leases.
mod store;
/// The PostgreSQL store, on a throwaway server.
mod store_postgres;
/// A parent's stored inbox while it is away: notices written from a checkpoint.
mod stored_inbox;
/// Tools: layers, restrictions, guards, parallel calls.
mod tools;
/// The control tools: send_message, interrupt_agent, list_agents.
mod tools_control;
/// The report tool, granted to continuable children.
mod tools_report;
/// The model-facing `subagent` tool: mounting, wording, routes, errors, configuration.
mod tools_subagent;
/// The narrated tour behind `subagents demo`.
mod tour;
/// The spans of a delegation tree: one trace, each child's turns under its delegating call.
mod trace;
