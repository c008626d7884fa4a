//! `Sealed`: in a private module, so only this crate can implement
//! [`Bodies`](super::Bodies): the layer's responses carry one of its bodies.

/// Only this crate's body modes implement [`Bodies`](super::Bodies).
pub trait Sealed {}
