//! `kvlab codec eval|bench`: measure the TurboQuant codec's distortion and speed on random or
//! user-supplied vectors; `--json` prints one object whose fields are documented in
//! crates/turboquant/README.md.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use half::f16;
use kvlab_turboquant::{baseline, Bits, Codec, Rng, RotationKind, Spec, Variant};
use serde::Serialize;

/// `kvlab codec ...`
#[derive(Args, Debug)]
pub struct CodecArgs {
    #[command(subcommand)]
    command: CodecCommand,
}

#[derive(Subcommand, Debug)]
enum CodecCommand {
    /// Distortion and inner-product error of one codec spec.
    Eval(EvalArgs),
    /// Encode and scoring throughput against a dense f16 baseline.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum VariantArg {
    Mse,
    Prod,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RotationArg {
    Hadamard,
    Haar,
}

#[derive(Clone, Copy, Debug, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
enum KernelsArg {
    Auto,
    Avx2,
    Portable,
}

#[derive(Args, Debug)]
struct EvalArgs {
    /// Vector dimension.
    #[arg(long)]
    dim: usize,
    /// Bits per coordinate: 1, 2, 2.5, 3, 3.5 or 4.
    #[arg(long)]
    bits: Bits,
    #[arg(long, value_enum, default_value = "mse")]
    variant: VariantArg,
    #[arg(long, value_enum, default_value = "hadamard")]
    rotation: RotationArg,
    /// Store n/‖c[idx]‖ instead of n (mse only).
    #[arg(long)]
    norm_correction: bool,
    /// Store n/⟨u, û⟩ so inner products are unbiased along x (mse only).
    #[arg(long, conflicts_with = "norm_correction")]
    unbiased: bool,
    /// f32 matrix [n, dim]: `.safetensors` (tensor "x") or `.npy` ('<f4', C order).
    #[arg(long)]
    vectors: Option<PathBuf>,
    /// Number of random unit vectors (ignored with --vectors).
    #[arg(long, default_value_t = 10_000)]
    n: usize,
    /// Number of random unit queries for the inner-product error.
    #[arg(long, default_value_t = 64)]
    queries: usize,
    /// Seed of the codec and of the random vectors.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Vector dimension.
    #[arg(long, default_value_t = 256)]
    dim: usize,
    /// Bits per coordinate: 1, 2, 2.5, 3, 3.5 or 4.
    #[arg(long, default_value = "4")]
    bits: Bits,
    /// Number of stored keys.
    #[arg(long, default_value_t = 32_768)]
    keys: usize,
    /// Queries sharing the keys in the multi-query measurement (grouped-query attention).
    #[arg(long, default_value_t = 4)]
    group: usize,
    /// Kernel backend cap: `auto` (best the CPU has: AVX-512, AVX2 or NEON), `avx2` (no
    /// AVX-512; x86 only), `portable`.
    #[arg(long, value_enum, default_value = "auto")]
    kernels: KernelsArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Entry point for `kvlab codec`.
pub fn run(args: CodecArgs) -> Result<()> {
    match args.command {
        CodecCommand::Eval(a) => eval(a),
        CodecCommand::Bench(a) => bench(a),
    }
}

/// Gaussian test vectors from the workspace's generator, on a stream of their own so the data
/// never shares draws with the codec's rotation for the same seed.
struct Gen(Rng);

impl Gen {
    fn new(seed: u64) -> Self {
        Gen(Rng::new(seed, 0xDA7A))
    }
    fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }
    fn gaussian(&mut self) -> f32 {
        self.0.gaussian() as f32
    }
    fn unit_rows(&mut self, n: usize, d: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n * d);
        for _ in 0..n {
            let row: Vec<f32> = (0..d).map(|_| self.gaussian()).collect();
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            out.extend(row.iter().map(|v| v / norm));
        }
        out
    }
}

/// The `kvlab codec eval --json` object (field docs: crates/turboquant/README.md).
#[derive(Serialize, Debug)]
struct EvalReport {
    dim: usize,
    spec: Spec,
    source: String,
    n: usize,
    queries: usize,
    bits_per_coordinate: f64,
    bytes_per_vector: usize,
    compression_vs_f16: f64,
    mse: f64,
    mse_predicted: Option<f64>,
    ip_bias: f64,
    ip_bias_stderr: f64,
    ip_d_mse: f64,
    ip_d_mse_predicted: Option<f64>,
}

