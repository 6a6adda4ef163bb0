//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.
//!
//! # The surface
//! - **What a model is and costs:** [`checkpoint`] (a checkpoint read once: where it comes
//!   from, its weights and [`LoadOptions`], its configuration and chat template, side by
//!   side), [`card`] (the card and the pre-load [`MemoryEstimate`], from headers alone),
//!   [`models`] (each family's facts in its folder, the shared decoder in `models::common`), [`device`], [`budget`] (whether a load, a context or a switch fits).
//! - **Running it:** [`worker`] (the engine thread: [`Engine`], [`EngineHandle`], jobs in,
//!   events out), [`Model`] (the decoder), [`generate`] (requests, prompts,
//!   the one decode loop [`generate::Sequence`], and its parts: `compare`, `fidelity`,
//!   `sampling`, `stream`, `detok`, `sweep`; a conversation's cache
//!   and ids are a [`Session`] with the one [`REWIND_MARGIN`]), [`chat`], [`tokenizer`].
//! - **The cache and its memory:** [`kv`] (layout × precision, each precision's byte formula,
//!   switches planned then applied, SPEC strings, the presets and cache menu), [`memory`]
//!   (reported bytes, estimates and costs, timeline samples, switch markers, process memory).
//! - **The contract with front ends:** [`contract`] (events, the one [`ErrorCode`], activity,
//!   the model card; it imports nothing from the rest of the crate),
//!   [`JobError`]. Their serde shapes are pinned by tests and mirrored into the UI's generated
//!   TypeScript types.
//! - **Measuring (feature `bench`):** `bench` (decode benchmark, golden checks, matmul timings).
//!
//! Internal: the weight store (`checkpoint::weights`; its weights choice and GGUF name
//! mapping are re-exported), the seam to the quantized CPU kernels of `kvlab-cpu` (`qmatmul`), and the
//! typed error ([`EngineError`]).

#[cfg(feature = "bench")]
pub mod bench;
pub mod budget;
pub mod card;
pub mod chat;
pub mod checkpoint;
pub mod constrain;
pub mod contract;
mod conversations;
pub mod device;
mod error;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod models;
pub mod profile;
pub(crate) mod qmatmul;
pub mod threads;
pub mod tokenizer;
pub mod worker;

#[cfg(feature = "bench")]
pub use bench::{bench_matmul, MatmulBenchRow};
pub use card::MemoryEstimate;
pub use checkpoint::config::ModelConfig;
pub use checkpoint::source::ModelSource;
pub use checkpoint::weights::{gguf_name, WeightsChoice, WEIGHTS_CHOICES};
pub use checkpoint::LoadOptions;
pub use error::{EngineError, Result};
pub use generate::session::{Session, REWIND_MARGIN};
pub use kv::{KvCache, KvPrecision, KvStorage, PrecisionPolicy};
pub use models::common::{BatchItem, Logits, Model};
pub use worker::{Engine, EngineHandle, JobError};
