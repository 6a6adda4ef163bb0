//! Many conversations, one memory: the caches a loaded model holds, one per conversation,
//! under one KV budget. Each conversation is in a tier ([`Tier`]): held in the precision its
//! owner chose, demoted to the pool's TurboQuant preset, on disk as a cache file, or dropped.
//! When a request needs memory the pool plans first ([`Pool::plan`], the one admission:
//! turns, switches, restores and comparisons all ask it), taking from the least recently used
//! idle conversations in this order: demote, then spill, then drop; then it applies the plan
//! ([`Pool::apply`]). A conversation that is running a request is never touched. Everything
//! here runs on the engine thread.

mod files;
mod open;

pub(crate) use open::{Host, Purpose, TurnAsk};

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::contract::{CacheOrigin, ConversationId, ConversationInfo, MarkerKind, Tier};
use crate::error::{EngineError, Result};
use crate::generate::session::Session;
use crate::kv::PrecisionPolicy;
use crate::memory::{unix_ms, ByteCount, KvBytes, RssProbe, SwitchEvent};
use crate::models::common::Model;

pub(crate) use files::{modified_ms, SpillDir};

/// Most conversations the pool keeps track of; past it the least recently used idle one is
/// forgotten (its file too).
pub(crate) const MAX_CONVERSATIONS: usize = 512;

/// What the pool is set to (the front end's settings).
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// KV bytes all conversations may hold in memory together (`None`: what the machine
    /// has available beside the weights, less the margin).
    pub kv_budget: Option<u64>,
    /// Bytes the pool's cache files may take on disk together.
    pub disk_budget: u64,
    /// Where spilled caches go (`None`: never spilled, dropped instead).
    pub spill_dir: Option<PathBuf>,
    /// What an idle conversation is demoted to.
    pub demote_to: PrecisionPolicy,
    /// Keep places for the local user that namespaced (server) clients never take: the
    /// app's own chats beside its Local API ([`crate::worker::USER_QUEUED`] waiting places
    /// and one running place).
    pub reserve_for_user: bool,
    /// How long a conversation may stay idle in memory before it is spilled (dropped without
    /// a spill directory): it comes back from its file on its next turn. `None`: never.
    pub idle_ttl: Option<std::time::Duration>,
    /// Requests that run at once, each in its own conversation (`kvlab serve --parallel`;
    /// 1 to [`crate::worker::MAX_PARALLEL`]): each running conversation's growth is admitted
    /// against the budget when it starts.
    pub parallel: usize,
}

/// How long a conversation stays idle in memory unless set (`kvlab serve --idle-ttl`).
pub const DEFAULT_IDLE_TTL: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The disk budget unless set: the app's default for saved caches.
pub const DEFAULT_DISK_BUDGET: u64 = 2 << 30;

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            kv_budget: None,
            disk_budget: DEFAULT_DISK_BUDGET,
            spill_dir: None,
            demote_to: crate::kv::suggested_policy(),
            reserve_for_user: false,
            idle_ttl: Some(DEFAULT_IDLE_TTL),
            parallel: crate::worker::MAX_RUNNING,
        }
    }
}

/// Where a conversation's cache is now.
#[derive(Debug)]
enum Place {
    /// In memory (`demoted`: re-encoded by the pool, not by its owner).
    Memory {
        session: Box<Session>,
        demoted: bool,
    },
    /// In its cache file only.
    Disk,
    /// Nowhere.
    Dropped,
}

/// One conversation.
#[derive(Debug)]
struct Conversation {
    place: Place,
    /// The policy it holds or will hold (its owner's choice, or the demotion preset).
    policy: PrecisionPolicy,
    /// Its owner's choice: a cache read back from disk in another policy (it was demoted
    /// before it was spilled) is still demoted.
    chosen: PrecisionPolicy,
    /// Its cache file, if one was written: bytes and tokens as written.
    file: Option<(u64, usize)>,
    /// Tokens it held last (for a dropped or spilled one).
    tokens: usize,
    /// A request is running in it.
    busy: bool,
    /// Bytes it was admitted to grow to while it runs (its room is kept for it).
    reserved: u64,
    /// Its last demotion made room for another client's request (not its own client's):
    /// undone on its next turn when there is room.
    demoted_by_other: bool,
    /// Made by [`Pool::unnamed`] for a request that named none: the only kind an unnamed
    /// request's prompt may continue ([`Pool::continuing`]).
    unnamed: bool,
    /// Use order (higher: more recent) and wall time.
    used: u64,
    used_ms: u64,
}