fn eval(a: EvalArgs) -> Result<()> {
    let report = eval_report(&a)?;
    print_eval(&a, &report)
}

/// Runs the evaluation described by `a`.
fn eval_report(a: &EvalArgs) -> Result<EvalReport> {
    let spec = Spec {
        bits: a.bits,
        variant: match a.variant {
            VariantArg::Mse => Variant::Mse,
            VariantArg::Prod => Variant::Prod,
        },
        rotation: match a.rotation {
            RotationArg::Hadamard => RotationKind::Hadamard,
            RotationArg::Haar => RotationKind::Haar,
        },
        norm_correction: a.norm_correction,
        unbiased: a.unbiased,
        seed: a.seed,
    };
    let codec = Codec::new(a.dim, spec).context("invalid codec spec")?;
    let d = a.dim;
    let mut gen = Gen::new(a.seed);
    let (xs, source) = match &a.vectors {
        Some(path) => (read_matrix(path, d)?, path.display().to_string()),
        None => (gen.unit_rows(a.n, d), "random-unit".to_string()),
    };
    let n = xs.len() / d;
    if n == 0 || a.queries == 0 {
        bail!("nothing to evaluate: {n} vectors, {} queries", a.queries);
    }
    // Rows with zero norm carry no direction; relative error is undefined for them.
    let rows: Vec<&[f32]> = xs
        .chunks_exact(d)
        .filter(|r| r.iter().any(|v| *v != 0.0))
        .collect();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let mut block = codec.new_block();
    codec.encode_batch(&flat, &mut block).context("encoding")?;
    let mut scratch = codec.scratch();
    let mut dec = vec![0.0f32; d];
    let mut rel = 0.0f64;
    for (t, x) in rows.iter().enumerate() {
        codec.decode(&block, t, &mut dec, &mut scratch)?;
        let err: f64 = x
            .iter()
            .zip(&dec)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let nx: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        rel += err / nx;
    }
    let mse = rel / rows.len() as f64;
    // Inner-product error ⟨y, x̂⟩ − ⟨y, x⟩ for random unit queries y, with x scaled to unit
    // norm, computed with the compressed scoring kernel.
    let qs = gen.unit_rows(a.queries, d);
    let nrows = rows.len();
    let mut scores = vec![0.0f32; a.queries * nrows];
    codec.scores_multi(&qs, &block, &mut scratch, &mut scores)?;
    let (mut s1, mut s2) = (0.0f64, 0.0f64);
    for (qi, q) in qs.chunks_exact(d).enumerate() {
        for (t, x) in rows.iter().enumerate() {
            let nx = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
            let exact: f64 = q
                .iter()
                .zip(x.iter())
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            let e = (scores[qi * nrows + t] as f64 - exact) / nx;
            s1 += e;
            s2 += e * e;
        }
    }
    let m = (a.queries * nrows) as f64;
    let ip_bias = s1 / m;
    let books = codec.codebooks();
    let dmse_of = |bits: u8| -> f64 {
        if bits == 0 {
            1.0
        } else {
            kvlab_turboquant::codebook::codebook(d, bits).mse()
        }
    };
    let (mse_predicted, ip_d_mse_predicted) = match spec.variant {
        Variant::Mse if a.vectors.is_none() && !spec.norm_correction => {
            let p = books.iter().map(|b| b.mse()).sum::<f64>() / books.len() as f64;
            (Some(p), Some(p))
        }
        Variant::Mse => (None, None),
        Variant::Prod => {
            let b = spec.bits.value() as u8;
            (None, Some(std::f64::consts::FRAC_PI_2 * dmse_of(b - 1)))
        }
    };
    let report = EvalReport {
        dim: d,
        spec,
        source,
        n: nrows,
        queries: a.queries,
        bits_per_coordinate: codec.bits_per_coordinate(),
        bytes_per_vector: codec.bytes_per_vector(),
        compression_vs_f16: (2 * d) as f64 / codec.bytes_per_vector() as f64,
        mse,
        mse_predicted,
        ip_bias,
        ip_bias_stderr: ((s2 / m - ip_bias * ip_bias) / m).sqrt(),
        ip_d_mse: d as f64 * s2 / m,
        ip_d_mse_predicted,
    };
    Ok(report)
}

