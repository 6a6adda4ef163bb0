//! One conversation's state on a loaded model: the KV cache plus the exact token ids it holds,
//! so a new prompt only prefills what the cache does not already have (longest common
//! prefix; rewind when possible, otherwise reset and start over). It also remembers whether
//! its rows were ever held as codes since it was last empty: such rows, decoded back into a
//! dense cache, are never handed to a turn as exact ones (that turn reads its history again).

use crate::error::Result;
use crate::images::PromptImage;
use crate::kv::{ConvertPlan, KvCache, KvMemoryReport, PrecisionPolicy};
use crate::memory::{switch_precision, RssProbe, SwitchEvent};
use crate::models::common::Model;

/// Tokens sliding layers keep beyond their window, so regenerating an answer of up to this
/// many tokens, or a turn whose re-rendered history differs near the end (re-tokenized
/// answer, trimmed whitespace), rewinds the cache instead of prefilling the conversation
/// again. The one margin every front end gets (the estimate counts it too); it costs this
/// many tokens per sliding layer.
pub const REWIND_MARGIN: usize = 256;

/// A KV cache and the ids in it.
#[derive(Debug)]
pub struct Session {
    cache: KvCache,
    /// Ids at positions `0..cache.seq_len()`, in order.
    history: Vec<u32>,
    /// Ids sampled after `history` but not yet run (a generation's last token): a saved
    /// cache keeps them, so a continuation runs them first.
    pending: Vec<u32>,
    policy: PrecisionPolicy,
    /// Some row was held as codes (a TurboQuant policy) since the cache was last empty.
    coded: bool,
    /// The images of the prompt being read, in order: those that end within `history` are
    /// held (see [`crate::images`]).
    images: Vec<PromptImage>,
}

/// What [`Session::prepare`] did to line the cache up with a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    /// Prompt tokens already in the cache.
    pub reused: usize,
    /// Whether the cache had to be cleared (rewind impossible, or rows decoded from codes).
    pub reset: bool,
    /// Whether it was cleared because its rows had been held as codes and its policy is now
    /// dense: the history is read again rather than reused from decoded rows.
    pub reread_coded: bool,
}

impl Session {
    /// An empty session for `model` with KV storage as `policy` says.
    pub fn new(model: &Model, policy: &PrecisionPolicy) -> Result<Self> {
        let mut cache = model.new_cache(policy)?;
        cache.set_rewind_margin(REWIND_MARGIN);
        Ok(Self {
            cache,
            history: Vec::new(),
            pending: Vec::new(),
            policy: policy.clone(),
            coded: false,
            images: Vec::new(),
        })
    }

    /// Whether some row was held as codes since the cache was last empty.
    pub fn coded(&self) -> bool {
        self.coded
    }

    /// Lets sliding layers keep `margin` tokens beyond their window, so a turn can be
    /// rewound that far (e.g. regenerating an answer of up to `margin` tokens) instead of
    /// prefilling the conversation again. Costs `margin` tokens per sliding layer.
    pub fn set_rewind_margin(&mut self, margin: usize) {
        self.cache.set_rewind_margin(margin);
    }

    /// The ids the cache holds.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Tokens in the cache.
    pub fn len(&self) -> usize {
        self.history.len()
    }

    /// True when the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// The cache (read-only; mutate through the session so history stays in step).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The precision policy the cache is stored in.
    pub fn policy(&self) -> &PrecisionPolicy {
        &self.policy
    }

    /// Exact KV bytes.
    pub fn memory(&self) -> KvMemoryReport {
        self.cache.memory()
    }

    /// The images the cache holds, in order.
    pub fn images(&self) -> &[PromptImage] {
        let held = self.history.len();
        let n = self
            .images
            .iter()
            .take_while(|i| i.at + i.len <= held)
            .count();
        &self.images[..n]
    }

    /// Forgets everything.
    pub fn reset(&mut self) -> Result<()> {
        self.images.clear();
        self.history.clear();
        self.pending.clear();
        self.coded = false;
        self.cache.reset()
    }

    /// Ids sampled after the history but not run yet ([`Session::set_pending`]).
    pub fn pending(&self) -> &[u32] {
        &self.pending
    }

    /// Records the ids a generation sampled after the last one it ran.
    pub fn set_pending(&mut self, ids: &[u32]) {
        self.pending = ids.to_vec();
    }

    /// Saves the cache to `path` in the precision it holds, for the model whose weights'
    /// identity is `model` ([`crate::kv::persist::weights_identity`]); returns its bytes.
    pub fn save_cache(&self, path: &std::path::Path, model: &str) -> Result<u64> {
        self.cache.save_to(
            path,
            model,
            &self.policy.spec_string(),
            (&self.history, self.images()),
            &self.pending,
        )
    }

