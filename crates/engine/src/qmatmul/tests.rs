//! Our kernels against ggml's own arithmetic, through candle: the blocks decode as candle
//! dequantizes them, and a matrix candle quantized multiplies as candle's dequantized copy
//! does. The kernels' own tests (every backend, bit for bit against the portable one) are in
//! `kvlab-cpu`.

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use kvlab_cpu::qmatmul::{decode_block, ALL_FORMATS};

use super::*;

/// Every format's decoded values equal candle's dequantization of the same ggml bytes.
#[test]
fn decoded_blocks_dequantize_as_ggml() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let mut rng = kvlab_turboquant::Rng::new(7, 0);
    for f in ALL_FORMATS {
        let g = f.geometry();
        let (rows, cols) = (3, 512);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| rng.gaussian() as f32 * (1.0 + (i % 7) as f32) - 0.3)
            .collect();
        let t = Tensor::from_vec(data, (rows, cols), &dev)?;
        let q = QTensor::quantize(&t, ggml_type(f))?;
        let want: Vec<f32> = q.dequantize(&dev)?.flatten_all()?.to_vec1()?;
        let bytes = q.data()?;
        let got: Vec<f32> = bytes
            .chunks_exact(g.ggml_block)
            .flat_map(|b| decode_block(f, b).values(&g))
            .collect();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{f:?} [{i}]: {a} vs {b}"
            );
        }
    }
    Ok(())
}

/// A matrix quantized by candle, repacked, multiplies on candle's pool as its dequantized
/// copy does in f64 (within the activations' rounding), and its rows and embedding lookups
/// are candle's dequantized rows exactly.
#[test]
fn candle_quantized_matrices_multiply_as_their_dequantized_copies() -> Result<()> {
    let dev = Device::Cpu;
    let mut rng = kvlab_turboquant::Rng::new(3, 1);
    for f in ALL_FORMATS {
        let (rows, cols, m) = (37, 2 * f.geometry().sb, 5);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.gaussian() as f32).collect();
        let q = QTensor::quantize(&Tensor::from_vec(w, (rows, cols), &dev)?, ggml_type(f))?;
        let deq: Vec<f32> = q.dequantize(&dev)?.flatten_all()?.to_vec1()?;
        let packed = Arc::new(from_qtensor(&q)?.ok_or_else(|| EngineError::invalid("no kernel"))?);
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gaussian() as f32).collect();
        let y: Vec<f32> = forward(&packed, &Tensor::from_vec(x.clone(), (m, cols), &dev)?)?
            .flatten_all()?
            .to_vec1()?;
        for i in 0..m {
            for r in 0..rows {
                let (mut want, mut mag) = (0f64, 0f64);
                for k in 0..cols {
                    let p = x[i * cols + k] as f64 * deq[r * cols + k] as f64;
                    want += p;
                    mag += p.abs();
                }
                let got = y[i * rows + r] as f64;
                assert!(
                    (got - want).abs() <= 0.02 * mag,
                    "{f:?} [{i}, {r}]: {got} vs {want}"
                );
            }
        }
        let e = packed.embedding(&[36, 0])?;
        assert_eq!(e[..cols], deq[36 * cols..37 * cols], "{f:?}");
    }
    Ok(())
}