/// A request's memory: bytes it will hold beyond what its conversation holds now.
#[derive(Debug, Clone)]
pub(crate) struct Need {
    /// The conversation that grows (never taken from), if any.
    pub owner: Option<ConversationId>,
    /// Bytes more than it holds now.
    pub extra: u64,
    /// What the memory is for ("grow conversation s-1 to 4,096 tokens").
    pub what: String,
}

/// Why a need cannot be met: even with every idle conversation spilled or dropped, the
/// requester may add only `room` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// Bytes the requester could add at most.
    pub room: u64,
    /// KV bytes held in memory now, by `conversations` conversations.
    pub held: u64,
    pub conversations: usize,
    /// The KV limit.
    pub limit: u64,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Demote(ConversationId),
    Spill(ConversationId),
    Drop(ConversationId),
}

/// The bytes a session counts against the budget: what its layers have allocated (rows they
/// hold and a bounded spare, [`crate::kv::KvPrecision::room_tokens`]), never less than what
/// they hold.
fn allocated(session: &Session) -> u64 {
    let (used, allocated) = session.memory().total;
    used.max(allocated) as u64
}

/// What the idle conversations add up to: kept between steps, since a step changes only the
/// running ones (recomputed when the pool changes, never per step).
#[derive(Debug, Default)]
struct IdleTotals {
    /// Bytes allocated by idle conversations in memory.
    allocated: u64,
    /// Their bytes by layer kind and precision, and their tokens.
    kv: KvBytes,
    tokens: usize,
}

/// The conversations of the loaded model (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    conversations: BTreeMap<ConversationId, Conversation>,
    clock: u64,
    /// The model's identity in cache files (a digest of its weights), once known.
    identity: Option<String>,
    /// Changes with every change of the pool but a running conversation's step.
    revision: u64,
    /// The idle conversations' totals at a revision.
    idle: RefCell<Option<(u64, IdleTotals)>>,
}

impl Pool {
    /// Something other than a running conversation's step changed.
    fn touch(&mut self) {
        self.revision += 1;
    }

    /// Changes with every change of the pool but a running conversation's step: what was
    /// read of the idle conversations at one revision holds until the next.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// `f` of the idle conversations' totals, computed once per revision.
    fn with_idle<R>(&self, f: impl FnOnce(&IdleTotals) -> R) -> R {
        if let Some((rev, totals)) = self.idle.borrow().as_ref() {
            if *rev == self.revision {
                return f(totals);
            }
        }
        let mut t = IdleTotals::default();
        for c in self.conversations.values().filter(|c| !c.busy) {
            if let Place::Memory { session, .. } = &c.place {
                t.allocated += allocated(session);
                t.kv.merge(&KvBytes::from_report(&session.memory()));
                t.tokens += session.len();
            }
        }
        let r = f(&t);
        *self.idle.borrow_mut() = Some((self.revision, t));
        r
    }

    /// The running conversations in memory (at most a few).
    fn running(&self) -> impl Iterator<Item = (&Conversation, &Session)> {
        self.conversations
            .values()
            .filter(|c| c.busy)
            .filter_map(|c| match &c.place {
                Place::Memory { session, .. } => Some((c, session.as_ref())),
                _ => None,
            })
    }

    /// Every conversation's KV bytes by layer kind and precision, and their tokens.
    pub fn kv_totals(&self) -> (KvBytes, usize) {
        let (mut kv, mut tokens) = self.with_idle(|t| (t.kv.clone(), t.tokens));
        for (_, session) in self.running() {
            kv.merge(&KvBytes::from_report(&session.memory()));
            tokens += session.len();
        }
        (kv, tokens)
    }

    /// Every conversation, as front ends see them.
    pub fn infos(&self) -> Vec<ConversationInfo> {
        self.conversations
            .iter()
            .map(|(id, c)| {
                let (tier, bytes, tokens, calibrating) = match &c.place {
                    Place::Memory { session, demoted } => (
                        if *demoted { Tier::Demoted } else { Tier::Held },
                        session.memory().total.0 as u64,
                        session.len(),
                        session.cache().calibrating(),
                    ),
                    Place::Disk => (Tier::OnDisk, 0, c.tokens, false),
                    Place::Dropped => (Tier::Dropped, 0, c.tokens, false),
                };
                let allocated = self.bytes_of_conversation(c);
                let image_tokens = match &c.place {
                    Place::Memory { session, .. } => session.images().iter().map(|i| i.len).sum(),
                    _ => 0,
                };
                // Per layer only where the SPEC has layers of its own to show.
                let layers = match &c.place {
                    Place::Memory { session, .. } if !c.policy.overrides.is_empty() => {
                        crate::memory::KvBytes::from_report(&session.memory()).layers
                    }
                    _ => Vec::new(),
                };
                ConversationInfo {
                    id: id.clone(),
                    tier,
                    tokens,
                    spec: c.policy.spec_string(),
                    bytes,
                    allocated,
                    calibrating,
                    disk_bytes: c.file.map_or(0, |(b, _)| b),
                    busy: c.busy,
                    last_used_ms: c.used_ms,
                    layers,
                    image_tokens,
                }
            })
            .collect()
    }

