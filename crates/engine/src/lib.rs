//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.
//!
//! # The surface
//! - **What a model is and costs:** [`card`] (the card and the pre-load [`MemoryEstimate`],
//!   from headers alone), [`config`], [`family`], [`source`] (where a model comes from),
//!   [`device`], [`budget`] (whether a load, a context or a switch fits).
//! - **Running it:** [`worker`] (the engine thread: [`Engine`], [`EngineHandle`], jobs in,
//!   events out), [`model`] ([`Model`], [`LoadOptions`]), [`generate`] (requests, prompts,
//!   the one decode loop [`generate::Sequence`], and its parts re-exported at the root:
//!   [`compare`], [`fidelity`], [`sampling`], [`stream`], [`detok`]; a conversation's cache
//!   and ids are a [`Session`] with the one [`REWIND_MARGIN`]), [`chat`], [`tokenizer`].
//! - **The cache and its memory:** [`kv`] (layout × precision, each precision's byte formula,
//!   switches planned then applied, SPEC strings, the presets and cache menu), [`memory`]
//!   (reported bytes, estimates and costs, timeline samples, switch markers, process memory).
//! - **The contract with front ends:** [`contract`] (also reached as `events`: events, the
//!   one [`ErrorCode`], activity),
//!   [`JobError`]. Their serde shapes are pinned by tests and mirrored into the UI's generated
//!   TypeScript types.
//! - **Measuring (feature `bench`):** `bench` (decode benchmark, golden checks, matmul timings).
//!
//! Internal: the weight store (`weights`; its [`WeightFormat`] and GGUF name mapping are
//! re-exported), the seam to the quantized CPU kernels of `kvlab-cpu` (`qmatmul`), and the
//! typed error ([`EngineError`]).

#[cfg(feature = "bench")]
pub mod bench;
pub mod budget;
pub mod card;
pub mod chat;
pub mod config;
pub mod contract;
mod conversations;
pub mod device;
mod error;
pub mod family;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod model;
pub mod profile;
pub(crate) mod qmatmul;
pub mod source;
pub mod threads;
pub mod tokenizer;
mod weights;
pub mod worker;

#[cfg(feature = "bench")]
pub use bench::{bench_matmul, MatmulBenchRow};
pub use card::{MemoryEstimate, ModelCard};
pub use config::ModelConfig;
/// The contract under its older name: `kvlab_engine::events::Event`.
pub use contract as events;
pub use contract::ErrorCode;
pub use error::{EngineError, Result};
pub use generate::session::{Session, REWIND_MARGIN};
pub use kv::{KvCache, KvPrecision, KvStorage, PrecisionPolicy};
pub use model::{LoadOptions, Logits, Model};
// Generation's parts keep their short paths (`kvlab_engine::sampling::SamplingParams`).
pub use generate::{compare, detok, fidelity, sampling, stream, sweep};
pub use source::ModelSource;
pub use weights::{gguf_name, WeightFormat, WeightsChoice, WEIGHTS_CHOICES};
pub use worker::{Engine, EngineHandle, JobError};
