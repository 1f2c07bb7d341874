//! Every actix actor of the crate, one file per actor kind, and the services that talk to them.

pub(crate) mod activation;
pub mod agent;
pub mod agents;
pub(crate) mod manager;
pub(crate) mod owner;
pub mod providers;
pub(crate) mod registry;
pub mod service;
pub(crate) mod workers;

/// Opens the mailbox of one of the runtime's shared actors (the registry, the delegation service,
/// the continuation manager, a provider) without bound. Every caller sends to these; actix's
/// default capacity of 16 parks each `send` beyond it, which allocates and costs a wakeup per
/// parked sender, while what can be queued is already bounded by the callers' own concurrency
/// (each awaits its answer).
pub(crate) fn unbounded_mailbox<A>(ctx: &mut actix::Context<A>)
where
    A: actix::Actor<Context = actix::Context<A>>,
{
    // Zero is actix's unbounded: a sender parks only when a capacity is set and reached (and
    // the capacity is subtracted from the channel's sender limit, so a huge one overflows).
    ctx.set_mailbox_capacity(0);
}
