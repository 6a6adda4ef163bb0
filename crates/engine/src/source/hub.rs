//! Hugging Face Hub downloads (cargo feature `hub`): a repository snapshot of the files a
//! text model needs, into the standard HF cache, with progress and cancellation. The async
//! client runs on a private tokio runtime that never leaves this module; the calling thread
//! only waits on a std channel, so the engine thread stays free of async code.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use hf_hub::progress::{DownloadEvent, ProgressEvent, ProgressHandler};
use hf_hub::{HFClient, HFError};

use super::SourceError;
use crate::events::{Event, LoadPhase};

/// Files of a text model; everything else (images, ONNX, GGUF variants) is skipped.
const PATTERNS: [&str; 4] = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.safetensors.index.json",
];

/// How often the waiting thread looks at the cancel flag.
const POLL: Duration = Duration::from_millis(100);

struct Forward(mpsc::Sender<(u64, u64)>);

impl ProgressHandler for Forward {
    fn on_progress(&self, event: &ProgressEvent) {
        let figures = match event {
            ProgressEvent::Download(DownloadEvent::Start { total_bytes, .. }) => (0, *total_bytes),
            ProgressEvent::Download(DownloadEvent::AggregateProgress {
                bytes_completed,
                total_bytes,
                ..
            }) => (*bytes_completed, *total_bytes),
            ProgressEvent::Download(DownloadEvent::Progress { files }) => {
                files.iter().fold((0, 0), |(d, t), f| {
                    (d + f.bytes_completed, t + f.total_bytes)
                })
            }
            _ => return,
        };
        // The receiver is gone only after the download ended; nothing to report then.
        let _ = self.0.send(figures);
    }
}

fn classify(repo: &str, e: HFError) -> SourceError {
    match e {
        HFError::RepoNotFound { .. }
        | HFError::RevisionNotFound { .. }
        | HFError::EntryNotFound { .. } => SourceError::HubNotFound {
            repo: repo.to_owned(),
            reason: e.to_string(),
        },
        other => SourceError::Network {
            repo: repo.to_owned(),
            reason: other.to_string(),
        },
    }
}

/// Downloads `repo` at `revision` and returns its local snapshot directory.
pub(super) fn download(
    repo: &str,
    revision: Option<&str>,
    emit: &mut dyn FnMut(Event),
    cancel: &AtomicBool,
) -> Result<PathBuf, SourceError> {
    let net = |reason: String| SourceError::Network {
        repo: repo.to_owned(),
        reason,
    };
    let (owner, name) = repo
        .split_once('/')
        .ok_or_else(|| net(format!("`{repo}` is not owner/name")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| net(format!("cannot start the download runtime: {e}")))?;
    let client = HFClient::new().map_err(|e| classify(repo, e))?;
    let handle = client.model(owner, name);
    let (tx, rx) = mpsc::channel();
    let revision = revision.map(str::to_owned);
    let task = runtime.spawn(async move {
        handle
            .snapshot_download()
            .maybe_revision(revision)
            .allow_patterns(PATTERNS.iter().map(|p| (*p).to_owned()).collect())
            .progress(Forward(tx))
            .send()
            .await
    });
    emit(Event::Loading {
        phase: LoadPhase::Downloading,
        done: None,
        total: None,
    });
    loop {
        if cancel.load(Ordering::Relaxed) {
            // Dropping the future stops the transfer; partial files stay in the HF cache's
            // incomplete area, as hf-hub does for any interrupted download.
            task.abort();
            return Err(SourceError::Cancelled);
        }
        match rx.recv_timeout(POLL) {
            Ok((done, total)) => emit(Event::Loading {
                phase: LoadPhase::Downloading,
                done: Some(done),
                total: Some(total),
            }),
            Err(mpsc::RecvTimeoutError::Timeout) if !task.is_finished() => {}
            // Finished (or the handler was dropped with the finished future).
            Err(_) if task.is_finished() => break,
            Err(_) => std::thread::sleep(POLL),
        }
    }
    match runtime.block_on(task) {
        Ok(Ok(dir)) => Ok(dir),
        Ok(Err(e)) => Err(classify(repo, e)),
        Err(e) => Err(net(format!("download task failed: {e}"))),
    }
}