fn print_eval(a: &EvalArgs, report: &EvalReport) -> Result<()> {
    let (d, spec) = (report.dim, report.spec);
    if a.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
        println!(
            "dim {} bits {} variant {:?} rotation {:?} norm_correction {} ({})",
            d,
            spec.bits.value(),
            spec.variant,
            spec.rotation,
            spec.norm_correction,
            report.source
        );
        println!(
            "  storage: {:.4} bits/coord, {} bytes/vector, {:.2}x smaller than f16",
            report.bits_per_coordinate, report.bytes_per_vector, report.compression_vs_f16
        );
        println!(
            "  mse (relative) over {} vectors: {:.6} (predicted {})",
            report.n,
            report.mse,
            opt(report.mse_predicted)
        );
        println!(
            "  inner product vs {} queries: bias {:.2e} ± {:.1e}, d·E[err²] {:.5} (predicted {})",
            a.queries,
            report.ip_bias,
            report.ip_bias_stderr,
            report.ip_d_mse,
            opt(report.ip_d_mse_predicted)
        );
    }
    Ok(())
}

/// Reads an f32 matrix with `d` columns from `.safetensors` (tensor "x") or `.npy`.
fn read_matrix(path: &Path, d: usize) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let (shape, data) = match ext {
        "safetensors" => {
            let st = safetensors::SafeTensors::deserialize(&bytes)
                .with_context(|| format!("parsing {}", path.display()))?;
            let t = st.tensor("x").context("tensor \"x\" not found")?;
            if t.dtype() != safetensors::Dtype::F32 {
                bail!("tensor \"x\" has dtype {:?}, expected F32", t.dtype());
            }
            (t.shape().to_vec(), le_f32(t.data()))
        }
        "npy" => read_npy(&bytes)?,
        other => bail!("unsupported vector file extension {other:?} (use .safetensors or .npy)"),
    };
    if shape.len() != 2 || shape[1] != d {
        bail!("expected a matrix of shape [n, {d}], found {shape:?}");
    }
    if data.len() != shape[0] * shape[1] {
        bail!("data length {} does not match shape {shape:?}", data.len());
    }
    Ok(data)
}

fn le_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Parses an npy v1/v2/v3 file holding a C-order little-endian f32 ('<f4') array.
fn read_npy(b: &[u8]) -> Result<(Vec<usize>, Vec<f32>)> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        bail!("not an npy file");
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => bail!("unsupported npy version {v}"),
    };
    let header = b.get(start..start + hlen).context("truncated npy header")?;
    let header = std::str::from_utf8(header).context("npy header is not text")?;
    let field = |key: &str| -> Result<&str> {
        let at = header
            .find(&format!("'{key}'"))
            .with_context(|| format!("npy header lacks '{key}'"))?;
        let rest = &header[at + key.len() + 2..];
        let colon = rest.find(':').context("malformed npy header")?;
        Ok(rest[colon + 1..].trim_start())
    };
    let descr = field("descr")?;
    if !descr.starts_with("'<f4'") {
        bail!("npy dtype must be '<f4' (little-endian f32)");
    }
    if !field("fortran_order")?.starts_with("False") {
        bail!("npy array must be C order");
    }
    let shape_txt = field("shape")?;
    let close = shape_txt.find(')').context("malformed npy shape")?;
    let shape = shape_txt[1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().context("bad npy shape"))
        .collect::<Result<Vec<_>>>()?;
    let data = &b[start + hlen..];
    let count: usize = shape.iter().product();
    if data.len() < count * 4 {
        bail!("npy data is truncated");
    }
    Ok((shape, le_f32(&data[..count * 4])))
}

