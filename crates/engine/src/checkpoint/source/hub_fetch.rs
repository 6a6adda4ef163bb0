//! Fetches the files of one Hub snapshot with resume: each file streams into `<file>.part`,
//! continuing with an HTTP range from the bytes already there, is checked (size, and SHA-256
//! when the listing gives one) and then renamed into place. Before anything is fetched, the
//! bytes still missing are checked against the disk's free space. A transfer that breaks is
//! retried as [`RetryPolicy`] says, resuming each time; a partial file is kept only while it
//! can be a prefix of the listed file (never longer than it, never after a checksum
//! mismatch, never from a response for another range). The cancel flag is looked at before
//! every request and between chunks (and every [`POLL`] while the network is silent); a
//! cancelled or broken transfer leaves its `.part` file for the next run.

use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use hf_hub::repository::{HFRepository, RepoTypeModel};
use hf_hub::HFError;

use super::hub::DownloadProgress;
use super::hub_retry::{pause, to_source_error, verdict, RetryPolicy, Tries, Verdict};
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

/// Whether an I/O error means "no room": a full disk, a quota, or a file larger than the
/// file system (or the process's file-size limit) allows.
fn is_no_room(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::StorageFull | K::QuotaExceeded | K::FileTooLarge
    )
}

/// A failed local write or read as the user should see it.
pub(super) fn write_error(path: &Path, e: std::io::Error, needed: Option<u64>) -> SourceError {
    if is_no_room(&e) {
        SourceError::DiskFull {
            path: path.to_path_buf(),
            needed,
            available: free_space(path),
            reason: e.to_string(),
        }
    } else {
        SourceError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// Free bytes on the file system holding `path` (the deepest mount point above it), when
/// the platform says.
pub(super) fn free_space(path: &Path) -> Option<u64> {
    let mut probe = path;
    // The path itself may not exist yet: measure its nearest existing ancestor.
    let real = loop {
        if let Ok(p) = probe.canonicalize() {
            break p;
        }
        probe = probe.parent()?;
    };
    let disks = sysinfo::Disks::new_with_refreshed_list();
    disks
        .list()
        .iter()
        .filter(|d| real.starts_with(d.mount_point()))
        .max_by_key(|d| d.mount_point().as_os_str().len())
        .map(|d| d.available_space())
}

/// What one download needs.
pub(super) struct Fetch<'a> {
    pub repo: &'a str,
    pub handle: &'a HFRepository<RepoTypeModel>,
    pub commit: &'a str,
    pub cancel: &'a AtomicBool,
    pub retry: &'a RetryPolicy,
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

/// How one try of one file ended.
enum Transfer {
    /// Every listed byte is in the `.part` file; `resumed` when it continued earlier bytes.
    Complete { resumed: bool },
    /// The request or the body failed; `in_body` once bytes had started to arrive.
    Broken { error: HFError, in_body: bool },
    /// The body ended cleanly, short of the listed size.
    Short,
}

impl Fetch<'_> {
    /// Fetches every job in order, reporting progress after every chunk. Refuses up front
    /// when the bytes still missing exceed the free space where they go.
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
        if let Some(dir) = jobs.first().and_then(|j| j.dest.parent()) {
            let missing = tally.total - tally.done;
            if let Some(free) = free_space(dir) {
                if missing > free {
                    return Err(SourceError::DiskFull {
                        path: dir.to_path_buf(),
                        needed: Some(missing),
                        available: Some(free),
                        reason: "not enough free space for the download".into(),
                    });
                }
            }
        }
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

    /// Fetches one file, retrying broken transfers (resuming from the bytes kept) and, once,
    /// a resumed file whose checksum fails (its earlier bytes may have been bad).
    async fn one(&self, job: &FileJob, tally: &mut Tally<'_>) -> Result<(), SourceError> {
        if let Some(parent) = job.dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| write_error(parent, e, None))?;
        }
        let part = part_path(&job.dest);
        let mut tries = Tries::default();
        let mut restarted = false;
        loop {
            let outcome = self.transfer(job, &part, tally).await?;
            let (wait, last_error) = match outcome {
                Transfer::Complete { resumed } => match self.verify(job, &part) {
                    Ok(()) => {
                        return std::fs::rename(&part, &job.dest)
                            .map_err(|e| write_error(&job.dest, e, None))
                    }
                    Err(reason) => {
                        // Not the listed file: no prefix of it either. Drop it.
                        let _ = std::fs::remove_file(&part);
                        tally.done -= job.size;
                        tally.report(job, 0);
                        if resumed && !restarted {
                            restarted = true;
                            continue;
                        }
                        return Err(SourceError::Corrupt {
                            repo: self.repo.to_owned(),
                            file: job.path.clone(),
                            reason,
                        });
                    }
                },
                Transfer::Broken { error, in_body } => {
                    tries.made += 1;
                    match verdict(&error, self.retry, tries.made - 1) {
                        Verdict::Retry(w) if tries.made < self.retry.attempts.max(1) => (w, None),
                        _ if in_body => (Duration::ZERO, Some(self.incomplete(job, &part, tries))),
                        _ => (
                            Duration::ZERO,
                            Some(to_source_error(self.repo, error, tries)),
                        ),
                    }
                }
                Transfer::Short => {
                    tries.made += 1;
                    if tries.made < self.retry.attempts.max(1) {
                        (self.retry.backoff(tries.made - 1), None)
                    } else {
                        (Duration::ZERO, Some(self.incomplete(job, &part, tries)))
                    }
                }
            };
            if let Some(e) = last_error {
                return Err(e);
            }
            pause(wait, self.cancel).await?;
            tries.waited += wait;
        }
    }

    fn incomplete(&self, job: &FileJob, part: &Path, tries: Tries) -> SourceError {
        SourceError::Incomplete {
            repo: self.repo.to_owned(),
            file: job.path.clone(),
            have: len_of(part).unwrap_or(0),
            size: job.size,
            tries: tries.made,
        }
    }

    /// The SHA-256 check, when the listing gave a checksum.
    fn verify(&self, job: &FileJob, part: &Path) -> Result<(), String> {
        let Some(want) = &job.sha256 else {
            return Ok(());
        };
        let got = sha256_hex(part).map_err(|e| format!("cannot read it back: {e}"))?;
        if got.eq_ignore_ascii_case(want) {
            Ok(())
        } else {
            Err(format!("SHA-256 {got}, the Hub listed {want}"))
        }
    }

    /// One try: request the bytes after those on disk and append them to `part`.
    async fn transfer(
        &self,
        job: &FileJob,
        part: &Path,
        tally: &mut Tally<'_>,
    ) -> Result<Transfer, SourceError> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(|e| write_error(part, e, Some(job.size)))?;
        let mut have = len_of(part).unwrap_or(0);
        if have > job.size {
            // Longer than the file can be: not a prefix of it, start over.
            file.set_len(0).map_err(|e| write_error(part, e, None))?;
            tally.done -= have - job.size;
            have = 0;
        }
        tally.report(job, have);
        let mut resumed = have > 0;
        if have == job.size {
            return Ok(Transfer::Complete { resumed });
        }
        let range = resumed.then_some(have..job.size);
        let request = self
            .handle
            .download_file_stream()
            .filename(job.path.clone())
            .revision(self.commit.to_owned())
            .maybe_range(range)
            .send();
        let (length, mut stream) = match cancellable(request, self.cancel).await? {
            Ok(v) => v,
            Err(error) => {
                return Ok(Transfer::Broken {
                    error,
                    in_body: false,
                })
            }
        };
        if resumed && length != Some(job.size - have) {
            // Not the range asked for: the whole file (a server ignoring ranges), or bytes
            // whose place in the file is unknown. Either way, start again from byte 0.
            file.set_len(0).map_err(|e| write_error(part, e, None))?;
            tally.done -= have;
            have = 0;
            resumed = false;
            if length != Some(job.size) {
                drop(stream);
                return Ok(Transfer::Short);
            }
        }
        while let Some(chunk) = cancellable(stream.next(), self.cancel).await? {
            let chunk = match chunk {
                Ok(c) => c,
                Err(error) => {
                    return Ok(Transfer::Broken {
                        error,
                        in_body: true,
                    })
                }
            };
            let n = chunk.len() as u64;
            if have + n > job.size {
                file.set_len(0).map_err(|e| write_error(part, e, None))?;
                tally.done -= have;
                tally.report(job, 0);
                return Err(SourceError::Corrupt {
                    repo: self.repo.to_owned(),
                    file: job.path.clone(),
                    reason: format!("larger than the {} bytes the Hub listed", job.size),
                });
            }
            // A write that fails part-way leaves only whole, correct bytes: still a prefix.
            file.write_all(&chunk)
                .map_err(|e| write_error(part, e, Some(job.size - have)))?;
            have += n;
            tally.done += n;
            tally.report(job, have);
        }
        Ok(if have == job.size {
            Transfer::Complete { resumed }
        } else {
            Transfer::Short
        })
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
    use super::*;

    #[test]
    fn sha256_of_a_known_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_hex(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(sha256_hex(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn no_room_errors_are_disk_full_and_others_are_io() {
        use std::io::{Error, ErrorKind};
        for kind in [
            ErrorKind::StorageFull,
            ErrorKind::QuotaExceeded,
            ErrorKind::FileTooLarge,
        ] {
            let e = write_error(Path::new("/x/y.part"), Error::from(kind), Some(10));
            assert_eq!(e.code(), crate::contract::ErrorCode::DiskFull, "{kind:?}");
            assert!(e.to_string().contains("KVLAB_CACHE"), "{e}");
        }
        let e = write_error(
            Path::new("/x"),
            Error::from(ErrorKind::PermissionDenied),
            None,
        );
        assert_eq!(e.code(), crate::contract::ErrorCode::Io);
    }

    #[test]
    fn free_space_is_measured_at_the_nearest_existing_folder() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("not/yet/there");
        assert_eq!(
            free_space(&deep).is_some(),
            free_space(dir.path()).is_some()
        );
    }
}
