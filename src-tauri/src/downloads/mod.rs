//! Model downloads from the Hugging Face Hub for the UI: start one (streaming bytes, total,
//! speed and ETA over a channel), cancel it, and start it again later to resume where it
//! stopped (the engine keeps partial files). The transfer runs on a blocking-pool thread,
//! never on Tauri's async workers nor on the engine thread. `HF_ENDPOINT` and `HF_TOKEN`
//! are honoured (hf-hub reads them); files go under `$KVLAB_CACHE/hub`. A GGUF repository
//! is listed by quantization first (sizes from the Hub listing) and one quant is fetched.

mod catalog;
mod rate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvlab_engine::hub::GgufQuant;
use kvlab_engine::hub::SourceError;
use kvlab_engine::hub::{download_model, list_gguf_quants, DownloadProgress, HubOptions};
use serde::Serialize;
use tauri::ipc::Channel;
use tauri::State;
use ts_rs::TS;

pub use catalog::{hub_models as catalog, HubModel};
use rate::Rate;

use crate::error::{CommandError, ErrorCode};

/// Progress reaches the UI at most this often (plus the final figure).
const EMIT_EVERY: Duration = Duration::from_millis(100);
/// Speed is averaged over this much time.
const RATE_WINDOW: Duration = Duration::from_secs(3);

/// Cancel flags of the running downloads, by repository.
type Registry = HashMap<String, Arc<AtomicBool>>;

/// The downloads running now, by repository, each with its cancel flag.
#[derive(Debug, Clone, Default)]
pub struct Downloads {
    running: Arc<Mutex<Registry>>,
}

impl Downloads {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Registry>, CommandError> {
        self.running
            .lock()
            .map_err(|_| CommandError::new(ErrorCode::Internal, "download registry lock poisoned"))
    }

    /// Registers `repo`; fails if it is already downloading.
    fn begin(&self, repo: &str) -> Result<Running, CommandError> {
        let mut running = self.lock()?;
        if running.contains_key(repo) {
            return Err(CommandError::new(
                ErrorCode::Busy,
                format!("{repo} is already downloading"),
            ));
        }
        let flag = Arc::new(AtomicBool::new(false));
        running.insert(repo.to_owned(), flag.clone());
        Ok(Running {
            downloads: self.clone(),
            repo: repo.to_owned(),
            cancel: flag,
        })
    }

    /// Asks the download of `repo` to stop; `false` if none runs.
    pub fn cancel(&self, repo: &str) -> Result<bool, CommandError> {
        Ok(match self.lock()?.get(repo) {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        })
    }
}

/// A registered download; unregisters itself when dropped (finished, failed or cancelled).
#[derive(Debug)]
struct Running {
    downloads: Downloads,
    repo: String,
    cancel: Arc<AtomicBool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut running) = self.downloads.running.lock() {
            running.remove(&self.repo);
        }
    }
}

/// One progress message.
#[derive(Debug, Clone, PartialEq, Serialize, TS)]
pub struct DownloadUpdate {
    pub repo: String,
    /// The file being fetched.
    pub file: String,
    pub file_done: u64,
    pub file_total: u64,
    /// Bytes on disk over all files, including those kept from an earlier run.
    pub done: u64,
    pub total: u64,
    /// Over the last few seconds; `None` until measurable.
    pub bytes_per_sec: Option<f64>,
    /// Seconds left at that speed.
    pub eta_secs: Option<f64>,
}

/// A finished download: what `load_model` takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, TS)]
pub struct Downloaded {
    pub repo: String,
    /// The snapshot directory, or the GGUF file of the quant chosen.
    pub path: String,
}

/// Turns engine progress into throttled updates with speed and ETA.
struct Reporter<F: FnMut(DownloadUpdate)> {
    repo: String,
    start: Instant,
    last_emit: Option<Duration>,
    rate: Rate,
    send: F,
}

impl<F: FnMut(DownloadUpdate)> Reporter<F> {
    fn new(repo: &str, send: F) -> Self {
        Self {
            repo: repo.to_owned(),
            start: Instant::now(),
            last_emit: None,
            rate: Rate::new(RATE_WINDOW),
            send,
        }
    }

    fn on(&mut self, p: &DownloadProgress, at: Duration) {
        self.rate.push(at, p.done);
        let due = self
            .last_emit
            .is_none_or(|last| at.saturating_sub(last) >= EMIT_EVERY);
        if !due && p.done < p.total {
            return;
        }
        self.last_emit = Some(at);
        (self.send)(DownloadUpdate {
            repo: self.repo.clone(),
            file: p.file.clone(),
            file_done: p.file_done,
            file_total: p.file_total,
            done: p.done,
            total: p.total,
            bytes_per_sec: self.rate.bytes_per_sec(),
            eta_secs: self.rate.eta_secs(p.total),
        });
    }
}

/// A Hub id as the app takes it.
type RepoId = (String, Option<String>, Option<String>);

/// `owner/name[:QUANT][@revision]` as (repo, revision, quant), or an `invalid_request` error.
pub(crate) fn parse_repo(s: &str) -> Result<RepoId, CommandError> {
    match kvlab_engine::hub::hub_id(s.trim()) {
        Some((repo, quant, revision)) => Ok((repo, revision, quant)),
        None => Err(CommandError::new(
            ErrorCode::InvalidRequest,
            format!("`{s}` is not a Hugging Face repository id (owner/name)"),
        )),
    }
}

