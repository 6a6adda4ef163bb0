//! The engine's contract with its front ends, its ground floor: the error codes
//! ([`ErrorCode`]), the events a job streams ([`Event`]), the engine's activity, and how
//! conversations are named and seen ([`ConversationId`], [`Tier`], [`ConversationInfo`]), and
//! what a model is ([`ModelCard`]). It imports nothing from the rest of the crate. Their serde
//! shapes are pinned by tests and mirrored into the UI's generated TypeScript types.

mod card;
mod code;
mod conversation;
mod events;

pub use card::*;
pub use code::ErrorCode;
pub use conversation::*;
pub use events::*;
