//! Every actix actor of the crate, one file per actor kind.

pub mod agent;
pub mod agents;
pub mod providers;
pub mod runtime;
