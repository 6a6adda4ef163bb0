//! Conversations as the engine's callers name and see them: an id per conversation (the
//! app's session id, an API client's name), where its cache is (its tier) and what it holds,
//! and the markers the memory timeline draws when a cache changes precision or tier.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// Longest conversation id, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// A conversation's name: 1 to [`MAX_ID_BYTES`] ASCII letters, digits and `-_.:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, TS)]
#[ts(type = "string")]
pub struct ConversationId(String);

impl Serialize for ConversationId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ConversationId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

/// A string that cannot name a conversation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a conversation id is 1 to {MAX_ID_BYTES} letters, digits and `-_.:`")]
pub struct BadConversationId;

impl ConversationId {
    /// `id`, if it is a valid name.
    pub fn new(id: impl Into<String>) -> Result<Self, BadConversationId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= MAX_ID_BYTES
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if ok {
            Ok(Self(id))
        } else {
            Err(BadConversationId)
        }
    }

    /// The conversation a caller that names none runs in (`kvlab chat`, tests).
    pub fn default_id() -> Self {
        Self("default".into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ConversationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which conversation a request runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum ConversationChoice {
    /// This one (created when new).
    Id {
        /// Its name.
        id: ConversationId,
    },
    /// The conversation, among those whose id starts with `prefix`, that this request's
    /// prompt continues (its held history, but for a short tail, is a prefix of the prompt),
    /// else a new one named `prefix` and a number: how a server client that names no
    /// conversation gets its own back, as llama-server picks a slot.
    Continuing {
        /// The namespace (`api:`).
        prefix: String,
    },
}

/// Where a conversation's cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// In memory, in the precision its owner chose.
    Held,
    /// In memory, re-encoded by the pool in its demotion preset to make room.
    Demoted,
    /// Written to a cache file and freed from memory; its next turn restores it.
    OnDisk,
    /// Gone: its next turn reads its history again.
    Dropped,
}

/// Where a turn's cache came from (what it did not have to read again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum CacheOrigin {
    /// A conversation's first turn.
    #[default]
    New,
    /// Held in memory as its owner left it.
    Held,
    /// Held in memory, demoted by the pool.
    Demoted,
    /// Read back from its cache file.
    Restored,
    /// Its cache had been dropped: the history was read again.
    Dropped,
    /// Its cache held rows coded lossily and the turn wants exact ones: the history was
    /// read again.
    Reread,
}

impl CacheOrigin {
    /// Whether the turn had to read its history again (nothing usable was kept).
    pub fn prefilled(self) -> bool {
        matches!(self, CacheOrigin::Dropped | CacheOrigin::Reread)
    }
}

/// One conversation as the engine holds it (no text: ids, tiers, bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct ConversationInfo {
    /// Its name.
    pub id: ConversationId,
    /// Where its cache is.
    pub tier: Tier,
    /// Tokens its cache holds (or held, on disk).
    pub tokens: usize,
    /// Its cache's policy, as its canonical SPEC.
    pub spec: String,
    /// KV bytes it holds in memory.
    pub bytes: u64,
    /// KV bytes its cache has allocated in memory (what the pool's budget counts: rows held
    /// and a bounded spare).
    #[serde(default)]
    pub allocated: u64,
    /// Its TurboQuant layers still hold their first tokens as f16, waiting for the model's
    /// calibration rows (`ModelCard::calibration_rows`) before they code them.
    #[serde(default)]
    pub calibrating: bool,
    /// Bytes of its cache file (0 when none).
    pub disk_bytes: u64,
    /// A request is running in it (it is never demoted or spilled then).
    pub busy: bool,
    /// When it last ran, in milliseconds since the Unix epoch.
    pub last_used_ms: u64,
    /// Each layer's format, tokens and bytes, for a cache held in memory whose layers have
    /// formats of their own (a per-layer SPEC, a fitted cache); empty otherwise, where the
    /// SPEC says it all.
    #[serde(default)]
    pub layers: Vec<crate::memory::LayerBytes>,
    /// Tokens of it that are images' soft tokens (in memory; 0 on disk or without images).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[ts(optional, as = "Option<usize>")]
    pub image_tokens: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What a timeline marker records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum MarkerKind {
    /// Its owner changed the cache's precision.
    #[default]
    Switch,
    /// The pool re-encoded an idle conversation in its demotion preset.
    Demote,
    /// The pool wrote an idle conversation's cache to disk and freed its memory.
    Spill,
    /// A cache came back from disk.
    Restore,
    /// The pool dropped a cache (its next turn reads the history again).
    Drop,
    /// A cache of lossy rows was emptied to be read again exactly.
    Reread,
}

/// A conversation's cache file, as the engine's store of them lists it (its header read,
/// not its sections).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct SavedCache {
    /// The file's size.
    #[ts(type = "number")]
    pub bytes: u64,
    /// Tokens it holds.
    pub tokens: usize,
    /// Its precision, as a cache SPEC.
    pub spec: String,
    /// When it was written (ms since the Unix epoch; 0 when the file system does not say).
    #[ts(type = "number")]
    pub saved_ms: u64,
}
