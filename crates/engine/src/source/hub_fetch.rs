//! Fetches the files of one Hub snapshot with resume: each file streams into `<file>.part`,
//! continuing with an HTTP range from the bytes already there, is checked (size, and SHA-256
//! when the listing gives one) and then renamed into place. The cancel flag is looked at
//! before every request and between chunks (and every [`POLL`] while the network is silent);
//! a cancelled or broken transfer leaves its `.part` file for the next run.

use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use hf_hub::repository::{HFRepository, RepoTypeModel};

use super::hub::{classify, DownloadProgress};
use super::SourceError;

/// How often a silent transfer looks at the cancel flag.
const POLL: Duration = Duration::from_millis(100);

/// One file to fetch.
pub(super) struct FileJob {
    /// Repository path.
    pub path: String,
    /// Final local path.
    pub dest: PathBuf,
    /// Size the listing gave.
    pub size: u64,
    /// SHA-256 the listing gave (LFS files), if any.
    pub sha256: Option<String>,
}

/// Runs `f` unless `cancel` is set first (checked every [`POLL`]); dropping `f` stops it.
pub(super) async fn cancellable<F: Future>(
    f: F,
    cancel: &AtomicBool,
) -> Result<F::Output, SourceError> {
    let mut f = std::pin::pin!(f);
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(SourceError::Cancelled);
        }
        if let Ok(v) = tokio::time::timeout(POLL, f.as_mut()).await {
            return Ok(v);
        }
    }
}

/// The `.part` file that holds a partial `dest`.
pub(super) fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

fn len_of(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn is_complete(job: &FileJob) -> bool {
    len_of(&job.dest) == Some(job.size)
}

/// Bytes of `job` already on disk (complete file or usable partial).
fn on_disk(job: &FileJob) -> u64 {
    if is_complete(job) {
        return job.size;
    }
    len_of(&part_path(&job.dest))
        .filter(|&n| n <= job.size)
        .unwrap_or(0)
}

/// What one download needs.
pub(super) struct Fetch<'a> {
    pub repo: &'a str,
    pub handle: &'a HFRepository<RepoTypeModel>,
    pub commit: &'a str,
    pub cancel: &'a AtomicBool,
}

struct Tally<'p> {
    done: u64,
    total: u64,
    on_progress: &'p mut dyn FnMut(&DownloadProgress),
}

impl Tally<'_> {
    fn report(&mut self, job: &FileJob, file_done: u64) {
        (self.on_progress)(&DownloadProgress {
            file: job.path.clone(),
            file_done,
            file_total: job.size,
            done: self.done,
            total: self.total,
        });
    }
}

impl Fetch<'_> {
    fn fail(&self, reason: String) -> SourceError {
        SourceError::Network {
            repo: self.repo.to_owned(),
            reason,
        }
    }

    fn io(&self, path: &Path, e: std::io::Error) -> SourceError {
        self.fail(format!("cannot write {}: {e}", path.display()))
    }

    /// Fetches every job in order, reporting progress after every chunk.
    pub async fn all(
        &self,
        jobs: &[FileJob],
        on_progress: &mut dyn FnMut(&DownloadProgress),
    ) -> Result<(), SourceError> {
        let mut tally = Tally {
            done: jobs.iter().map(on_disk).sum(),
            total: jobs.iter().map(|j| j.size).sum(),
            on_progress,
        };
        for job in jobs {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(SourceError::Cancelled);
            }
            if is_complete(job) {
                tally.report(job, job.size);
                continue;
            }
            self.one(job, &mut tally).await?;
        }
        Ok(())
    }

    async fn one(&self, job: &FileJob, tally: &mut Tally<'_>) -> Result<(), SourceError> {
        if let Some(parent) = job.dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| self.io(parent, e))?;
        }
        let part = part_path(&job.dest);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&part)
            .map_err(|e| self.io(&part, e))?;
        let mut have = len_of(&part).unwrap_or(0);
        if have > job.size {
            // Longer than the file can be: not a prefix of it, start over.
            file.set_len(0).map_err(|e| self.io(&part, e))?;
            have = 0;
        }
        tally.report(job, have);
        if have < job.size {
            let range = (have > 0).then_some(have..job.size);
            let request = self
                .handle
                .download_file_stream()
                .filename(job.path.clone())
                .revision(self.commit.to_owned())
                .maybe_range(range)
                .send();
            let (length, mut stream) = cancellable(request, self.cancel)
                .await?
                .map_err(|e| classify(self.repo, e))?;
            if have > 0 && length == Some(job.size) {
                // The server ignored the range and sends the whole file: take it from byte 0.
                file.set_len(0).map_err(|e| self.io(&part, e))?;
                tally.done -= have;
                have = 0;
            }
            while let Some(chunk) = cancellable(stream.next(), self.cancel).await? {
                let chunk = chunk.map_err(|e| classify(self.repo, e))?;
                let n = chunk.len() as u64;
                if have + n > job.size {
                    file.set_len(0).map_err(|e| self.io(&part, e))?;
                    return Err(self.fail(format!(
                        "{} is larger than the {} bytes the Hub listed",
                        job.path, job.size
                    )));
                }
                file.write_all(&chunk).map_err(|e| self.io(&part, e))?;
                have += n;
                tally.done += n;
                tally.report(job, have);
            }
            if have != job.size {
                // Kept: the next run resumes from here.
                return Err(self.fail(format!(
                    "{} ended early at {have} of {} bytes; retry to resume",
                    job.path, job.size
                )));
            }
        }
        drop(file);
        if let Some(want) = &job.sha256 {
            let got = sha256_hex(&part)
                .map_err(|e| self.fail(format!("cannot read {}: {e}", part.display())))?;
            if !got.eq_ignore_ascii_case(want) {
                // A bad partial would fail forever: drop it so the retry starts clean.
                let _ = std::fs::remove_file(&part);
                return Err(self.fail(format!(
                    "{} has SHA-256 {got}, the Hub listed {want}; the file was discarded, retry",
                    job.path
                )));
            }
        }
        std::fs::rename(&part, &job.dest).map_err(|e| self.io(&job.dest, e))
    }
}

/// Lower-case hex SHA-256 of a file's bytes.
fn sha256_hex(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_a_known_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            super::sha256_hex(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(super::sha256_hex(&dir.path().join("absent")).is_err());
    }
}
