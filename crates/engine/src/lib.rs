//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.
//!
//! # The surface
//! - **What a model is and costs:** [`card`] (the card and the pre-load [`MemoryEstimate`],
//!   from headers alone), [`config`], [`source`] (where a model comes from), [`device`].
//! - **Running it:** [`worker`] (the engine thread: [`Engine`], [`EngineHandle`], jobs in,
//!   events out), [`model`] ([`Model`], [`LoadOptions`]), [`generate`] (requests, prompts and
//!   the one decode loop, [`generate::Sequence`]), [`compare`], [`fidelity`], [`sampling`],
//!   [`chat`], [`tokenizer`], [`stream`] and [`detok`] (streaming text).
//! - **The cache and its memory:** [`kv`] (layout × precision, SPEC strings, the presets),
//!   [`memory`] (byte formulas, costs, timeline samples, switch markers).
//! - **The contract with front ends:** [`events`] (events, the one [`ErrorCode`], activity),
//!   [`JobError`]. Their serde shapes are pinned by tests and mirrored into the UI's generated
//!   TypeScript types.
//!
//! Internal: the weight store (`weights`; its [`WeightFormat`] and GGUF name mapping are
//! re-exported), a conversation's cache and history (`session`, re-exported as [`Session`]),
//! and the typed error ([`EngineError`]).

pub mod budget;
pub mod card;
pub mod chat;
pub mod compare;
pub mod config;
pub mod detok;
pub mod device;
mod error;
pub mod events;
pub mod family;
pub mod fidelity;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod model;
pub mod profile;
pub(crate) mod qmatmul;
pub mod sampling;
mod session;
pub mod source;
pub mod stream;
pub mod threads;
pub mod tokenizer;
pub(crate) mod vmath;
mod weights;
pub mod worker;

pub use card::{MemoryEstimate, ModelCard};
pub use config::ModelConfig;
pub use error::{EngineError, Result};
pub use events::ErrorCode;
pub use kv::{KvCache, KvPrecision, KvStorage, PrecisionPolicy};
pub use model::{LoadOptions, Logits, Model};
#[cfg(feature = "bench")]
pub use qmatmul::bench::{matmul_bench as bench_matmul, MatmulBenchRow};
pub use session::Session;
pub use source::ModelSource;
pub use weights::{gguf_name, WeightFormat, WeightsChoice, WEIGHTS_CHOICES};
pub use worker::{Engine, EngineHandle, JobError};
