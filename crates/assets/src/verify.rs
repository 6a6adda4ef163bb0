//! Checksums for asset files: streaming sha256, and a `<file>.sha256` stamp recording the
//! size, mtime and hash of the last full verification so warm checks need no re-hash.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::AssetError;

/// Lower-case hex of a sha256 digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 (hex) and length of everything `reader` yields.
pub fn sha256_reader(mut reader: impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex(&hasher.finalize()), len))
}

/// sha256 (hex) and length of a file.
pub fn sha256_file(path: &Path) -> Result<(String, u64), AssetError> {
    let file = fs::File::open(path).map_err(|e| AssetError::io(path, e))?;
    sha256_reader(io::BufReader::new(file)).map_err(|e| AssetError::io(path, e))
}

/// A writer that hashes and counts what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// The inner writer, the hex digest and the byte count.
    pub fn finish(self) -> (W, String, u64) {
        (self.inner, hex(&self.hasher.finalize()), self.written)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Path of the verification stamp of `file`.
pub fn stamp_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    file.with_file_name(name)
}

/// What a stamp records: the file's size and mtime when it was hashed, and the hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub sha256: String,
    pub size: u64,
    pub mtime_ns: u128,
}

impl Stamp {
    fn render(&self) -> String {
        format!("{} {} {}\n", self.sha256, self.size, self.mtime_ns)
    }

    fn parse(text: &str) -> Option<Stamp> {
        let mut it = text.split_whitespace();
        let sha256 = it.next()?.to_owned();
        let size = it.next()?.parse().ok()?;
        let mtime_ns = it.next()?.parse().ok()?;
        (sha256.len() == 64 && it.next().is_none()).then_some(Stamp {
            sha256,
            size,
            mtime_ns,
        })
    }
}

/// Size and mtime (ns since the epoch) of `path` as the filesystem reports them now.
pub fn size_and_mtime(path: &Path) -> io::Result<(u64, u128)> {
    let meta = fs::metadata(path)?;
    let mtime = meta
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok((meta.len(), mtime))
}

/// The stamp of `file` if it exists, parses, and still describes the file's size and mtime.
pub fn read_fresh_stamp(file: &Path) -> Option<Stamp> {
    let text = fs::read_to_string(stamp_path(file)).ok()?;
    let stamp = Stamp::parse(&text)?;
    let (size, mtime_ns) = size_and_mtime(file).ok()?;
    (stamp.size == size && stamp.mtime_ns == mtime_ns).then_some(stamp)
}

/// Records that `file` currently hashes to `sha256` (written atomically next to it).
pub fn write_stamp(file: &Path, sha256: &str) -> Result<(), AssetError> {
    let (size, mtime_ns) = size_and_mtime(file).map_err(|e| AssetError::io(file, e))?;
    let stamp = Stamp {
        sha256: sha256.to_owned(),
        size,
        mtime_ns,
    };
    let path = stamp_path(file);
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| AssetError::io(dir, e))?;
    tmp.write_all(stamp.render().as_bytes())
        .map_err(|e| AssetError::io(tmp.path(), e))?;
    make_readable(tmp.path())?;
    tmp.persist(&path)
        .map_err(|e| AssetError::io(&path, e.error))?;
    Ok(())
}

/// Temp files are created owner-only; assets and stamps are ordinary readable files.
pub fn make_readable(path: &Path) -> Result<(), AssetError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644))
            .map_err(|e| AssetError::io(path, e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Removes the stamp of `file`, if any (before the file is replaced).
pub fn remove_stamp(file: &Path) -> Result<(), AssetError> {
    let path = stamp_path(file);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(AssetError::io(&path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_input() {
        let (h, n) = sha256_reader(&b"abc"[..]).unwrap();
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(n, 3);
    }

    #[test]
    fn hashing_writer_matches_reader() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        let (buf, h, n) = w.finish();
        assert_eq!(buf, b"hello world");
        assert_eq!(n, 11);
        assert_eq!(h, sha256_reader(&b"hello world"[..]).unwrap().0);
    }

    #[test]
    fn stamp_is_fresh_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.bin");
        fs::write(&file, b"12345").unwrap();
        assert!(read_fresh_stamp(&file).is_none());
        write_stamp(&file, &"a".repeat(64)).unwrap();
        let stamp = read_fresh_stamp(&file).unwrap();
        assert_eq!(stamp.size, 5);
        assert_eq!(stamp.sha256, "a".repeat(64));
        fs::write(&file, b"123456").unwrap();
        assert!(read_fresh_stamp(&file).is_none());
        remove_stamp(&file).unwrap();
        assert!(!stamp_path(&file).exists());
        remove_stamp(&file).unwrap();
    }

    #[test]
    fn malformed_stamps_are_ignored() {
        assert!(Stamp::parse("").is_none());
        assert!(Stamp::parse("abc 1 2").is_none());
        assert!(Stamp::parse(&format!("{} x 2", "a".repeat(64))).is_none());
        assert!(Stamp::parse(&format!("{} 1 2 3", "a".repeat(64))).is_none());
        let s = Stamp::parse(&format!("{} 1 2\n", "b".repeat(64))).unwrap();
        assert_eq!((s.size, s.mtime_ns), (1, 2));
    }
}
