//! Tower middleware for HTTP and gRPC: [`RateLimitLayer`] and its [`RateLimit`]
//! service.
#![doc = include_str!("../docs/layer.md")]
#![doc = include_str!("../docs/delay.md")]
#![doc = include_str!("../docs/settle.md")]
#![doc = include_str!("../docs/tables.md")]
#![doc = include_str!("../docs/headers.md")]
#![doc = include_str!("../docs/grpc.md")]
#![doc = include_str!("../docs/stacking.md")]

// A one-way stack; each file imports only from files to its left:
// headers -> media -> dyn_key -> options -> settle -> config -> outcome -> report ->
// (http_answer | grpc) -> prepare -> decide -> check, then body -> future ->
// service -> layer; and
// the policy tables, options -> rule_key -> (grpc) -> rule -> table ->
// (table_file) -> layer.
// tests/layout.rs checks that no file of src/ imports, directly or not, a
// file that imports it.
mod bodies;
mod body;
mod check;
mod config;
mod decide;
mod dyn_key;
mod future;
mod grpc;
mod headers;
mod held;
mod http_answer;
#[allow(clippy::module_inception)]
mod layer;
mod media;
mod options;
mod outcome;
mod prepare;
mod report;
mod rule;
mod rule_key;
mod sealed;
mod service;
mod settle;
mod table;
#[cfg(feature = "serde")]
mod table_file;
#[cfg(test)]
mod tests;

#[cfg(feature = "axum")]
pub use bodies::AxumBody;
pub use bodies::{Bodies, Wrapped};
pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use grpc::{GRPC_RETRY_PUSHBACK_MS, grpc_method, is_grpc};
pub use headers::{
    RATELIMIT, RATELIMIT_POLICY, STORE_RETRY_AFTER, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
#[cfg(feature = "axum")]
pub use layer::AxumRateLimitLayer;
pub use layer::RateLimitLayer;
pub use options::{
    Choice, DEFAULT_MAX_WAITING, Delay, HeaderStyle, MissingKey, OnStoreError, Rejection,
};
pub use outcome::{Delayed, ShadowRejection, StoreFailure};
pub use rule::PolicyRule;
pub use rule_key::RuleKey;
pub use service::RateLimit;
pub use settle::{ResponseHead, Settle};
pub use table::PolicyTable;
