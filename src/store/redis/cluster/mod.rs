//! A store on a Redis Cluster (cargo feature `cluster`).

mod nodes;
mod slots;
mod spread;

pub(crate) use nodes::Nodes;
pub(crate) use slots::{hash_slot, others_in_first_slot};
