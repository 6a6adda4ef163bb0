//! Little-endian bytes for a cache's saved state: a writer that appends, and a reader that
//! refuses to read past its end, so a file that lies about its sizes fails before anything is
//! allocated for them.

use crate::error::{EngineError, Result};

/// Appends values to a byte buffer.
#[derive(Debug, Default)]
pub struct WireWriter {
    buf: Vec<u8>,
}

impl WireWriter {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, x: u8) {
        self.buf.push(x);
    }
    pub fn u32(&mut self, x: u32) {
        self.buf.extend_from_slice(&x.to_le_bytes());
    }
    pub fn u64(&mut self, x: u64) {
        self.buf.extend_from_slice(&x.to_le_bytes());
    }
    /// A length or count.
    pub fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    pub fn f32s(&mut self, xs: &[f32]) {
        self.buf.reserve(xs.len() * 4);
        for x in xs {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn u16s(&mut self, xs: impl Iterator<Item = u16>) {
        for x in xs {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads values back, in the order written, never past the end.
#[derive(Debug)]
pub struct WireReader<'a> {
    buf: &'a [u8],
    at: usize,
}

/// The error of a state that does not read back.
pub fn corrupt(what: impl std::fmt::Display) -> EngineError {
    EngineError::CacheCorrupt(what.to_string())
}

impl<'a> WireReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(corrupt(format!(
                "a section says {n} more bytes, {} are left",
                self.remaining()
            )));
        }
        let out = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A length or count, which must not exceed `max`.
    pub fn len(&mut self, max: usize, what: &str) -> Result<usize> {
        let n = self.u64()?;
        if n > max as u64 {
            return Err(corrupt(format!("{what} is {n}, at most {max} fits")));
        }
        Ok(n as usize)
    }
    /// `n` f32 values (checked against the bytes left before allocating).
    pub fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| corrupt("size overflow"))?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
    /// `n` u16 values (checked against the bytes left before allocating).
    pub fn u16s(&mut self, n: usize) -> Result<Vec<u16>> {
        let bytes = self.take(n.checked_mul(2).ok_or_else(|| corrupt("size overflow"))?)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    }
    /// Fails unless everything was read.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(corrupt(format!("{} bytes left over", self.remaining())));
        }
        Ok(())
    }
}
