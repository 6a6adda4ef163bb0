//! The engine's contract with its front ends, its ground floor: the error codes
//! ([`ErrorCode`]), the events a job streams ([`Event`]), the engine's activity, and how
//! conversations are named and seen ([`ConversationId`], [`Tier`], [`ConversationInfo`]), and
//! what a model is ([`ModelCard`]); those are defined here and import nothing from the rest of
//! the crate. Every other type that crosses the engine's handle (memory reports and
//! estimates, the cache menu, prompts and their parts, statuses, the limits) is defined
//! beside the code that makes it and re-exported here: `contract::` is its one public path.
//! Their serde shapes are pinned by tests and mirrored into the UI's generated TypeScript
//! types.

mod card;
mod code;
mod compare;
mod conversation;
mod events;

pub use card::*;
pub use code::ErrorCode;
pub use compare::*;
pub use conversation::*;
pub use events::*;

pub use crate::budget::FitOption;
pub use crate::budget::MemoryFit;
pub use crate::card::MemoryEstimate;
pub use crate::chat::ChatOptions;
pub use crate::chat::Message;
pub use crate::chat::Role;
pub use crate::chat::TemplateSource;
pub use crate::chat::Tool;
pub use crate::chat::ToolCall;
pub use crate::checkpoint::weights::WeightsChoice;
pub use crate::checkpoint::weights::WEIGHTS_CHOICES;
pub use crate::constrain::Constraint;
pub use crate::device::DeviceChoice;
pub use crate::generate::sampling::SamplingParams;
pub use crate::generate::session::REWIND_MARGIN;
pub use crate::generate::stop::MAX_STOPS;
pub use crate::generate::Prompt;
pub use crate::generate::PromptPreview;
pub use crate::generate::StopToken;
pub use crate::generate::DEFAULT_MAX_TOKENS;
pub use crate::generate::PREFILL_CHUNK;
pub use crate::images::{ImageInfo, MAX_IMAGES_PER_PROMPT};
pub use crate::kv::cache_options;
pub use crate::kv::presets;
pub use crate::kv::suggested_policy;
pub use crate::kv::CacheChoice;
pub use crate::kv::CacheOptions;
pub use crate::kv::CachePreset;
pub use crate::kv::CacheSelection;
pub use crate::kv::FormatOption;
pub use crate::kv::LabeledSpec;
pub use crate::kv::LayerScope;
pub use crate::kv::PresetFidelity;
pub use crate::kv::ScopedSpecs;
pub use crate::kv::SideFormat;
pub use crate::memory::format_bytes;
pub use crate::memory::ByteCount;
pub use crate::memory::ContextCost;
pub use crate::memory::DocumentFit;
pub use crate::memory::KindBytes;
pub use crate::memory::KvBytes;
pub use crate::memory::KvPart;
pub use crate::memory::LayerBytes;
pub use crate::memory::MemorySample;
pub use crate::memory::SwitchEvent;
pub use crate::models::vision::preprocess::{
    ImageLimits, Processor as ImageProcessor, ResizedImage,
};
pub use crate::worker::CacheFileInfo;
pub use crate::worker::EngineStatus;
pub use crate::worker::PoolCounters;
pub use crate::worker::StepCounters;
pub use crate::worker::DEFAULT_DISK_BUDGET;
pub use crate::worker::DEFAULT_IDLE_TTL;
pub use crate::worker::DEFAULT_LOAD_CONTEXT;
pub use crate::worker::MAX_PARALLEL;
pub use crate::worker::MAX_QUEUED;
pub use crate::worker::MAX_RUNNING;
pub use crate::worker::PER_CLIENT_QUEUED;
