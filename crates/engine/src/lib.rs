//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.
//!
//! # The face
//! One path per item, four doors:
//! - **The root:** the engine thread's handle ([`Engine`], [`EngineHandle`]), the requests it
//!   takes ([`LoadRequest`], [`GenerateRequest`], [`CompareRequest`], [`LoadOptions`],
//!   [`ModelSource`], [`PoolSettings`], [`MemoryBudget`]), the tickets it gives
//!   ([`Ticket`], [`Submission`]) and its errors ([`JobError`], [`EngineError`]).
//! - **[`contract`]:** every type that crosses the handle (events, statuses, the card, memory
//!   reports and estimates, the cache menu and presets, prompts and their parts, the limits)
//!   and the error codes. Their serde shapes are pinned by tests and mirrored into the UI's
//!   generated TypeScript types.
//! - **[`host`]:** what the process asks of the machine (threads, resident memory, the
//!   clock); **[`hub`]:** models on the Hugging Face hub (feature `hub` for downloads).
//! - **`lab`** (feature `lab`): the model, caches, sessions, scoring and benchmarks that the
//!   CLI's lab commands and the engine's own integration tests drive directly.
//!
//! Inside, by concern: `checkpoint` (a checkpoint read once), `card`, `models` (each family's
//! facts in its folder, the shared decoder in `models::common`), `device`, `budget`,
//! `worker` (the engine thread), `generate` (the one decode loop and its parts), `chat`,
//! `tokenizer`, `constrain`, `kv` (layout × precision: `kv::format`, `kv::spec`,
//! `kv::split`), `memory`, `conversations` (the pool), `qmatmul` (the seam to `kvlab-cpu`).

// Without the lab face (the app's build) what only the lab drives looks unused; every build
// with it (the CLI's, the tests', clippy in scripts/test.sh) checks for dead code in full.
#![cfg_attr(not(feature = "lab"), allow(dead_code, unused_imports))]

#[cfg(feature = "lab")]
mod bench;
mod budget;
mod card;
mod chat;
mod checkpoint;
mod constrain;
pub mod contract;
mod conversations;
mod device;
mod error;
mod generate;
mod images;
mod kv;
mod memory;
mod models;
mod profile;
mod qmatmul;
mod threads;
mod tokenizer;
mod worker;

pub use budget::MemoryBudget;
pub use checkpoint::source::ModelSource;
pub use checkpoint::LoadOptions;
pub use error::{EngineError, Result};
pub use generate::compare::CompareRequest;
pub use generate::GenerateRequest;
pub use worker::{
    ActivityListener, Engine, EngineHandle, JobError, LoadRequest, PoolSettings, Submission, Ticket,
};

/// What the process asks of the machine: compute threads, resident memory, the clock.
pub mod host {
    pub use crate::memory::{
        peak_rss_bytes, release_free_memory, reset_peak_rss, unix_ms, RssProbe,
    };
    pub use crate::threads::{
        compute_threads, desktop_default, from_env as threads_from_env, physical_cores,
        set_compute_threads, ThreadsError,
    };
}

/// Models on the Hugging Face hub: ids, the GGUF quantizations a repository offers, and
/// (feature `hub`) downloads.
pub mod hub {
    pub use crate::checkpoint::source::gguf_quants::GgufQuant;
    #[cfg(feature = "hub")]
    pub use crate::checkpoint::source::hub::{
        download_model, download_repo, list_gguf_quants, DownloadProgress, HubOptions,
    };
    #[cfg(feature = "hub")]
    pub use crate::checkpoint::source::hub_retry::RetryPolicy;
    pub use crate::checkpoint::source::{find_tokenizer, hub_id, ResolvedModel, SourceError};
}

#[cfg(feature = "lab")]
pub mod lab;
