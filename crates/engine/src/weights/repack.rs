//! Lossless Q5_0 → Q8_0 block repacking. A Q5_0 block holds `d·(q − 16)` with
//! `q − 16 ∈ [−16, 15]`, which a Q8_0 block with the same scale `d` stores exactly; candle's
//! CPU backend has SIMD Q8_0 dot products but only scalar Q5_0 ones (3–4× slower).

use crate::error::{EngineError, Result};

/// Bytes per Q5_0 block (f16 scale, 4 high-bit bytes, 16 nibble bytes) for 32 weights.
const Q5_0_BLOCK: usize = 22;
/// Bytes per Q8_0 block (f16 scale, 32 signed bytes).
const Q8_0_BLOCK: usize = 34;

/// Re-encodes raw Q5_0 blocks as Q8_0 blocks with identical dequantized values.
pub fn q5_0_to_q8_0(src: &[u8]) -> Result<Vec<u8>> {
    if !src.len().is_multiple_of(Q5_0_BLOCK) {
        return Err(EngineError::invalid(format!(
            "Q5_0 data of {} bytes is not a whole number of blocks",
            src.len()
        )));
    }
    let mut out = Vec::with_capacity(src.len() / Q5_0_BLOCK * Q8_0_BLOCK);
    for b in src.chunks_exact(Q5_0_BLOCK) {
        out.extend_from_slice(&b[0..2]); // the f16 scale, unchanged
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let mut vals = [0i8; 32];
        for j in 0..16 {
            let h0 = (((qh >> j) << 4) & 0x10) as u8;
            let h1 = ((qh >> (j + 12)) & 0x10) as u8;
            vals[j] = (((qs[j] & 0x0F) | h0) as i16 - 16) as i8;
            vals[j + 16] = (((qs[j] >> 4) | h1) as i16 - 16) as i8;
        }
        out.extend(vals.iter().map(|v| *v as u8));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn repacked_blocks_dequantize_identically() -> Result<()> {
        let dev = Device::Cpu;
        let data: Vec<f32> = (0..4 * 64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let t = Tensor::from_vec(data, (4, 64), &dev)?;
        let q5 = QTensor::quantize(&t, GgmlDType::Q5_0)?;
        let bytes = q5_0_to_q8_0(&q5.data()?)?;
        let q8 = qtensor_from_ggml(GgmlDType::Q8_0, &bytes, vec![4, 64], &dev)?;
        let a = q5.dequantize(&dev)?;
        let b = q8.dequantize(&dev)?;
        assert_eq!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn rejects_partial_blocks() {
        assert!(q5_0_to_q8_0(&[0u8; 23]).is_err());
    }
}
