//! Control jobs, answered between steps: cancels, forgets, switches of a conversation's
//! cache, saving and restoring cache files, the default policy, unloading.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::error::JobError;
use super::{CacheFileInfo, Control, Job};
use crate::contract::ErrorCode;
use crate::contract::{ConversationId, MarkerKind};
use crate::conversations::{Need, Purpose};
use crate::generate::session::Session;
use crate::kv::{KvMemoryReport, PrecisionPolicy};
use crate::memory::{estimate_kv_bytes, SwitchEvent};

use super::run::{named, Task, Worker};

impl Worker {
    /// Runs one step of the next running request, and finishes it when it ends.
    pub(super) fn control(&mut self, control: Control) {
        match control {
            Control::Cancel(conversation) => {
                for task in &self.tasks {
                    let theirs = match (task, &conversation) {
                        (_, None) => true,
                        (Task::Turn { id, .. }, Some(c)) => id == c,
                        (Task::Compare { .. }, Some(_)) => false,
                    };
                    if theirs {
                        task.cancel().cancel();
                    }
                }
                for job in &self.waiting {
                    if let Job::Generate(q) = job {
                        let theirs = conversation.is_none()
                            || named(&q.job.request.conversation) == conversation;
                        if theirs {
                            q.cancel.cancel();
                        }
                    } else if let (Job::Compare(q), None) = (job, &conversation) {
                        q.cancel.cancel();
                    }
                }
            }
            Control::CancelCompares => {
                for task in &self.tasks {
                    if let Task::Compare { cancel, .. } = task {
                        cancel.cancel();
                    }
                }
                for job in &self.waiting {
                    if let Job::Compare(q) = job {
                        q.cancel.cancel();
                    }
                }
            }
            Control::Forget {
                conversation,
                file,
                reply,
            } => {
                let r = if self.pool.is_busy(&conversation) {
                    Err(JobError::busy("forget a conversation"))
                } else {
                    let (_, spill) = self.settings();
                    if file {
                        self.pool.forget(&conversation, spill.as_ref());
                        Ok(())
                    } else {
                        self.pool.reset(&conversation).map_err(JobError::from)
                    }
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SwitchCache {
                conversation,
                policy,
                reply,
            } => {
                let r = self.switch(&conversation, &policy);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SetDefaultPolicy { policy, reply } => {
                let empty = empty_report();
                let marker =
                    SwitchEvent::between((&self.policy, &empty), (&policy, &empty), 0, (0, 0), 0.0);
                self.policy = policy;
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(Ok(marker));
            }
            Control::SaveCache {
                conversation,
                path,
                reply,
            } => {
                let r = self.save_cache(&conversation, path);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::RestoreCache {
                conversation,
                path,
                reply,
            } => {
                let r = self.restore_cache(&conversation, path);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::SaveAll { reply } => {
                let saved = self.save_all(false);
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(saved);
            }
            Control::SavedCaches { only, reply } => {
                let (_, spill) = self.settings();
                let files = match (spill, only) {
                    (None, _) => Vec::new(),
                    (Some(d), None) => d.list(),
                    (Some(d), Some(id)) => d.saved(&id).map(|c| (id, c)).into_iter().collect(),
                };
                let _ = reply.send(Ok(files));
            }
            Control::DropSavedCache {
                conversation,
                reply,
            } => {
                let (_, spill) = self.settings();
                if let Some(spill) = spill {
                    self.pool.drop_file(&conversation, &spill);
                }
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(Ok(()));
            }
            Control::Unload { reply } => {
                let r = if !self.tasks.is_empty() {
                    Err(JobError::busy("unload the model"))
                } else {
                    self.save_all(true);
                    self.pool.clear();
                    self.loaded = None;
                    Ok(())
                };
                // Status first: a caller acting on the reply sees it current.
                self.publish();
                let _ = reply.send(r);
            }
            Control::Shutdown => {}
        }
    }

    /// Writes every conversation in memory to its spill file (each its own); with `free`,
    /// their memory goes too.
    pub(super) fn save_all(&mut self, free: bool) -> Vec<super::SaveOutcome> {
        let (settings, spill) = self.settings();
        let Some(spill) = spill else {
            return Vec::new();
        };
        if self.loaded.is_none() || self.identity().is_err() {
            return Vec::new();
        }
        self.pool
            .save_all(&spill, free, settings.disk_budget)
            .into_iter()
            .map(|(id, r)| (id, r.map_err(JobError::from)))
            .collect()
    }

    /// A switch by its owner: `conversation` re-encoded in `policy` when in memory (room made
    /// first), else the policy of its next turn; without a model, the next load's.
    pub(super) fn switch(
        &mut self,
        conversation: &ConversationId,
        policy: &PrecisionPolicy,
    ) -> Result<SwitchEvent, JobError> {
        if self.loaded.is_none() {
            let empty = empty_report();
            let marker =
                SwitchEvent::between((&self.policy, &empty), (policy, &empty), 0, (0, 0), 0.0);
            self.policy = policy.clone();
            return Ok(marker);
        }
        if self.pool.session(conversation).is_some() {
            return self.switch_in_pool(conversation, policy);
        }
        let (_, spill) = self.settings();
        self.pool.ensure(conversation, policy, spill.as_ref());
        let from = self.pool.policy(conversation).cloned().unwrap_or_default();
        self.pool.set_policy(conversation, policy);
        let empty = empty_report();
        Ok(
            SwitchEvent::between((&from, &empty), (policy, &empty), 0, (0, 0), 0.0)
                .of(MarkerKind::Switch, conversation),
        )
    }

    /// Switches `conversation`, in memory, to `policy` ([`Pool::switch_held`]).
    pub(super) fn switch_in_pool(
        &mut self,
        conversation: &ConversationId,
        policy: &PrecisionPolicy,
    ) -> Result<SwitchEvent, JobError> {
        self.with_pool(|pool, host, _| Ok(pool.switch_held(host, conversation, policy)?))
    }

    pub(super) fn cache_path(
        &self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<PathBuf, JobError> {
        match path {
            Some(p) => Ok(p),
            None => {
                let (_, spill) = self.settings();
                spill.map(|d| d.path(conversation)).ok_or_else(|| {
                    JobError::new(
                        ErrorCode::InvalidRequest,
                        "no folder for cache files is set",
                    )
                })
            }
        }
    }

    pub(super) fn save_cache(
        &mut self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        let started = Instant::now();
        let own_file = path.is_none();
        let path = self.cache_path(conversation, path)?;
        let identity = self.identity()?;
        let session = self.pool.session(conversation).ok_or_else(|| {
            JobError::new(
                ErrorCode::InvalidRequest,
                format!("conversation {conversation} holds no cache in memory"),
            )
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                JobError::from(crate::error::EngineError::CacheIo {
                    path: dir.to_path_buf(),
                    source: e,
                })
            })?;
        }
        let bytes = if own_file {
            let (_, spill) = self.settings();
            match spill {
                Some(spill) => spill.save(conversation, session, &identity)?,
                None => session.save_cache(&path, &identity)?,
            }
        } else {
            session.save_cache(&path, &identity)?
        };
        let info = CacheFileInfo {
            path: path.clone(),
            bytes,
            tokens: session.len(),
            token_ids: session.history().to_vec(),
            pending: session.pending().to_vec(),
            spec: session.policy().spec_string(),
            secs: started.elapsed().as_secs_f64(),
            dropped: Vec::new(),
        };
        let mut info = info;
        if own_file {
            self.pool.saved(conversation, bytes, info.tokens);
            let (settings, spill) = self.settings();
            if let Some(spill) = spill {
                info.dropped = self.pool.enforce_disk_budget(&settings, &spill);
            }
        }
        Ok(info)
    }

    pub(super) fn restore_cache(
        &mut self,
        conversation: &ConversationId,
        path: Option<PathBuf>,
    ) -> Result<CacheFileInfo, JobError> {
        if self.pool.is_busy(conversation) {
            return Err(JobError::busy("restore a cache into a conversation"));
        }
        let started = Instant::now();
        let path = self.cache_path(conversation, path)?;
        let identity = self.identity()?;
        let header = crate::kv::persist::peek(&path)?;
        let policy = crate::kv::parse_policy(&header.spec)
            .map_err(|e| JobError::new(ErrorCode::CacheCorrupt, e.to_string()))?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let needed = estimate_kv_bytes(
            &loaded.config,
            &policy,
            header.seq_len,
            self.rewind_margin(),
        )?;
        self.admit(
            Need {
                owner: Some(conversation.clone()),
                extra: needed.saturating_sub(self.pool.bytes_of(conversation)),
                what: format!("restore {} tokens of {conversation}", header.seq_len),
            },
            Purpose::Other,
        )?;
        let loaded = self.loaded.as_ref().ok_or_else(JobError::no_model)?;
        let mut session = Session::new(&loaded.model, &policy)?;
        session.set_rewind_margin(self.rewind_margin());
        match session.restore_cache_as_saved(&loaded.model, &path, &identity) {
            Ok(header) => {
                let secs = started.elapsed().as_secs_f64();
                let report = session.memory();
                let marker = SwitchEvent::between(
                    (&policy, &empty_report()),
                    (session.policy(), &report),
                    header.seq_len,
                    (0, 0),
                    secs * 1e3,
                );
                let marker = SwitchEvent {
                    from: "disk".into(),
                    ..marker.of(MarkerKind::Restore, conversation)
                };
                self.pool.put(conversation, session);
                self.mark(vec![marker]);
                Ok(CacheFileInfo {
                    bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                    path,
                    tokens: header.seq_len,
                    token_ids: header.tokens,
                    pending: header.pending,
                    spec: header.spec,
                    secs,
                    dropped: Vec::new(),
                })
            }
            Err(e) => {
                let mut err = JobError::from(e);
                if err.code == ErrorCode::CacheCorrupt {
                    // Set aside, never deleted: the user may want to look at it.
                    if let Some(aside) = set_aside(&path) {
                        err.message
                            .push_str(&format!(" (set aside as {})", aside.display()));
                    }
                }
                Err(err)
            }
        }
    }
}

pub(super) fn empty_report() -> KvMemoryReport {
    KvMemoryReport {
        layers: Vec::new(),
        sliding: (0, 0),
        full: (0, 0),
        total: (0, 0),
        calibrating: false,
    }
}

/// Moves a corrupt file to `<name>.corrupt` beside it; returns where.
pub(super) fn set_aside(path: &Path) -> Option<PathBuf> {
    let mut aside = path.as_os_str().to_os_string();
    aside.push(".corrupt");
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside).ok().map(|_| aside)
}