    /// KV bytes all conversations have allocated in memory.
    pub fn held_bytes(&self) -> u64 {
        self.with_idle(|t| t.allocated) + self.running().map(|(_, s)| allocated(s)).sum::<u64>()
    }

    /// KV bytes counted against the budget: what each conversation has allocated, or, while
    /// it runs, the room it was admitted to grow to.
    pub fn committed_bytes(&self) -> u64 {
        self.with_idle(|t| t.allocated)
            + self
                .running()
                .map(|(c, s)| allocated(s).max(c.reserved))
                .sum::<u64>()
    }

    /// Keeps `bytes` (what `id` may grow to in its running turn) for it until it ends.
    pub fn reserve(&mut self, id: &ConversationId, bytes: u64) {
        if let Some(c) = self.conversations.get_mut(id) {
            c.reserved = bytes;
        }
    }

    fn bytes_of_conversation(&self, c: &Conversation) -> u64 {
        match &c.place {
            Place::Memory { session, .. } => allocated(session),
            _ => 0,
        }
    }

    /// KV bytes `id` has allocated in memory (0 when it is not there).
    pub fn bytes_of(&self, id: &ConversationId) -> u64 {
        self.conversations
            .get(id)
            .map_or(0, |c| self.bytes_of_conversation(c))
    }

    /// Whether the pool knows `id`.
    pub fn contains(&self, id: &ConversationId) -> bool {
        self.conversations.contains_key(id)
    }

    /// The session of `id`, when it is in memory.
    pub fn session(&self, id: &ConversationId) -> Option<&Session> {
        match self.conversations.get(id).map(|c| &c.place) {
            Some(Place::Memory { session, .. }) => Some(session),
            _ => None,
        }
    }

    /// The session of `id`, when it is in memory, to switch or start it.
    pub fn session_mut(&mut self, id: &ConversationId) -> Option<&mut Session> {
        self.touch();
        match self.conversations.get_mut(id).map(|c| &mut c.place) {
            Some(Place::Memory { session, .. }) => Some(session),
            _ => None,
        }
    }

    /// The session of `id` while it runs a request, to step it (a step changes no idle
    /// conversation: the pool's revision stays).
    pub fn running_session_mut(&mut self, id: &ConversationId) -> Option<&mut Session> {
        match self.conversations.get_mut(id) {
            Some(Conversation {
                place: Place::Memory { session, .. },
                busy: true,
                ..
            }) => Some(session),
            _ => None,
        }
    }

    /// The sessions of `ids` while they run requests, in `ids`' order (`None` for one that
    /// does not run), to step them together in one batch.
    pub fn running_sessions_mut(&mut self, ids: &[&ConversationId]) -> Vec<Option<&mut Session>> {
        let mut found: Vec<Option<&mut Session>> = ids.iter().map(|_| None).collect();
        let mut wanted: Vec<(usize, &ConversationId)> = ids.iter().copied().enumerate().collect();
        wanted.sort_by(|a, b| a.1.cmp(b.1));
        // One walk over the map in key order beside the wanted ids in key order: the map
        // lends each session once, so several can be borrowed together.
        let mut next = wanted.iter().peekable();
        for (id, c) in self.conversations.iter_mut() {
            while next.peek().is_some_and(|(_, w)| *w < id) {
                next.next();
            }
            let Some((slot, _)) = next.peek().filter(|(_, w)| *w == id).copied() else {
                continue;
            };
            next.next();
            if let Conversation {
                place: Place::Memory { session, .. },
                busy: true,
                ..
            } = c
            {
                found[*slot] = Some(session);
            }
            if next.peek().is_none() {
                break;
            }
        }
        found
    }

    /// The policy `id` holds or will hold.
    pub fn policy(&self, id: &ConversationId) -> Option<&PrecisionPolicy> {
        self.conversations.get(id).map(|c| &c.policy)
    }