/// The `kvlab codec bench --json` object (field docs: crates/turboquant/README.md).
#[derive(Serialize, Debug)]
struct BenchReport {
    dim: usize,
    bits: f64,
    keys: usize,
    threads: usize,
    bytes_per_vector: usize,
    encode_vectors_per_s: f64,
    encode_vectors_per_s_1thread: f64,
    scores_keys_per_s: f64,
    scores_f16_keys_per_s: f64,
    scores_speedup_vs_f16: f64,
    group: usize,
    kernels: KernelsArg,
    /// The backend that ran the scoring kernels (`portable`, `avx2`, `avx512`, `neon`).
    backend: &'static str,
    /// The backend that ran the weighted sums (wide codebooks: AVX2 on every x86 CPU with it).
    accumulate_backend: &'static str,
    scores_multi_keys_per_s: f64,
    accumulate_keys_per_s: f64,
    /// `group` weight rows summed in one call (a decode step's query heads of one kv head),
    /// counted as key-rows per second.
    accumulate_multi_keys_per_s: f64,
}

/// Best wall time of `f` over repeated runs lasting about `budget_s` in total.
fn best_time(budget_s: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut runs = 0;
    while runs < 3 || (start.elapsed().as_secs_f64() < budget_s && runs < 1000) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

fn bench(a: BenchArgs) -> Result<()> {
    let d = a.dim;
    let codec = Codec::new(d, Spec::mse(a.bits)).context("invalid codec spec")?;
    if a.keys == 0 || a.group == 0 {
        bail!("--keys and --group must be positive");
    }
    match a.kernels {
        KernelsArg::Auto => {}
        KernelsArg::Avx2 => kvlab_turboquant::force_avx2_kernels(true),
        KernelsArg::Portable => kvlab_turboquant::force_portable_kernels(true),
    }
    let mut gen = Gen::new(42);
    let xs: Vec<f32> = (0..a.keys * d).map(|_| gen.gaussian()).collect();
    let q: Vec<f32> = (0..d).map(|_| gen.gaussian()).collect();
    let qs: Vec<f32> = (0..d * a.group).map(|_| gen.gaussian()).collect();
    let mut err = None;
    let t_enc = best_time(1.0, || {
        let mut block = codec.new_block();
        if let Err(e) = codec.encode_batch(&xs, &mut block) {
            err = Some(e);
        }
    });
    let mut scratch = codec.scratch();
    let one = a.keys.min(8192);
    let t_enc1 = best_time(0.5, || {
        let mut block = codec.new_block();
        for x in xs.chunks_exact(d).take(one) {
            if let Err(e) = codec.encode(x, &mut block, &mut scratch) {
                err = Some(e);
            }
        }
    });
    if let Some(e) = err {
        return Err(e).context("encoding");
    }
    let mut block = codec.new_block();
    codec.encode_batch(&xs, &mut block)?;
    let mut out = vec![0.0f32; a.keys];
    let mut res = Ok(());
    let t_scores = best_time(1.0, || {
        res = res
            .clone()
            .and(codec.scores(&q, &block, &mut scratch, &mut out));
    });
    let mut out_multi = vec![0.0f32; a.keys * a.group];
    let t_multi = best_time(1.0, || {
        res = res
            .clone()
            .and(codec.scores_multi(&qs, &block, &mut scratch, &mut out_multi));
    });
    let scores_backend = scratch.last_backend().map_or("none", |b| b.name());
    let w: Vec<f32> = (0..a.keys).map(|_| gen.uniform() as f32).collect();
    let mut acc = vec![0.0f32; d];
    let t_acc = best_time(1.0, || {
        res = res
            .clone()
            .and(codec.accumulate(&w, &block, &mut scratch, &mut acc));
    });
    let ws: Vec<f32> = (0..a.keys * a.group)
        .map(|_| gen.uniform() as f32)
        .collect();
    let mut acc_multi = vec![0.0f32; d * a.group];
    let t_acc_multi = best_time(1.0, || {
        res = res
            .clone()
            .and(codec.accumulate_multi(&ws, &block, &mut scratch, &mut acc_multi));
    });
    res?;
    let keys16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let t_f16 = best_time(1.0, || baseline::f16_scores(&q, &keys16, &mut out));
    let n = a.keys as f64;
    let report = BenchReport {
        dim: d,
        bits: a.bits.value(),
        keys: a.keys,
        threads: rayon_threads(),
        bytes_per_vector: codec.bytes_per_vector(),
        encode_vectors_per_s: n / t_enc,
        encode_vectors_per_s_1thread: one as f64 / t_enc1,
        scores_keys_per_s: n / t_scores,
        scores_f16_keys_per_s: n / t_f16,
        scores_speedup_vs_f16: t_f16 / t_scores,
        group: a.group,
        kernels: a.kernels,
        backend: scores_backend,
        accumulate_backend: scratch.last_backend().map_or("none", |b| b.name()),
        scores_multi_keys_per_s: n * a.group as f64 / t_multi,
        accumulate_keys_per_s: n / t_acc,
        accumulate_multi_keys_per_s: n * a.group as f64 / t_acc_multi,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let m = |v: f64| v / 1e6;
        println!(
            "dim {} bits {} keys {} ({} bytes/vector, encode on {} cores, kernels {:?} timed on one: scores {}, sums {})",
            d,
            report.bits,
            a.keys,
            report.bytes_per_vector,
            report.threads,
            a.kernels,
            report.backend,
            report.accumulate_backend
        );
        println!(
            "  encode:    {:8.2} M vectors/s (batch), {:.2} M/s (1 thread)",
            m(report.encode_vectors_per_s),
            m(report.encode_vectors_per_s_1thread)
        );
        println!(
            "  scores:    {:8.2} M keys/s codes vs {:.2} M keys/s f16 -> {:.2}x",
            m(report.scores_keys_per_s),
            m(report.scores_f16_keys_per_s),
            report.scores_speedup_vs_f16
        );
        println!(
            "  scores x{}: {:8.2} M key-queries/s (codes read once per group)",
            a.group,
            m(report.scores_multi_keys_per_s)
        );
        println!(
            "  accumulate:{:8.2} M keys/s",
            m(report.accumulate_keys_per_s)
        );
        println!(
            "  accumulate x{}: {:6.2} M key-rows/s (codes read once per group)",
            a.group,
            m(report.accumulate_multi_keys_per_s)
        );
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: &[f32]) -> Vec<u8> {
        let mut h = header.to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        for v in data {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn eval_json_fields_and_values() {
        let args = EvalArgs {
            dim: 64,
            bits: Bits::B2,
            variant: VariantArg::Mse,
            rotation: RotationArg::Hadamard,
            norm_correction: false,
            unbiased: false,
            vectors: None,
            n: 2000,
            queries: 16,
            seed: 3,
            json: true,
        };
        let report = eval_report(&args).unwrap();
        let v = serde_json::to_value(&report).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "bits_per_coordinate",
                "bytes_per_vector",
                "compression_vs_f16",
                "dim",
                "ip_bias",
                "ip_bias_stderr",
                "ip_d_mse",
                "ip_d_mse_predicted",
                "mse",
                "mse_predicted",
                "n",
                "queries",
                "source",
                "spec"
            ]
        );
        assert_eq!(v["bytes_per_vector"], 18);
        assert_eq!(v["bits_per_coordinate"], 2.25);
        let (mse, want) = (report.mse, report.mse_predicted.unwrap());
        assert!((mse - want).abs() / want < 0.05, "{mse} vs {want}");
    }

    #[test]
    fn parses_npy_and_rejects_bad_headers() {
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        let ok = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &data,
        );
        let (shape, back) = read_npy(&ok).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(back, data);
        let f8 = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
            &data,
        );
        assert!(read_npy(&f8).is_err());
        let fortran = npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &data,
        );
        assert!(read_npy(&fortran).is_err());
        assert!(read_npy(&ok[..ok.len() - 4]).is_err());
        assert!(read_npy(b"garbage").is_err());
    }

    #[test]
    fn reads_safetensors_matrix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.safetensors");
        let data: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 4], &raw)
            .unwrap();
        safetensors::serialize_to_file([("x", view)], None, &path).unwrap();
        assert_eq!(read_matrix(&path, 4).unwrap(), data);
        assert!(read_matrix(&path, 3).is_err());
    }
}
