//! The model domain: what the machine offers, the default model, a model's card and memory
//! estimate before loading, and loading it.

pub mod commands;
