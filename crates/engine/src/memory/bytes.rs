//! KV bytes as every front end reads them: used and allocated ([`ByteCount`]), per
//! attention kind, per layer and per precision ([`KvBytes`], built from the cache's own
//! report), and how a byte count is written for people ([`format_bytes`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::contract::AttentionKind;
use crate::kv::{KvCache, KvMemoryReport};

/// Bytes holding live tokens and bytes reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct ByteCount {
    /// Bytes that hold live tokens.
    pub used: u64,
    /// Bytes reserved, live or not.
    pub allocated: u64,
}

impl ByteCount {
    fn add(&mut self, used: usize, allocated: usize) {
        self.used += used as u64;
        self.allocated += allocated as u64;
    }
}

/// KV bytes per attention kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KindBytes {
    /// Sliding-window layers.
    pub sliding: ByteCount,
    /// Full-attention layers.
    pub full: ByteCount,
}

/// One cache-owning layer's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct LayerBytes {
    /// Layer index.
    pub layer: usize,
    /// Sliding or full.
    pub kind: AttentionKind,
    /// Precision in SPEC form (`f16`, `tq4`, `k4v3`).
    pub precision: String,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes.
    pub bytes: ByteCount,
}

/// The bytes of the layers of one attention kind stored in one precision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KvPart {
    /// Sliding or full.
    pub kind: AttentionKind,
    /// Precision in SPEC form.
    pub precision: String,
    /// Their bytes.
    pub bytes: ByteCount,
}

/// The whole cache's bytes, broken down four ways (each adds up to the totals).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct KvBytes {
    /// Per attention kind.
    pub by_kind: KindBytes,
    /// Per precision, keyed by its SPEC form (`f16`, `tq4`, …).
    pub by_precision: BTreeMap<String, ByteCount>,
    /// Per attention kind and precision together, in layer order of first appearance (the
    /// memory timeline's stacked series).
    pub parts: Vec<KvPart>,
    /// Every cache-owning layer (KV-sharing consumers own nothing and are left out).
    pub layers: Vec<LayerBytes>,
    /// Bytes holding live tokens, all layers.
    pub total_used: u64,
    /// Bytes reserved, all layers.
    pub total_allocated: u64,
}

impl KvBytes {
    /// The breakdown of a cache's memory report.
    pub fn from_report(r: &KvMemoryReport) -> Self {
        let mut out = KvBytes::default();
        for l in &r.layers {
            let Some(p) = l.precision else { continue };
            let name = p.to_string();
            match l.kind {
                AttentionKind::Sliding => out.by_kind.sliding.add(l.bytes_used, l.bytes_allocated),
                AttentionKind::Full => out.by_kind.full.add(l.bytes_used, l.bytes_allocated),
            }
            out.by_precision
                .entry(name.clone())
                .or_default()
                .add(l.bytes_used, l.bytes_allocated);
            match out
                .parts
                .iter_mut()
                .find(|p| p.kind == l.kind && p.precision == name)
            {
                Some(p) => p.bytes.add(l.bytes_used, l.bytes_allocated),
                None => out.parts.push(KvPart {
                    kind: l.kind,
                    precision: name.clone(),
                    bytes: ByteCount {
                        used: l.bytes_used as u64,
                        allocated: l.bytes_allocated as u64,
                    },
                }),
            }
            out.total_used += l.bytes_used as u64;
            out.total_allocated += l.bytes_allocated as u64;
            out.layers.push(LayerBytes {
                layer: l.layer,
                kind: l.kind,
                precision: name,
                tokens: l.tokens,
                bytes: ByteCount {
                    used: l.bytes_used as u64,
                    allocated: l.bytes_allocated as u64,
                },
            });
        }
        out
    }

    /// The breakdown of `cache` now.
    pub fn of(cache: &KvCache) -> Self {
        Self::from_report(&cache.memory())
    }

    /// Adds `other`'s bytes (another conversation's cache) to these: the same layer in the
    /// same precision adds up, as do kinds, precisions and parts.
    pub fn merge(&mut self, other: &KvBytes) {
        let add = |a: &mut ByteCount, b: &ByteCount| {
            a.used += b.used;
            a.allocated += b.allocated;
        };
        add(&mut self.by_kind.sliding, &other.by_kind.sliding);
        add(&mut self.by_kind.full, &other.by_kind.full);
        for (name, b) in &other.by_precision {
            add(self.by_precision.entry(name.clone()).or_default(), b);
        }
        for p in &other.parts {
            match self
                .parts
                .iter_mut()
                .find(|q| q.kind == p.kind && q.precision == p.precision)
            {
                Some(q) => add(&mut q.bytes, &p.bytes),
                None => self.parts.push(p.clone()),
            }
        }
        for l in &other.layers {
            match self
                .layers
                .iter_mut()
                .find(|m| m.layer == l.layer && m.precision == l.precision)
            {
                Some(m) => {
                    m.tokens += l.tokens;
                    add(&mut m.bytes, &l.bytes);
                }
                None => self.layers.push(l.clone()),
            }
        }
        self.total_used += other.total_used;
        self.total_allocated += other.total_allocated;
    }
}

/// Bytes for a message: `512 B`, `3.4 KiB`, `1.25 GiB` (binary units, three significant
/// digits).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {}", UNITS[unit])
}
