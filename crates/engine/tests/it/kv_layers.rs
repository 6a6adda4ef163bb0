//! A cache whose layers each hold their own format (a policy with per-layer overrides, what
//! `fidelity sweep --layers` builds and a fitted cache will be) is, layer by layer, exactly
//! the cache of that layer's format alone, and the byte formula counts it as the storages
//! hold it: mixed layers change nothing of either.

use crate::common;

use candle_core::Device;
use kvlab_engine::lab::{
    estimate_kv_allocated, estimate_kv_bytes, parse_hf_config, CacheSpec, KvCache, KvPrecision,
    ModelConfig, PrecisionPolicy,
};

/// A fixture's configuration with heads of 64 (its own are 16): llama.cpp's block types
/// need whole blocks of 32, and 64 gets upstream's Hadamard rotation. The cache needs only
/// the shapes.
fn config_with_heads_of_64(name: &str) -> ModelConfig {
    let path = common::fixture(name).join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("config")).expect("json");
    let c = if json.get("text_config").is_some() {
        json.get_mut("text_config").expect("text config")
    } else {
        &mut json
    };
    c["head_dim"] = 64.into();
    parse_hf_config(&json.to_string(), name).expect("config")
}

/// The precision a SPEC gives full layers.
fn full(spec: &str) -> KvPrecision {
    CacheSpec::parse(spec).expect("spec").to_policy().full
}

#[test]
fn a_per_layer_cache_is_each_layers_format_alone_and_its_bytes_are_the_formulas() {
    for name in ["tiny_gemma3", "tiny_e"] {
        let config = config_with_heads_of_64(name);
        let formats = [
            full("q8_0@all"),
            full("tq4@all"),
            full("k4v3+qw@all"),
            full("q4_0/tq3+sink@all"),
            KvPrecision::F32,
            KvPrecision::BF16,
        ];
        // Every layer its own format, in turn; the policy's kinds say f16 for the rest.
        let mut mixed = PrecisionPolicy::uniform(KvPrecision::F16);
        for layer in 0..config.num_layers() {
            mixed
                .overrides
                .insert(layer, formats[layer % formats.len()]);
        }
        for tokens in [1usize, 17, 70, 300] {
            let fill = |policy: &PrecisionPolicy| {
                let mut cache = KvCache::new(&config, policy, &Device::Cpu).expect("cache");
                cache.fill_synthetic(tokens, 5).expect("fill");
                cache
            };
            let cache = fill(&mixed);
            let report = cache.memory();
            let mut compared = std::collections::HashSet::new();
            for layer in 0..config.num_layers() {
                let Some(storage) = cache.storage(layer) else {
                    continue; // a KV-sharing consumer stores nothing
                };
                let format = formats[layer % formats.len()];
                assert_eq!(storage.precision(), format, "{name} layer {layer}");
                // The same layer of a cache of that format alone, filled alike.
                let alone = fill(&PrecisionPolicy::uniform(format));
                let other = alone.storage(layer).expect("owned alike");
                let (k, v) = storage.to_dense().expect("dense");
                let (k1, v1) = other.to_dense().expect("dense");
                assert_eq!(
                    (common::max_diff(&k, &k1), common::max_diff(&v, &v1)),
                    (0.0, 0.0),
                    "{name} layer {layer} ({format}) at {tokens} tokens"
                );
                let theirs = &alone.memory().layers[layer];
                let ours = &report.layers[layer];
                assert_eq!(
                    (ours.tokens, ours.bytes_used, ours.bytes_allocated),
                    (theirs.tokens, theirs.bytes_used, theirs.bytes_allocated),
                    "{name} layer {layer} ({format}) bytes at {tokens} tokens"
                );
                assert!(ours.bytes_used > 0, "{name} layer {layer} holds its tokens");
                compared.insert(format.to_string());
            }
            // Both fixtures own at least four layers: dense, codes and blocks all compared.
            assert!(compared.len() >= 4, "{name}: {compared:?}");
            // The byte formula of the mixed policy is what its storages hold, and its
            // allocation bound is never exceeded.
            let margin = cache.rewind_margin();
            let formula = estimate_kv_bytes(&config, &mixed, tokens, margin).expect("formula");
            assert_eq!(report.total.0 as u64, formula, "{name} at {tokens} tokens");
            let bound = estimate_kv_allocated(&config, &mixed, tokens, margin).expect("bound");
            assert!(
                report.total.1 as u64 <= bound,
                "{name} at {tokens}: {} allocated > {bound}",
                report.total.1
            );
        }
    }
}
