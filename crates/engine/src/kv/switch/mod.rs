//! Precision switches, planned before they are applied: [`KvCache::plan`] says what each
//! layer becomes and what it will weigh, without touching the cache, so a caller can check
//! the plan against a memory budget; [`KvCache::apply`] then builds every new storage and
//! swaps them in only when all are complete, so a switch that fails part-way leaves the cache
//! exactly as it was.

use super::{
    new_storage, KvCache, KvPrecision, PrecisionPolicy, CONVERT_CHUNK, MIN_CALIBRATION_ROWS,
};
use crate::contract::AttentionKind;
use crate::error::{EngineError, Result};

/// What one cache-owning layer becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerChange {
    /// Layer index.
    pub layer: usize,
    /// Sliding or full.
    pub kind: AttentionKind,
    /// Its precision now.
    pub from: KvPrecision,
    /// Its precision after the switch.
    pub to: KvPrecision,
    /// Tokens it holds (and keeps).
    pub tokens: usize,
    /// Bytes it holds now.
    pub bytes_before: u64,
    /// Bytes it will hold ([`KvPrecision::bytes_after`]).
    pub bytes_after: u64,
    /// Bytes it will allocate, at most ([`super::allocated_tokens`]).
    pub allocated_after: u64,
}

impl LayerChange {
    /// Whether the layer is re-encoded (its precision changes).
    pub fn converts(&self) -> bool {
        self.from != self.to
    }
}

/// A switch of the whole cache to a policy, not yet applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertPlan {
    /// The policy asked for.
    pub policy: PrecisionPolicy,
    /// One entry per cache-owning layer, in layer order.
    pub layers: Vec<LayerChange>,
    /// The cache's length when planned; [`KvCache::apply`] refuses a plan made for another.
    seq_len: usize,
}

impl ConvertPlan {
    /// Bytes the cache holds now.
    pub fn bytes_before(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_before).sum()
    }

    /// Bytes the cache will hold.
    pub fn bytes_after(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_after).sum()
    }

    /// Bytes the cache will allocate, at most (what a budget of allocated bytes counts).
    pub fn allocated_after(&self) -> u64 {
        self.layers.iter().map(|l| l.allocated_after).sum()
    }

    /// Bytes the switch needs beyond what the cache holds now, at its peak: every converted
    /// layer's new storage, built while the old ones are still kept.
    pub fn peak_extra_bytes(&self) -> u64 {
        self.layers
            .iter()
            .filter(|l| l.converts())
            .map(|l| l.bytes_after)
            .sum()
    }

    /// [`ConvertPlan::peak_extra_bytes`] as allocated, at most: what a budget of allocated
    /// bytes admits.
    pub fn peak_extra_allocated(&self) -> u64 {
        self.layers
            .iter()
            .filter(|l| l.converts())
            .map(|l| l.allocated_after)
            .sum()
    }

    /// Tokens the cache holds.
    pub fn tokens(&self) -> usize {
        self.seq_len
    }

    /// True when no layer changes precision.
    pub fn is_noop(&self) -> bool {
        !self.layers.iter().any(LayerChange::converts)
    }
}

impl KvCache {
    /// What switching to `policy` would do, layer by layer, and what it would cost. Fails
    /// only when a layer's target precision cannot be built for its shape (e.g. a head
    /// dimension the codec refuses); changes nothing.
    pub fn plan(&self, policy: &PrecisionPolicy) -> Result<ConvertPlan> {
        let mut layers = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(o) = &slot.owned else { continue };
            let to = policy.for_layer(i, slot.kind);
            // Building an empty storage is cheap and proves the precision fits the shape.
            new_storage(to, o.shape.clone())?;
            let tokens = o.storage.len();
            let (h, d) = (o.shape.n_kv_heads, o.shape.head_dim);
            layers.push(LayerChange {
                layer: i,
                kind: slot.kind,
                from: o.storage.precision(),
                to,
                tokens,
                bytes_before: o.storage.bytes_used() as u64,
                // The new storage gets the held tokens at once and calibrates on them.
                bytes_after: to.bytes_after(h, d, tokens, tokens, MIN_CALIBRATION_ROWS)?,
                allocated_after: {
                    let room = to.room_tokens(tokens);
                    to.bytes_after(h, d, room, room, MIN_CALIBRATION_ROWS)?
                },
            });
        }
        Ok(ConvertPlan {
            policy: policy.clone(),
            layers,
            seq_len: self.seq_len,
        })
    }

    /// Applies `plan`: every converted layer's new storage is filled [`CONVERT_CHUNK`]
    /// tokens at a time from the old one, and all are swapped in together once every one is
    /// complete. On any error the cache is exactly as before. Dense → TurboQuant encodes;
    /// TurboQuant → dense decodes, which keeps the quantization error already made (the
    /// original values are gone); TurboQuant → other bits decodes then re-encodes.
    pub fn apply(&mut self, plan: &ConvertPlan) -> Result<()> {
        if plan.seq_len != self.seq_len {
            return Err(EngineError::invalid(format!(
                "the switch was planned for {} tokens, the cache now holds {}",
                plan.seq_len, self.seq_len
            )));
        }
        let mut fresh = Vec::new();
        for change in plan.layers.iter().filter(|c| c.converts()) {
            let o = self
                .slots
                .get(change.layer)
                .and_then(|s| s.owned.as_ref())
                .ok_or_else(|| {
                    EngineError::invalid(format!("layer {} owns no cache", change.layer))
                })?;
            let mut storage = new_storage(change.to, o.shape.clone())?;
            // Keys weighted by query energy take what the cache measured before the switch.
            if storage.wants_query_energy() && !o.query_energy.sums.is_empty() {
                storage.set_query_energy(&o.query_energy.sums);
            }
            let n = o.storage.len();
            let mut at = 0;
            while at < n {
                let m = CONVERT_CHUNK.min(n - at);
                let (k, v) = o.storage.to_dense_range(at, m)?;
                storage.append(&k, &v)?;
                at += m;
            }
            // Every row it will get is there: a TurboQuant layer calibrates on them now
            // rather than hold them as f16 (the user asked for the smaller cache).
            storage.calibrate_now()?;
            fresh.push((change.layer, storage));
        }
        for (layer, storage) in fresh {
            if let Some(o) = self.slots[layer].owned.as_mut() {
                o.storage = storage;
            }
        }
        Ok(())
    }

    /// Plans and applies a switch to `policy` in one call, with no budget check (tests and
    /// tools; the engine checks the plan first).
    pub fn convert(&mut self, policy: &PrecisionPolicy) -> Result<()> {
        let plan = self.plan(policy)?;
        self.apply(&plan)
    }
}

#[cfg(test)]
mod tests;
