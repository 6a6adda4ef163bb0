//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.

pub mod card;
pub mod chat;
pub mod compare;
pub mod config;
pub mod detok;
pub mod device;
pub mod error;
pub mod events;
pub mod fidelity;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod model;
pub mod sampling;
pub mod session;
pub mod source;
pub mod stream;
pub mod tokenizer;
pub mod weights;
pub mod worker;

pub use card::{MemoryEstimate, ModelCard};
pub use config::ModelConfig;
pub use error::{EngineError, Result};
pub use events::ErrorCode;
pub use kv::{KvCache, KvPrecision, KvStorage, PrecisionPolicy};
pub use model::{LoadOptions, Logits, Model};
pub use source::ModelSource;
pub use weights::{WeightsChoice, WEIGHTS_CHOICES};
pub use worker::{Engine, EngineHandle, JobError};
