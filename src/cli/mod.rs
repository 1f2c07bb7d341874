//! The command-line tool's commands other than the demo.

pub(crate) mod tree;
