//! Little-endian bit streams: value k of width w occupies stream bits [k·w, (k+1)·w), stream
//! bit i living in byte i/8 at bit i%8. No padding between values.

/// Reads the `width`-bit value at stream bit `bit` (`width ≤ 8`). Bits past the end read as 0.
#[inline]
pub fn read(bytes: &[u8], bit: usize, width: u8) -> u8 {
    let byte = bit / 8;
    let shift = bit % 8;
    let lo = bytes.get(byte).copied().unwrap_or(0) as u16;
    let hi = bytes.get(byte + 1).copied().unwrap_or(0) as u16;
    let word = lo | (hi << 8);
    ((word >> shift) & ((1u16 << width) - 1)) as u8
}

/// Packs `codes` (each `< 2^width`, higher bits ignored) into `dst` starting at stream bit
/// `bit_offset`, leaving bits outside the written range untouched. Returns false (writing
/// nothing) when `dst` is too short.
pub fn pack(codes: &[u8], width: u8, dst: &mut [u8], bit_offset: usize) -> bool {
    if width == 0 || codes.is_empty() {
        return true;
    }
    let end_bit = bit_offset + codes.len() * width as usize;
    if end_bit.div_ceil(8) > dst.len() || width > 8 {
        return false;
    }
    let mask = (1u64 << width) - 1;
    let mut pos = bit_offset / 8;
    let mut nbits = (bit_offset % 8) as u32;
    let mut acc: u64 = (dst[pos] as u64) & ((1u64 << nbits) - 1);
    for &c in codes {
        acc |= (c as u64 & mask) << nbits;
        nbits += width as u32;
        while nbits >= 8 {
            dst[pos] = acc as u8;
            pos += 1;
            acc >>= 8;
            nbits -= 8;
        }
    }
    if nbits > 0 {
        let keep = !((1u8 << nbits) - 1);
        dst[pos] = (dst[pos] & keep) | acc as u8;
    }
    true
}

/// Unpacks `out.len()` values of `width` bits starting at stream bit `bit_offset`.
pub fn unpack(src: &[u8], bit_offset: usize, width: u8, out: &mut [u8]) {
    for (k, o) in out.iter_mut().enumerate() {
        *o = read(src, bit_offset + k * width as usize, width);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pack_unpack_roundtrip(width in 1u8..=8, offset in 0usize..24,
                                 raw in proptest::collection::vec(any::<u8>(), 0..200),
                                 fill in any::<u8>()) {
            let codes: Vec<u8> = raw.iter().map(|&c| (c as u16 & ((1u16 << width) - 1)) as u8).collect();
            let nbits = offset + codes.len() * width as usize;
            let mut buf = vec![fill; nbits.div_ceil(8) + 2];
            prop_assert!(pack(&codes, width, &mut buf, offset));
            let mut back = vec![0u8; codes.len()];
            unpack(&buf, offset, width, &mut back);
            prop_assert_eq!(&back, &codes);
            // Bits before the offset and after the end are untouched.
            for b in 0..offset {
                prop_assert_eq!(read(&buf, b, 1), (fill >> (b % 8)) & 1);
            }
            for b in nbits..buf.len() * 8 {
                prop_assert_eq!(read(&buf, b, 1), (fill >> (b % 8)) & 1);
            }
        }
    }

    #[test]
    fn three_bit_codes_take_three_bits() {
        let codes = [1u8, 2, 3, 4, 5, 6, 7, 0];
        let mut buf = [0u8; 3];
        assert!(pack(&codes, 3, &mut buf, 0));
        // 8 three-bit values fit exactly in 3 bytes, LSB first.
        let expect: u32 = codes
            .iter()
            .enumerate()
            .map(|(k, &c)| (c as u32) << (3 * k))
            .sum();
        assert_eq!(
            buf,
            [expect as u8, (expect >> 8) as u8, (expect >> 16) as u8]
        );
        assert!(!pack(&codes, 3, &mut [0u8; 2], 0));
    }
}
