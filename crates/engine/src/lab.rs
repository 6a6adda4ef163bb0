//! The lab: what the CLI's lab commands (perplexity, fidelity, sweeps, benchmarks) and the
//! engine's integration tests drive directly, beneath the engine thread: the model and its
//! logits, a cache and its storages, a session, scoring, and the benchmarks. Not for front
//! ends, which go through the handle and [`crate::contract`]. Feature `lab`.

pub use crate::bench::bench_matmul;
pub use crate::bench::decode::bench_decode;
pub use crate::bench::decode::bench_decode_compare;
pub use crate::bench::decode::bench_prefill_each;
pub use crate::bench::decode::BenchContext;
pub use crate::bench::decode::CompareReport as DecodeCompareReport;
pub use crate::bench::decode::CompareRow as DecodeCompareRow;
pub use crate::bench::decode::DecodeBenchReport;
pub use crate::bench::decode::DecodeBenchSpec;
pub use crate::bench::decode::ProfileRow;
pub use crate::bench::golden::check_golden;
pub use crate::bench::golden::GoldenReport;
pub use crate::card::inspect;
pub use crate::checkpoint::config::hf::load_config as load_hf_config;
pub use crate::checkpoint::config::hf::parse_config as parse_hf_config;
pub use crate::checkpoint::config::KvSource;
pub use crate::checkpoint::config::ModelConfig;
pub use crate::checkpoint::config::RopeKind;
pub use crate::checkpoint::weights::gguf_name;
pub use crate::checkpoint::Checkpoint;
pub use crate::device::preferred_dtype;
pub use crate::device::select_device;
pub use crate::generate::detok::Detokenizer;
pub use crate::generate::fidelity::compare_caches;
pub use crate::generate::fidelity::compare_caches_from;
pub use crate::generate::fidelity::compare_many_from;
pub use crate::generate::fidelity::FidelityReport;
pub use crate::generate::fidelity::PositionFidelity;
pub use crate::generate::fit::{allocate as fit_allocate, probes as fit_probes};
pub use crate::generate::fit::{
    FitBudget, Fitted, LayerSensitivity, Probe, Sensitivity, PROBE_BITS,
};
pub use crate::generate::plain_transcript;
pub use crate::generate::preview_prompt;
pub use crate::generate::sampling::Sampler;
pub use crate::generate::score::chunked_logits;
pub use crate::generate::score::next_token_logprobs;
pub use crate::generate::score::normalize_text;
pub use crate::generate::score::ChunkSchedule;
pub use crate::generate::score::Perplexity;
pub use crate::generate::session::Session;
pub use crate::generate::sweep::bits_per_coordinate;
pub use crate::generate::sweep::lockstep_batches;
pub use crate::generate::sweep::quantile;
pub use crate::kv::new_storage;
pub use crate::kv::parse_policy;
pub use crate::kv::persist::peek as peek_cache_file;
pub use crate::kv::persist::weights_identity;
pub use crate::kv::AttendSpec;
pub use crate::kv::CacheSpec;
pub use crate::kv::KvCache;
pub use crate::kv::KvLayout;
pub use crate::kv::KvPrecision;
pub use crate::kv::PrecisionPolicy;
pub use crate::kv::SideSpec;
pub use crate::kv::StorageShape;
pub use crate::memory::estimate_kv_allocated;
pub use crate::memory::estimate_kv_bytes;
pub use crate::memory::estimate_kv_bytes_at_once;
pub use crate::memory::switch_precision;
pub use crate::memory::token_costs;
pub use crate::models::common::BatchItem;
pub use crate::models::common::Logits;
pub use crate::models::common::Model;
pub use crate::models::common::SoftSpan;
pub use crate::models::vision::config::{ImageTokens, VisionConfig};
// The processor and its limits cross the handle: `contract::{ImageProcessor, ImageLimits}`.
pub use crate::models::vision::preprocess::{
    decode as decode_image, DEFAULT_SOFT_TOKENS, SOFT_TOKEN_BUDGETS,
};
pub use crate::models::vision::{Encoded, Patches, VisionTower};
pub use crate::tokenizer::gguf::build as build_gguf_tokenizer;
pub use crate::tokenizer::gguf::tokenizer_from_file as gguf_tokenizer_from_file;
pub use crate::tokenizer::GemmaTokenizer;
pub use crate::tokenizer::TokenizerError;
