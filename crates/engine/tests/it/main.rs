//! The engine's integration tests, one binary: each file here was its own test binary, and
//! each linked the engine, candle and the tokenizers again (about 300 of a cold build's
//! crate-seconds for 24 binaries). `tests/threads.rs` stays apart: the compute thread count is
//! a process fact it sets once.

mod common;

mod batched_step;
mod batched_worker;
mod cache_equivalence;
mod config_parsing;
mod conversations;
mod engine_compare;
mod engine_worker;
mod format_roundtrip;
mod generation_real;
mod gguf_converted;
mod hostile_churn;
mod hostile_files;
mod hostile_mutations;
mod hub_download;
mod hub_gguf;
mod isq;
mod isq_real;
mod kv_layers;
mod kv_persist;
mod kv_turboquant;
mod loading_errors;
mod parity;
mod real_model;
mod scoring;
mod text_real;
mod tokenizer_gguf_real;
mod tools_constrained;
mod vision;
mod vision_turns;
