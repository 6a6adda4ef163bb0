//! Tests of live precision switches on a whole cache: conversions keep the tokens (exactly
//! for TurboQuant → dense, which keeps the quantization error), work across conversion
//! chunks and sliding windows, plans say what a switch will weigh, and a failed conversion
//! leaves the whole cache as it was.

use std::path::PathBuf;

use candle_core::{Device, Tensor};

use crate::checkpoint::config::hf::load_config;
use crate::kv::*;

fn config() -> Result<ModelConfig> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_gemma3/config.json");
    load_config(&p)
}

fn chunk(seed: u64, h: usize, t: usize, d: usize) -> Result<Tensor> {
    let mut rng = kvlab_turboquant::Rng::new(seed, 0);
    let data: Vec<f32> = (0..h * t * d).map(|_| rng.symmetric()).collect();
    Ok(Tensor::from_vec(data, (h, t, d), &Device::Cpu)?)
}

/// Fills every owning layer with `n` tokens in steps of `step`, committing like the model.
fn fill(cache: &mut KvCache, cfg: &ModelConfig, n: usize, step: usize) -> Result<()> {
    let mut at = 0;
    while at < n {
        let t = step.min(n - at);
        for l in cfg.cache_owning_layers() {
            let k = chunk((l.index * 7919 + at) as u64, l.n_kv_heads, t, l.head_dim)?;
            let v = chunk((l.index * 104_729 + at) as u64, l.n_kv_heads, t, l.head_dim)?;
            cache.append(l.index, &k, &v)?;
        }
        cache.commit(t)?;
        at += t;
    }
    Ok(())
}

