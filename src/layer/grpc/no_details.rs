//! Without tollgate's `tonic` feature there is nothing to encode `google.rpc`
//! details with: gRPC answers carry the status, the message and the pushback
//! only. The same functions as `details.rs`, doing nothing.

use std::time::Duration;

use http::HeaderMap;

use super::status::Code;
use crate::decision::Decision;
use crate::policy::Policy;
pub(super) enum Violation {}

pub(super) fn insert(_: &mut HeaderMap, _: Code, _: &str, _: Option<Duration>, _: Vec<Violation>) {}

pub(super) fn exhausted(_: &Policy, _: &Decision, _: &str) -> Vec<Violation> {
    Vec::new()
}

pub(super) fn too_costly(_: &Policy, _: u64, _: &str) -> Vec<Violation> {
    Vec::new()
}
