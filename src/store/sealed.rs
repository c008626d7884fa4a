//! `Sealed`: in a private module, so only this crate can implement
//! [`Store`](super::Store) (see the [module docs](crate::store#why-store-is-sealed)).

/// Only this crate's stores implement [`Store`](super::Store).
pub trait Sealed {}