fn dense(cache: &KvCache, layer: usize) -> Result<(Tensor, Tensor)> {
    cache
        .storage(layer)
        .ok_or_else(|| EngineError::invalid("no storage"))?
        .to_dense()
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

fn spec(s: &str) -> Result<PrecisionPolicy> {
    Ok(CacheSpec::parse(s)?.to_policy())
}

#[test]
fn switches_keep_every_layer_consistent() -> Result<()> {
    let cfg = config()?;
    // More than one conversion chunk on the full layers; sliding layers hold W − 1.
    let n = CONVERT_CHUNK + 700;
    let mut cache = KvCache::new(&cfg, &spec("f32")?, &Device::Cpu)?;
    fill(&mut cache, &cfg, n, 1000)?;
    let full = 2; // tiny_gemma3: layers 2 and 5 are full attention
    let (k32, v32) = dense(&cache, full)?;

    // f32 → tq4 on every layer: the codes decode close to the originals.
    cache.convert(&spec("tq4@all")?)?;
    let (k4, v4) = dense(&cache, full)?;
    assert_eq!(k4.dims(), k32.dims());
    let rel = max_diff(&k4, &k32)? / k32.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(rel > 0.0 && rel < 0.5, "tq4 relative error {rel}");

    // tq4 → f32 keeps exactly the quantized values (the original ones are gone).
    cache.convert(&spec("f32")?)?;
    let (kb, vb) = dense(&cache, full)?;
    assert_eq!(max_diff(&kb, &k4)?, 0.0);
    assert_eq!(max_diff(&vb, &v4)?, 0.0);
    assert!(max_diff(&vb, &v32)? > 0.0);

    // tq4 → tq3 directly re-encodes what tq4 held (the decoded tq4 values): the same as
    // going through f32.
    let mut twin = KvCache::new(&cfg, &spec("f32")?, &Device::Cpu)?;
    fill(&mut twin, &cfg, n, 1000)?;
    twin.convert(&spec("tq4@all")?)?;
    twin.convert(&spec("tq3@all")?)?;
    cache.convert(&spec("tq3@all")?)?;
    for l in cfg.cache_owning_layers() {
        let (a, b) = (dense(&cache, l.index)?, dense(&twin, l.index)?);
        assert_eq!(max_diff(&a.0, &b.0)?, 0.0, "layer {}", l.index);
        assert_eq!(max_diff(&a.1, &b.1)?, 0.0, "layer {}", l.index);
    }
    // Positions survive: sliding layers still hold exactly their window and can go on.
    for l in &cfg.layers {
        let held = cache.storage(l.index).map(|s| s.len());
        let want = match l.sliding_window {
            Some(w) => w - 1,
            None => n,
        };
        assert_eq!(held, Some(want), "layer {}", l.index);
    }
    fill(&mut cache, &cfg, 3, 1)?;
    assert_eq!(cache.seq_len(), n + 3);
    Ok(())
}

#[test]
fn a_failed_switch_leaves_every_layer_as_it_was() -> Result<()> {
    let cfg = config()?;
    let mut cache = KvCache::new(&cfg, &spec("f32")?, &Device::Cpu)?;
    fill(&mut cache, &cfg, 40, 7)?;
    // Layer 5 (full) gets one value whose norm overflows the f16 norm field of the codes.
    let l5 = &cfg.layers[5];
    let k = chunk(1, l5.n_kv_heads, 1, l5.head_dim)?;
    let v = (chunk(2, l5.n_kv_heads, 1, l5.head_dim)? * 1e6)?;
    for l in cfg.cache_owning_layers() {
        let (kk, vv) = if l.index == 5 {
            (k.clone(), v.clone())
        } else {
            let c = chunk(3, l.n_kv_heads, 1, l.head_dim)?;
            (c.clone(), c)
        };
        cache.append(l.index, &kk, &vv)?;
    }
    cache.commit(1)?;
    let before: Vec<_> = cfg
        .cache_owning_layers()
        .map(|l| dense(&cache, l.index))
        .collect::<Result<_>>()?;
    let mem_before = cache.memory();

    let mut policy = spec("tq4")?;
    policy.sliding = KvPrecision::F32;
    let plan = cache.plan(&policy)?;
    assert_eq!(plan.bytes_before(), mem_before.total.0 as u64);
    let err = cache.apply(&plan);
    assert!(matches!(err, Err(EngineError::Codec(_))), "{err:?}");
    // Nothing changed: layer 2, converted before layer 5 failed, kept its old storage too,
    // bit for bit, and the cache weighs what it did.
    for (l, (bk, bv)) in cfg.cache_owning_layers().zip(&before) {
        let s = cache
            .storage(l.index)
            .ok_or_else(|| EngineError::invalid("no storage"))?;
        assert_eq!(s.precision(), KvPrecision::F32, "layer {}", l.index);
        let (k, v) = dense(&cache, l.index)?;
        assert_eq!(max_diff(&k, bk)?, 0.0, "layer {}", l.index);
        assert_eq!(max_diff(&v, bv)?, 0.0, "layer {}", l.index);
    }
    assert_eq!(cache.memory(), mem_before);
    // Every layer still attends.
    for l in &cfg.layers {
        let q = chunk(9, l.n_heads, 1, l.head_dim)?;
        let o = cache.attend(l.index, &q, cache.seq_len() - 1, l.attn_scale, None)?;
        assert_eq!(o.dims(), &[l.n_heads, 1, l.head_dim]);
    }
    Ok(())
}

#[test]
fn a_plan_weighs_what_the_switched_cache_holds() -> Result<()> {
    let cfg = config()?;
    let mut cache = KvCache::new(&cfg, &spec("f16")?, &Device::Cpu)?;
    fill(&mut cache, &cfg, 300, 64)?;
    for to in ["tq3.5@all", "k4v3@full", "f32", "f16"] {
        let before = cache.memory();
        let plan = cache.plan(&spec(to)?)?;
        assert_eq!(plan.bytes_before(), before.total.0 as u64, "{to}");
        assert_eq!(plan.tokens(), 300);
        // Planning changes nothing.
        assert_eq!(cache.memory(), before, "{to}");
        let extra: u64 = plan
            .layers
            .iter()
            .filter(|l| l.from != l.to)
            .map(|l| l.bytes_after)
            .sum();
        assert_eq!(plan.peak_extra_bytes(), extra);
        assert_eq!(plan.is_noop(), extra == 0 && to == "f16", "{to}");
        cache.apply(&plan)?;
        assert_eq!(cache.memory().total.0 as u64, plan.bytes_after(), "{to}");
    }
    // A plan is for the cache as it was: after another step it is refused, not misapplied.
    let plan = cache.plan(&spec("tq4@all")?)?;
    fill(&mut cache, &cfg, 1, 1)?;
    assert!(cache.apply(&plan).is_err());
    Ok(())
}

#[test]
fn switches_reach_and_leave_llama_cpp_types() -> Result<()> {
    // The fixture's heads (16 wide) are not whole ggml blocks; 64 are, and rotate.
    let mut cfg = config()?;
    cfg.layers.iter_mut().for_each(|l| l.head_dim = 64);
    let n = 700;
    let mut cache = KvCache::new(&cfg, &spec("f32")?, &Device::Cpu)?;
    fill(&mut cache, &cfg, n, 300)?;
    let full = 2;
    let (k32, _) = dense(&cache, full)?;
    let scale = k32.abs()?.max_all()?.to_scalar::<f32>()?;
    let mut last = None;
    for (to, bound) in [
        ("q8_0", 0.02),
        ("f16/q4_0", 0.02),
        ("q8_0/tq3", 0.05),
        ("q4_0+norot", 0.2),
        ("f32", 0.2),
    ] {
        let plan = cache.plan(&spec(to)?)?;
        cache.apply(&plan)?;
        assert_eq!(cache.memory().total.0 as u64, plan.bytes_after(), "{to}");
        let (k, v) = dense(&cache, full)?;
        let rel = max_diff(&k, &k32)? / scale;
        assert!(rel < bound, "{to}: keys off by {rel} of their scale");
        if to == "f32" {
            // Leaving a block type keeps exactly what it held.
            let (pk, pv): (Tensor, Tensor) = last.take().expect("held before");
            assert_eq!(max_diff(&k, &pk)?, 0.0);
            assert_eq!(max_diff(&v, &pv)?, 0.0);
        }
        last = Some((k, v));
    }
    // q8_0 holds 8.5 bits a coordinate: 34 bytes per 32 against f32's 128.
    let mut q8 = KvCache::new(&cfg, &spec("q8_0")?, &Device::Cpu)?;
    let mut f32c = KvCache::new(&cfg, &spec("f32")?, &Device::Cpu)?;
    fill(&mut q8, &cfg, 64, 64)?;
    fill(&mut f32c, &cfg, 64, 64)?;
    assert_eq!(q8.memory().total.0 * 128, f32c.memory().total.0 * 34);
    fill(&mut cache, &cfg, 3, 1)?;
    assert_eq!(cache.seq_len(), n + 3);
    Ok(())
}
