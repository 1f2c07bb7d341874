//! Every actix actor of the crate, one file per actor kind, and the services that talk to them.

pub(crate) mod activation;
pub mod agent;
pub mod agents;
pub(crate) mod manager;
pub mod providers;
pub(crate) mod registry;
pub mod service;
pub(crate) mod workers;
