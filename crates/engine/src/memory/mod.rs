//! Memory accounting shared by the app and the CLI: KV bytes as reported (`bytes`),
//! estimated before they exist (`estimate`), sampled over time with a marker at each
//! precision switch (`timeline`), and the process's own memory (`process`).

mod bytes;
mod estimate;
mod process;
mod timeline;

pub use bytes::{format_bytes, ByteCount, KindBytes, KvBytes, KvPart, LayerBytes};
pub use estimate::{
    context_costs, document_fits, estimate_kv_allocated, estimate_kv_bytes,
    estimate_kv_bytes_at_once, token_costs, ContextCost, DocumentFit,
};
pub use process::{peak_rss_bytes, release_free_memory, reset_peak_rss, RssProbe};
pub use timeline::{switch_precision, unix_ms, MemorySample, SwitchEvent};

#[cfg(test)]
mod tests;