    /// Whether a request runs in `id`.
    pub fn is_busy(&self, id: &ConversationId) -> bool {
        self.conversations.get(id).is_some_and(|c| c.busy)
    }

    /// Marks `id` as running a request (or not), and as just used.
    pub fn set_busy(&mut self, id: &ConversationId, busy: bool) {
        self.touch();
        self.clock += 1;
        let clock = self.clock;
        if let Some(c) = self.conversations.get_mut(id) {
            c.busy = busy;
            if !busy {
                c.reserved = 0;
            }
            c.used = clock;
            c.used_ms = unix_ms();
        }
    }

    /// The model's identity in cache files.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// Sets the model's identity in cache files.
    pub fn set_identity(&mut self, identity: String) {
        self.identity = Some(identity);
    }

    /// Registers `id` (empty, to hold `policy`) unless the pool knows it; a conversation
    /// with a cache file in `spill` starts on disk.
    pub fn ensure(
        &mut self,
        id: &ConversationId,
        policy: &PrecisionPolicy,
        spill: Option<&SpillDir>,
    ) {
        if self.conversations.contains_key(id) {
            return;
        }
        self.touch();
        self.clock += 1;
        let file = spill.and_then(|d| d.peek(id));
        let chosen = policy.clone();
        let (place, policy, tokens) = match &file {
            Some(f) => (Place::Disk, f.policy.clone(), f.tokens),
            None => (Place::Dropped, policy.clone(), 0),
        };
        self.conversations.insert(
            id.clone(),
            Conversation {
                place,
                policy,
                chosen,
                file: file.map(|f| (f.bytes, f.tokens)),
                tokens,
                busy: false,
                reserved: 0,
                demoted_by_other: false,
                unnamed: false,
                used: self.clock,
                used_ms: unix_ms(),
            },
        );
    }

