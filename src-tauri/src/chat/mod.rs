//! The chat domain: turns streamed from the engine, the prompt preview, the side-by-side
//! comparison, and the conversation's cache (menu, costs, switches).

pub mod commands;
