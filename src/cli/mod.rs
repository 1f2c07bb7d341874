//! The command-line tool's commands other than the demo.

pub(crate) mod acp_agent;
pub(crate) mod check;
pub(crate) mod delegate;
pub(crate) mod load;
pub(crate) mod model;
pub(crate) mod node;
pub(crate) mod plot;
pub(crate) mod replay;
mod span_loss;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod tree;
