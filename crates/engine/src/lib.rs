//! KV Lab engine: loads Gemma models with candle, runs them over a per-layer KV cache whose
//! layout and precision are separate axes, and reports memory exactly. Knows nothing of Tauri.