    /// Replaces the cache with the one saved at `path`, after every check
    /// ([`crate::kv::persist::read_into`]), which must hold this session's policy; on any
    /// error the session is as it was. Returns the file's header (its tokens, and any ids
    /// pending after them).
    pub fn restore_cache(
        &mut self,
        model: &Model,
        path: &std::path::Path,
        identity: &str,
    ) -> Result<crate::kv::persist::CacheHeader> {
        self.restore_as(model, path, identity, self.policy.clone())
    }

    /// [`Session::restore_cache`] in the precision the file was saved in (the session's
    /// policy becomes the file's): what a saved conversation reopens with.
    pub fn restore_cache_as_saved(
        &mut self,
        model: &Model,
        path: &std::path::Path,
        identity: &str,
    ) -> Result<crate::kv::persist::CacheHeader> {
        let spec = crate::kv::persist::peek(path)?.spec;
        let policy = crate::kv::parse_policy(&spec)
            .map_err(|e| crate::kv::wire::corrupt(format!("the cache's SPEC `{spec}`: {e}")))?;
        if policy.spec_string() != spec {
            return Err(crate::kv::wire::corrupt(format!(
                "the cache's SPEC `{spec}` is not canonical"
            )));
        }
        self.restore_as(model, path, identity, policy)
    }

    /// Reads the file at `path` into a fresh cache of `policy` and, only if every check
    /// passes, makes it this session's.
    fn restore_as(
        &mut self,
        model: &Model,
        path: &std::path::Path,
        identity: &str,
        policy: PrecisionPolicy,
    ) -> Result<crate::kv::persist::CacheHeader> {
        let fresh = model.new_cache(&policy)?;
        let (cache, header) =
            crate::kv::persist::read_into(path, identity, &policy.spec_string(), fresh)?;
        self.cache = cache;
        self.coded = !policy.is_dense() && !header.tokens.is_empty();
        self.policy = policy;
        self.history = header.tokens.clone();
        self.pending = header.pending.clone();
        self.images = header.images.clone();
        Ok(header)
    }

    /// Makes the cache hold a prefix of `prompt` (with `images` in its places) and returns
    /// how much of it is reused: never an image the cache did not hold in the same places,
    /// never part of one. At least one prompt token is always left to run, so the caller
    /// gets fresh logits.
    pub fn prepare(&mut self, prompt: &[u32], images: &[PromptImage]) -> Result<Prepared> {
        self.pending.clear();
        if self.coded && self.policy.is_dense() {
            // Decoded rows are not the rows a dense cache would hold: read them again.
            self.reset()?;
            return Ok(Prepared {
                reused: 0,
                reset: true,
                reread_coded: true,
            });
        }
        let common = crate::images::common_prefix((&self.history, self.images()), (prompt, images));
        // Keep one token to run: its logits start the generation.
        let target = crate::images::cut_outside(common.min(prompt.len().saturating_sub(1)), images);
        let result = self.line_up(target);
        self.images = images.to_vec();
        result
    }

    /// Rewinds the cache to `target` tokens, or empties it when it cannot.
    fn line_up(&mut self, target: usize) -> Result<Prepared> {
        if target == self.history.len() {
            return Ok(Prepared {
                reused: target,
                reset: false,
                reread_coded: false,
            });
        }
        if self.cache.can_rewind(target) {
            self.cache.rewind(target)?;
            self.history.truncate(target);
            return Ok(Prepared {
                reused: target,
                reset: false,
                reread_coded: false,
            });
        }
        self.reset()?;
        Ok(Prepared {
            reused: 0,
            reset: true,
            reread_coded: false,
        })
    }

    /// Runs `ids` through `model`, extending the cache and the history together.
    pub fn forward(
        &mut self,
        model: &Model,
        ids: &[u32],
        which: crate::models::common::Logits,
    ) -> Result<candle_core::Tensor> {
        let out = model.forward(ids, &mut self.cache, which)?;
        self.ran(ids);
        Ok(out)
    }

    /// The cache, for a batched step that runs `ids` in it ([`Model::forward_batch`]); the
    /// caller records them with [`Session::ran`] once they ran.
    pub(crate) fn cache_for_step(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    /// Records that `ids` ran in the cache (a batched step's part of [`Session::forward`]).
    pub(crate) fn ran(&mut self, ids: &[u32]) {
        self.history.extend_from_slice(ids);
        self.pending.clear();
        self.coded |= !self.policy.is_dense();
    }

    /// What switching the cache to `policy` would do and weigh ([`KvCache::plan`]).
    pub fn plan_switch(&self, policy: &PrecisionPolicy) -> Result<ConvertPlan> {
        self.cache.plan(policy)
    }

    /// Applies a planned switch and returns its timeline marker. All or nothing: on error the
    /// cache, its history and its policy are exactly as before ([`KvCache::apply`]).
    pub fn switch(&mut self, plan: &ConvertPlan, probe: &mut RssProbe) -> Result<SwitchEvent> {
        let marker = switch_precision(&mut self.cache, &self.policy, plan, probe)?;
        self.policy = plan.policy.clone();
        self.coded |= !self.policy.is_dense() && !self.history.is_empty();
        Ok(marker)
    }
}