/// A download error as the UI sees it: `network` (offer the offline model),
/// `model_not_found`, `cancelled`, ...
fn command_error(e: SourceError) -> CommandError {
    CommandError::new(e.code(), e.to_string())
}

/// The curated models the picker offers.
#[tauri::command]
pub fn hub_models() -> Vec<HubModel> {
    catalog()
}

/// The GGUF quantizations `repo` offers, smallest first, with their sizes; nothing is
/// downloaded. Empty for a repository without GGUF files.
#[tauri::command]
pub async fn hub_quants(repo: String) -> Result<Vec<GgufQuant>, CommandError> {
    let (repo, revision, _) = parse_repo(&repo)?;
    tauri::async_runtime::spawn_blocking(move || {
        let never = AtomicBool::new(false);
        list_gguf_quants(&repo, revision.as_deref(), &HubOptions::default(), &never)
            .map_err(command_error)
    })
    .await
    .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

/// Downloads (or resumes) `repo` (for a GGUF repository, the `quant` chosen) and returns
/// what to load: its folder, or the GGUF file; progress goes to `on_progress`.
#[tauri::command]
pub async fn start_download(
    downloads: State<'_, Downloads>,
    repo: String,
    quant: Option<String>,
    on_progress: Channel<DownloadUpdate>,
) -> Result<Downloaded, CommandError> {
    let (repo, revision, typed) = parse_repo(&repo)?;
    let quant = quant.or(typed);
    let running = downloads.begin(&repo)?;
    tauri::async_runtime::spawn_blocking(move || {
        let mut reporter = Reporter::new(&running.repo, |u| {
            // A closed channel (window reloaded) must not stop the download.
            let _ = on_progress.send(u);
        });
        let start = reporter.start;
        let dir = download_model(
            &running.repo,
            revision.as_deref(),
            quant.as_deref(),
            &HubOptions::default(),
            &mut |p| reporter.on(p, start.elapsed()),
            &running.cancel,
        )
        .map_err(command_error)?;
        Ok(Downloaded {
            repo: running.repo.clone(),
            path: dir.display().to_string(),
        })
    })
    .await
    .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?
}

/// Stops the download of `repo`; its partial files stay for the next start.
#[tauri::command]
pub fn cancel_download(
    downloads: State<'_, Downloads>,
    repo: String,
) -> Result<bool, CommandError> {
    let (repo, _, _) = parse_repo(&repo)?;
    downloads.cancel(&repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(done: u64, total: u64) -> DownloadProgress {
        DownloadProgress {
            file: "model.safetensors".into(),
            file_done: done,
            file_total: total,
            done,
            total,
        }
    }

    #[test]
    fn updates_are_throttled_and_carry_speed_and_eta() {
        let mut sent = Vec::new();
        let mut r = Reporter::new("a/b", |u| sent.push(u));
        let ms = Duration::from_millis;
        r.on(&progress(0, 4000), ms(0));
        r.on(&progress(100, 4000), ms(50)); // too soon: dropped
        r.on(&progress(1000, 4000), ms(1000));
        r.on(&progress(4000, 4000), ms(1010)); // the end is always sent
        let figures: Vec<_> = sent
            .iter()
            .map(|u| (u.done, u.bytes_per_sec.map(|s| s.round()), u.eta_secs))
            .collect();
        assert_eq!(
            figures,
            vec![
                (0, None, None),
                (1000, Some(1000.0), Some(3.0)),
                (4000, Some(3960.0), Some(0.0)),
            ]
        );
        assert!(sent.iter().all(|u| u.repo == "a/b" && u.total == 4000));
    }

    #[test]
    fn repo_ids_are_checked_and_errors_keep_engine_codes() {
        assert_eq!(
            parse_repo(" google/gemma-4-E2B-it@main ").unwrap(),
            ("google/gemma-4-E2B-it".into(), Some("main".into()), None)
        );
        assert_eq!(
            parse_repo("unsloth/gemma-4-E4B-it-GGUF:Q8_0").unwrap(),
            (
                "unsloth/gemma-4-E4B-it-GGUF".into(),
                None,
                Some("Q8_0".into())
            )
        );
        assert_eq!(
            parse_repo("not a repo").unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        let e = command_error(SourceError::Network {
            repo: "a/b".into(),
            reason: "connection refused".into(),
        });
        assert_eq!(e.code, ErrorCode::Network);
        assert!(e.message.contains("connection refused"), "{}", e.message);
        assert_eq!(
            command_error(SourceError::Cancelled).code,
            ErrorCode::Cancelled
        );
    }

    #[test]
    fn one_download_per_repo_and_cancel_reaches_it() {
        let d = Downloads::default();
        let running = d.begin("a/b").unwrap();
        assert_eq!(d.begin("a/b").unwrap_err().code, ErrorCode::Busy);
        assert!(d.cancel("a/b").unwrap());
        assert!(running.cancel.load(Ordering::Relaxed));
        assert!(!d.cancel("c/d").unwrap());
        drop(running);
        // Finished downloads unregister, so the same repo can start again (to resume).
        assert!(!d.cancel("a/b").unwrap());
        assert!(d.begin("a/b").is_ok());
    }
}