    /// A new conversation id: `prefix` and 128 random bits (32 hex digits), so no client
    /// can guess another's and no run reuses an earlier run's.
    pub fn unnamed(&mut self, prefix: &str) -> Result<ConversationId> {
        loop {
            let mut bits = [0u8; 16];
            getrandom::fill(&mut bits).map_err(|e| {
                EngineError::invalid(format!("no random source for a conversation id: {e}"))
            })?;
            let hex: String = bits.iter().map(|b| format!("{b:02x}")).collect();
            let id = ConversationId::new(format!("{prefix}{hex}"))
                .map_err(|e| EngineError::invalid(e.to_string()))?;
            if !self.conversations.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    /// The held conversation among those named `prefix…` whose history `prompt` continues:
    /// all of it, but for a short tail a re-rendered answer may change (at most 32 tokens
    /// and an eighth of the history), so a client's next turn finds its own conversation
    /// and no prompt reaches into another's. Only conversations its owner holds in `policy`
    /// (the request's effective cache, never one the pool demoted) are considered: a request
    /// never reads rows coded in a format it did not ask for.
    pub fn continuing(
        &self,
        prefix: &str,
        prompt: &[u32],
        policy: &PrecisionPolicy,
    ) -> Option<ConversationId> {
        self.conversations
            .iter()
            .filter(|(id, c)| {
                id.as_str().starts_with(prefix)
                    && c.unnamed
                    && !c.busy
                    && &c.chosen == policy
                    && c.policy == c.chosen
            })
            .filter_map(|(id, c)| {
                let Place::Memory { session, .. } = &c.place else {
                    return None;
                };
                let history = session.history();
                if history.is_empty() {
                    return None;
                }
                let common = history
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                let tail = (history.len() / 8).min(32);
                (common + tail >= history.len()).then_some((common, id))
            })
            .max_by_key(|(common, _)| *common)
            .map(|(_, id)| id.clone())
    }

    /// Brings `id` into memory for a turn: held or demoted as it is, restored from its file,
    /// or a fresh cache (new, or dropped). Returns where its cache came from. A file that
    /// fails its checks is set aside and the turn starts from a fresh cache (the warning
    /// goes to the log).
    pub fn acquire(
        &mut self,
        id: &ConversationId,
        model: &Model,
        spill: Option<&SpillDir>,
        rewind_margin: usize,
    ) -> Result<(CacheOrigin, Option<SwitchEvent>)> {
        self.touch();
        let identity = self.identity.clone();
        let c = self
            .conversations
            .get_mut(id)
            .ok_or_else(|| EngineError::invalid(format!("no conversation {id}")))?;
        match &c.place {
            Place::Memory { demoted, .. } => {
                return Ok((
                    if *demoted {
                        CacheOrigin::Demoted
                    } else {
                        CacheOrigin::Held
                    },
                    None,
                ))
            }
            Place::Disk => {
                if let (Some(dir), Some(identity)) = (spill, identity.as_deref()) {
                    match dir.restore(id, model, identity, rewind_margin) {
                        Ok((session, secs)) => {
                            let marker = restored_marker(id, &session, secs);
                            c.tokens = session.len();
                            c.policy = session.policy().clone();
                            c.place = Place::Memory {
                                demoted: c.policy != c.chosen,
                                session: Box::new(session),
                            };
                            return Ok((CacheOrigin::Restored, Some(marker)));
                        }
                        Err(e) => {
                            tracing::warn!(conversation = %id, "cache file not restored, reading the conversation again: {e}");
                            c.file = None;
                        }
                    }
                }
            }
            Place::Dropped => {}
        }
        let origin = if c.tokens > 0 || matches!(c.place, Place::Disk) {
            CacheOrigin::Dropped
        } else {
            CacheOrigin::New
        };
        let mut session = Session::new(model, &c.policy)?;
        session.set_rewind_margin(rewind_margin);
        c.place = Place::Memory {
            session: Box::new(session),
            demoted: false,
        };
        Ok((origin, None))
    }

    /// Records that `id`'s owner switched it to `policy` (it is no longer demoted).
    pub fn switched(&mut self, id: &ConversationId, policy: &PrecisionPolicy) {
        self.touch();
        if let Some(c) = self.conversations.get_mut(id) {
            c.policy = policy.clone();
            c.chosen = policy.clone();
            if let Place::Memory { demoted, .. } = &mut c.place {
                *demoted = false;
            }
        }
    }

    /// Sets the policy of `id`, which is not in memory, for its next turn.
    pub fn set_policy(&mut self, id: &ConversationId, policy: &PrecisionPolicy) {
        self.touch();
        if let Some(c) = self.conversations.get_mut(id) {
            c.policy = policy.clone();
            c.chosen = policy.clone();
        }
    }

    /// Puts `session` (read from a file by its owner) in memory as `id`'s cache.
    pub fn put(&mut self, id: &ConversationId, session: Session) {
        self.touch();
        self.clock += 1;
        let used = self.clock;
        let c = self
            .conversations
            .entry(id.clone())
            .or_insert(Conversation {
                place: Place::Dropped,
                policy: session.policy().clone(),
                chosen: session.policy().clone(),
                file: None,
                tokens: 0,
                busy: false,
                reserved: 0,
                demoted_by_other: false,
                unnamed: false,
                used,
                used_ms: unix_ms(),
            });
        c.policy = session.policy().clone();
        c.chosen = session.policy().clone();
        c.tokens = session.len();
        c.used = used;
        c.place = Place::Memory {
            session: Box::new(session),
            demoted: false,
        };
    }

    /// Records that `id`'s cache was written to its file (`bytes`, `tokens`).
    pub fn saved(&mut self, id: &ConversationId, bytes: u64, tokens: usize) {
        self.touch();
        if let Some(c) = self.conversations.get_mut(id) {
            c.file = Some((bytes, tokens));
        }
    }

    /// Marks `id` as made for a request that named none (see [`Pool::continuing`]).
    pub fn mark_unnamed(&mut self, id: &ConversationId) {
        if let Some(c) = self.conversations.get_mut(id) {
            c.unnamed = true;
        }
    }

    /// Forgets `id` that a refused request registered: its cache, never a file.
    pub fn discard(&mut self, id: &ConversationId) {
        self.touch();
        self.conversations.remove(id);
    }

    /// The policy its owner chose, when `id` is in memory re-encoded by the pool to make room
    /// for another client's request.
    pub fn demoted(&self, id: &ConversationId) -> Option<&PrecisionPolicy> {
        let c = self.conversations.get(id)?;
        (c.demoted_by_other && matches!(c.place, Place::Memory { demoted: true, .. }))
            .then_some(&c.chosen)
    }

    /// Gives `id`, demoted in memory, a fresh cache in the policy its owner chose: its next
    /// turn reads its history again there (the pool's demotion is undone).
    pub fn undemote(
        &mut self,
        id: &ConversationId,
        model: &Model,
        rewind_margin: usize,
    ) -> Result<()> {
        self.touch();
        let Some(c) = self.conversations.get_mut(id) else {
            return Ok(());
        };
        let mut session = Session::new(model, &c.chosen)?;
        session.set_rewind_margin(rewind_margin);
        c.policy = c.chosen.clone();
        c.place = Place::Memory {
            session: Box::new(session),
            demoted: false,
        };
        Ok(())
    }

    /// Forgets `id`: its cache and, with `spill`, its file.
    pub fn forget(&mut self, id: &ConversationId, spill: Option<&SpillDir>) {
        self.touch();
        self.conversations.remove(id);
        if let Some(dir) = spill {
            dir.remove(id);
        }
    }

    /// Removes `id`'s file, keeping what it holds in memory: a conversation only on disk is
    /// then dropped (read again on its next turn).
    pub fn drop_file(&mut self, id: &ConversationId, spill: &SpillDir) {
        self.touch();
        spill.remove(id);
        if let Some(c) = self.conversations.get_mut(id) {
            c.file = None;
            if matches!(c.place, Place::Disk) {
                c.place = Place::Dropped;
            }
        }
    }

    /// Empties `id`'s cache, keeping the conversation (its policy, and its file).
    pub fn reset(&mut self, id: &ConversationId) -> Result<()> {
        self.touch();
        if let Some(c) = self.conversations.get_mut(id) {
            match &mut c.place {
                Place::Memory { session, .. } => session.reset()?,
                _ => c.place = Place::Dropped,
            }
            c.tokens = 0;
        }
        Ok(())
    }

    /// Forgets idle conversations past [`MAX_CONVERSATIONS`]: the least recently used of the
    /// client that has the most (see [`crate::worker`]'s places), so one client opening
    /// conversations by the hundred forgets its own, not everyone else's.
    pub fn trim(&mut self, spill: Option<&SpillDir>) {
        while self.conversations.len() > MAX_CONVERSATIONS {
            let mut counts: std::collections::HashMap<&str, usize> = Default::default();
            for id in self.conversations.keys() {
                *counts.entry(crate::worker::client_of_id(id)).or_default() += 1;
            }
            let oldest = self
                .conversations
                .iter()
                .filter(|(_, c)| !c.busy)
                .max_by_key(|(id, c)| {
                    let n = counts
                        .get(crate::worker::client_of_id(id))
                        .copied()
                        .unwrap_or(0);
                    (n, std::cmp::Reverse(c.used))
                })
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => self.forget(&id, spill),
                None => break,
            }
        }
    }

    /// What to take from idle conversations so that `need` fits `limit` KV bytes: demotions
    /// (least recently used first) while they free enough, then spills (a spill directory
    /// set), then drops. The [`Shortfall`] when nothing is left to take.
    pub fn plan(
        &self,
        need: &Need,
        limit: u64,
        settings: &PoolSettings,
    ) -> Result<std::result::Result<Vec<Action>, Shortfall>> {
        // The owner's own reservation is what it asks to replace.
        let owner_reserved = need
            .owner
            .as_ref()
            .and_then(|id| self.conversations.get(id))
            .filter(|c| c.busy)
            .map_or(0, |c| {
                c.reserved.saturating_sub(self.bytes_of_conversation(c))
            });
        let held = self.committed_bytes().saturating_sub(owner_reserved);
        let mut short = held.saturating_add(need.extra).saturating_sub(limit);
        if short == 0 {
            return Ok(Ok(Vec::new()));
        }
        let mut victims: Vec<(&ConversationId, &Conversation, u64)> = self
            .conversations
            .iter()
            .filter(|(id, c)| Some(*id) != need.owner.as_ref() && !c.busy)
            .filter_map(|(id, c)| match &c.place {
                Place::Memory { session, .. } => Some((id, c, allocated(session))),
                _ => None,
            })
            .collect();
        victims.sort_by_key(|(_, c, _)| c.used);
        let mut actions = Vec::new();
        // What each victim still holds once the actions so far are applied.
        let mut left: Vec<u64> = victims.iter().map(|(_, _, b)| *b).collect();
        for (i, (id, c, bytes)) in victims.iter().enumerate() {
            if short == 0 {
                break;
            }
            let Place::Memory { session, demoted } = &c.place else {
                continue;
            };
            if *demoted || c.policy == settings.demote_to || session.is_empty() {
                continue;
            }
            // The switch's own plan: what the demotion will hold, layer by layer (a switch
            // calibrates on the rows it has, where a new cache would hold them as f16).
            let after = session.cache().plan(&settings.demote_to)?.allocated_after();
            if after >= *bytes {
                continue;
            }
            actions.push(Action::Demote((*id).clone()));
            short = short.saturating_sub(bytes - after);
            left[i] = after;
        }
        for (i, (id, c, _)) in victims.iter().enumerate() {
            if short == 0 {
                break;
            }
            let Place::Memory { session, .. } = &c.place else {
                continue;
            };
            actions.push(if settings.spill_dir.is_some() && worth_a_file(session) {
                Action::Spill((*id).clone())
            } else {
                Action::Drop((*id).clone())
            });
            short = short.saturating_sub(left[i]);
        }
        if short > 0 {
            let freeable: u64 = victims.iter().map(|(_, _, b)| b).sum();
            return Ok(Err(Shortfall {
                room: limit.saturating_sub(held - freeable),
                held,
                conversations: self
                    .conversations
                    .values()
                    .filter(|c| matches!(c.place, Place::Memory { .. }))
                    .count(),
                limit,
            }));
        }
        Ok(Ok(actions))
    }

    /// What expires: the conversations in memory idle for longer than `ttl`, spilled (a
    /// spill directory set and a cache worth a file) or dropped.
    pub fn expired(&self, ttl: std::time::Duration, settings: &PoolSettings) -> Vec<Action> {
        let cutoff = unix_ms().saturating_sub(ttl.as_millis() as u64);
        self.conversations
            .iter()
            .filter(|(_, c)| !c.busy && c.used_ms < cutoff)
            .filter_map(|(id, c)| match &c.place {
                Place::Memory { session, .. } => {
                    Some(if settings.spill_dir.is_some() && worth_a_file(session) {
                        Action::Spill(id.clone())
                    } else {
                        Action::Drop(id.clone())
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// Applies `actions` in order (made room for a request of `for_client`, see
    /// [`crate::worker`]'s places) and returns their timeline markers. An action that fails
    /// (a full disk on a spill) drops that conversation's cache instead, so the memory is
    /// freed all the same; the conversation reads its history again on its next turn.
    pub fn apply(
        &mut self,
        actions: &[Action],
        settings: &PoolSettings,
        spill: Option<&SpillDir>,
        probe: &mut RssProbe,
        for_client: &str,
    ) -> Vec<SwitchEvent> {
        self.touch();
        let mut markers = Vec::new();
        for action in actions {
            let id = match action {
                Action::Demote(id) | Action::Spill(id) | Action::Drop(id) => id,
            };
            let identity = self.identity.clone();
            let Some(c) = self.conversations.get_mut(id) else {
                continue;
            };
            let Place::Memory { session, demoted } = &mut c.place else {
                continue;
            };
            match action {
                Action::Demote(_) => {
                    let done = session
                        .plan_switch(&settings.demote_to)
                        .and_then(|plan| session.switch(&plan, probe));
                    match done {
                        Ok(marker) => {
                            *demoted = true;
                            c.demoted_by_other = crate::worker::client_of_id(id) != for_client;
                            c.policy = settings.demote_to.clone();
                            markers.push(marker.of(MarkerKind::Demote, id));
                        }
                        Err(e) => {
                            tracing::warn!(conversation = %id, "demotion failed, dropping the cache: {e}");
                            markers.push(gone_marker(id, session, MarkerKind::Drop));
                            c.tokens = session.len();
                            c.place = Place::Dropped;
                        }
                    }
                }
                Action::Spill(_) => {
                    let written = match (spill, identity.as_deref()) {
                        (Some(dir), Some(identity)) => dir.save(id, session, identity),
                        _ => Err(EngineError::invalid("no spill directory")),
                    };
                    let kind = match written {
                        Ok(bytes) => {
                            c.file = Some((bytes, session.len()));
                            MarkerKind::Spill
                        }
                        Err(e) => {
                            tracing::warn!(conversation = %id, "spill failed, dropping the cache: {e}");
                            MarkerKind::Drop
                        }
                    };
                    markers.push(gone_marker(id, session, kind));
                    c.tokens = session.len();
                    c.place = if kind == MarkerKind::Spill {
                        Place::Disk
                    } else {
                        Place::Dropped
                    };
                }
                Action::Drop(_) => {
                    markers.push(gone_marker(id, session, MarkerKind::Drop));
                    c.tokens = session.len();
                    c.place = Place::Dropped;
                }
            }
        }
        crate::memory::release_free_memory();
        if let Some(dir) = spill {
            self.apply_disk_budget(dir, settings.disk_budget);
        }
        markers
    }

    /// Conversations running a request (their files are never removed to make room).
    fn busy_ids(&self) -> Vec<ConversationId> {
        self.conversations
            .iter()
            .filter(|(_, c)| c.busy)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Applies the disk budget to the spill directory now (after a save by its owner).
    pub fn enforce_disk_budget(
        &mut self,
        settings: &PoolSettings,
        spill: &SpillDir,
    ) -> Vec<ConversationId> {
        self.touch();
        self.apply_disk_budget(spill, settings.disk_budget)
    }

    /// Removes the files of ours past `budget` (never a running conversation's) and
    /// records what that leaves: no file, and a conversation only on disk dropped.
    fn apply_disk_budget(&mut self, spill: &SpillDir, budget: u64) -> Vec<ConversationId> {
        let removed = spill.enforce_budget(budget, &self.busy_ids());
        for id in &removed {
            if let Some(c) = self.conversations.get_mut(id) {
                c.file = None;
                if matches!(c.place, Place::Disk) {
                    c.place = Place::Dropped;
                }
            }
        }
        removed
    }

    /// Writes the conversations in memory to their files (a model change, a quit), each its
    /// own cache, never another's: the most recently used first, and none once what was
    /// written reaches `disk_budget` (those are dropped, read again on their next turn);
    /// then the budget is applied to the directory. With `free`, the written ones leave
    /// memory. Returns what was written, or why not.
    pub fn save_all(
        &mut self,
        spill: &SpillDir,
        free: bool,
        disk_budget: u64,
    ) -> Vec<(ConversationId, Result<u64>)> {
        self.touch();
        let identity = self.identity.clone();
        let mut order: Vec<(u64, ConversationId)> = self
            .conversations
            .iter()
            .filter(
                |(_, c)| matches!(&c.place, Place::Memory { session, .. } if worth_a_file(session)),
            )
            .map(|(id, c)| (c.used, id.clone()))
            .collect();
        order.sort_by_key(|o| std::cmp::Reverse(o.0));
        let mut out = Vec::new();
        let mut written_total = 0u64;
        for (_, id) in order {
            let Some(c) = self.conversations.get_mut(&id) else {
                continue;
            };
            let Place::Memory { session, .. } = &c.place else {
                continue;
            };
            if written_total >= disk_budget {
                tracing::info!(conversation = %id, "not saved: the disk budget is spent");
                continue;
            }
            let written = match identity.as_deref() {
                Some(identity) => spill.save(&id, session, identity),
                None => Err(EngineError::invalid("the model's identity is unknown")),
            };
            if let Ok(bytes) = &written {
                written_total = written_total.saturating_add(*bytes);
                c.file = Some((*bytes, session.len()));
                if free {
                    c.tokens = session.len();
                    c.place = Place::Disk;
                }
            }
            out.push((id, written));
        }
        let removed = self.apply_disk_budget(spill, disk_budget);
        out.retain(|(written, _)| !removed.contains(written));
        out
    }

    /// Forgets every conversation (the model changed: their caches cannot serve another).
    pub fn clear(&mut self) {
        self.touch();
        self.conversations.clear();
        self.identity = None;
    }
}

/// Whether a cache is worth a file: not empty, and not rows decoded from codes (those would
/// be read again anyway).
fn worth_a_file(session: &Session) -> bool {
    !(session.is_empty() || session.coded() && session.policy().is_dense())
}

/// The marker of a cache leaving memory (`kind`: spill or drop).
fn gone_marker(id: &ConversationId, session: &Session, kind: MarkerKind) -> SwitchEvent {
    let r = session.memory();
    SwitchEvent {
        kind,
        conversation: Some(id.clone()),
        t_ms: unix_ms(),
        from: session.policy().spec_string(),
        to: match kind {
            MarkerKind::Spill => "disk".into(),
            _ => "none".into(),
        },
        tokens: session.len(),
        kv_before: ByteCount {
            used: r.total.0 as u64,
            allocated: r.total.1 as u64,
        },
        kv_after: ByteCount::default(),
        rss_before: 0,
        rss_after: 0,
        duration_ms: 0.0,
    }
}

/// The marker of a cache read back from disk.
fn restored_marker(id: &ConversationId, session: &Session, secs: f64) -> SwitchEvent {
    let r = session.memory();
    SwitchEvent {
        kind: MarkerKind::Restore,
        conversation: Some(id.clone()),
        t_ms: unix_ms(),
        from: "disk".into(),
        to: session.policy().spec_string(),
        tokens: session.len(),
        kv_before: ByteCount::default(),
        kv_after: ByteCount {
            used: r.total.0 as u64,
            allocated: r.total.1 as u64,
        },
        rss_before: 0,
        rss_after: 0,
        duration_ms: secs * 1e3,
    }
}
