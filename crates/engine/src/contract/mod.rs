//! The engine's contract with its front ends, its ground floor: the error codes
//! ([`ErrorCode`]), the events a job streams ([`Event`]) and the engine's activity. Their serde
//! shapes are pinned by tests and mirrored into the UI's generated TypeScript types. Reached
//! as `kvlab_engine::events` too.

mod code;
mod events;

pub use code::ErrorCode;
pub use events::*;
