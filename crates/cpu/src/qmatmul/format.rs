//! The quantized weight types the CPU kernels read, and how a ggml block of each decodes into
//! one canonical form: per row and superblock, the float scales, the integer sub-block scales
//! and mins, and the stored integer of every weight (so that weight = `d·sc·(q − offset) −
//! dmin·min`). Byte layouts follow ggml's `block_q*` structs exactly (checked against ggml's
//! dequantization, through candle, in the engine's tests).

/// A quantized weight type with a CPU kernel of our own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// 32 weights `d·(q − 8)`, `q` 4 bits.
    Q4_0,
    /// 32 weights `d·(q − 16)`, `q` 5 bits.
    Q5_0,
    /// 32 weights `d·q`, `q` a signed byte.
    Q8_0,
    /// 256 weights in 8 sub-blocks of 32: `d·sc·q − dmin·m`, `q` 4 bits, `sc`/`m` 6 bits.
    Q4K,
    /// As Q4K with 5-bit `q`.
    Q5K,
    /// 256 weights in 16 sub-blocks of 16: `d·sc·(q − 32)`, `q` 6 bits, `sc` a signed byte.
    Q6K,
}

/// Every format, for tests and listings.
pub const ALL_FORMATS: [QFormat; 6] = [
    QFormat::Q4_0,
    QFormat::Q5_0,
    QFormat::Q8_0,
    QFormat::Q4K,
    QFormat::Q5K,
    QFormat::Q6K,
];

/// The fixed geometry of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Weights per superblock (one float scale per row and superblock).
    pub sb: usize,
    /// Weights per sub-block (one integer scale, and min, per row and sub-block); `sb` when
    /// the format has no sub-block scales.
    pub sub: usize,
    /// Bits of each stored integer.
    pub bits: u32,
    /// Subtracted from each stored integer (Q8_0's signed bytes: 0).
    pub offset: i32,
    /// Integer sub-block scales (K formats).
    pub scales: bool,
    /// Sub-block scales are signed bytes (Q6K) rather than 6-bit unsigned ones.
    pub signed_scales: bool,
    /// A `dmin` and per-sub-block mins (Q4K, Q5K).
    pub mins: bool,
    /// Bytes of one ggml block (`sb` weights of one row).
    pub ggml_block: usize,
}

impl QFormat {
    /// The format's geometry.
    pub const fn geometry(self) -> Geometry {
        match self {
            QFormat::Q4_0 => block(4, 8, 18),
            QFormat::Q5_0 => block(5, 16, 22),
            QFormat::Q8_0 => block(8, 0, 34),
            QFormat::Q4K => Geometry {
                sb: 256,
                sub: 32,
                bits: 4,
                offset: 0,
                scales: true,
                signed_scales: false,
                mins: true,
                ggml_block: 144,
            },
            QFormat::Q5K => Geometry {
                sb: 256,
                sub: 32,
                bits: 5,
                offset: 0,
                scales: true,
                signed_scales: false,
                mins: true,
                ggml_block: 176,
            },
            QFormat::Q6K => Geometry {
                sb: 256,
                sub: 16,
                bits: 6,
                offset: 32,
                scales: true,
                signed_scales: true,
                mins: false,
                ggml_block: 210,
            },
        }
    }

    /// Lower-case name (`q4_k`), as the profiler labels matmuls.
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q4_0 => "q4_0",
            QFormat::Q5_0 => "q5_0",
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4K => "q4_k",
            QFormat::Q5K => "q5_k",
            QFormat::Q6K => "q6_k",
        }
    }
}

/// A 32-weight block format's geometry.
const fn block(bits: u32, offset: i32, ggml_block: usize) -> Geometry {
    Geometry {
        sb: 32,
        sub: 32,
        bits,
        offset,
        scales: false,
        signed_scales: false,
        mins: false,
        ggml_block,
    }
}

/// One row's superblock in canonical form.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Superblock scale (f16 bits).
    pub d: u16,
    /// Superblock min scale (f16 bits; 0 without mins).
    pub dmin: u16,
    /// Sub-block scales (as stored: 6-bit unsigned, or signed bytes for Q6K); empty without.
    pub scales: Vec<u8>,
    /// Sub-block mins; empty without.
    pub mins: Vec<u8>,
    /// The stored integer of each weight (`bits` wide; Q8_0's signed byte as its bits).
    pub q: Vec<u8>,
}

impl Decoded {
    /// The weights as f32, as ggml dequantizes them.
    pub fn values(&self, g: &Geometry) -> Vec<f32> {
        use half::f16;
        let d = f16::from_bits(self.d).to_f32();
        let dmin = f16::from_bits(self.dmin).to_f32();
        self.q
            .iter()
            .enumerate()
            .map(|(k, &q)| {
                let q = if g.bits == 8 {
                    q as i8 as i32
                } else {
                    q as i32 - g.offset
                };
                let s = k / g.sub;
                let sc = if !g.scales {
                    1.0
                } else if g.signed_scales {
                    self.scales[s] as i8 as f32
                } else {
                    self.scales[s] as f32
                };
                let m = if g.mins { self.mins[s] as f32 } else { 0.0 };
                d * sc * q as f32 - dmin * m
            })
            .collect()
    }
}

fn f16_bits(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// ggml's 6-bit scale and min of sub-block `j` from a K block's 12 packed bytes.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Decodes one ggml block of `format` (`block.len()` is the format's `ggml_block`).
pub fn decode_block(format: QFormat, block: &[u8]) -> Decoded {
    let g = format.geometry();
    debug_assert_eq!(block.len(), g.ggml_block);
    let mut q = vec![0u8; g.sb];
    let mut out = Decoded {
        d: 0,
        dmin: 0,
        scales: Vec::new(),
        mins: Vec::new(),
        q: Vec::new(),
    };
    match format {
        QFormat::Q4_0 => {
            out.d = f16_bits(block);
            let qs = &block[2..18];
            for j in 0..16 {
                q[j] = qs[j] & 0x0F;
                q[j + 16] = qs[j] >> 4;
            }
        }
        QFormat::Q5_0 => {
            out.d = f16_bits(block);
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let qs = &block[6..22];
            for j in 0..16 {
                q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
        }
        QFormat::Q8_0 => {
            out.d = f16_bits(block);
            q.copy_from_slice(&block[2..34]);
        }
        QFormat::Q4K | QFormat::Q5K => {
            out.d = f16_bits(block);
            out.dmin = f16_bits(&block[2..]);
            let packed = &block[4..16];
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, packed);
                out.scales.push(sc);
                out.mins.push(m);
            }
            let (qh, qs) = if format == QFormat::Q5K {
                (Some(&block[16..48]), &block[48..176])
            } else {
                (None, &block[16..144])
            };
            for j in 0..4 {
                for l in 0..32 {
                    let byte = qs[32 * j + l];
                    let (mut lo, mut hi) = (byte & 0x0F, byte >> 4);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    }
                    q[64 * j + l] = lo;
                    q[64 * j + 32 + l] = hi;
                }
            }
        }
        QFormat::Q6K => {
            let (ql, qh, sc) = (&block[0..128], &block[128..192], &block[192..208]);
            out.d = f16_bits(&block[208..]);
            out.scales = sc.to_vec();
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
                for l in 0..32 {
                    let base = 128 * n + l;
                    q[base] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                    q[base + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                    q[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
        }
    }
    out.q = q;
    out
}
