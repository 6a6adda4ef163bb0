//! The pool's face to the engine loop: [`Pool::admit`] makes room for a need under the KV
//! limit (demoting, spilling or dropping idle conversations as its plan says) or refuses it
//! with `out_of_memory`, naming what would fit; [`Pool::open_turn`] brings a conversation into
//! memory with room for its whole turn, in the cache the request asks for, and starts the
//! turn on its session, leaving nothing behind when it is refused; [`Pool::switch_held`]
//! re-encodes a conversation in memory after admitting its peak. The loop lends what it owns
//! ([`Host`]: the model, the limit, the settings) and keeps the markers these made.

use std::path::Path;

use super::{Need, Pool, PoolSettings, Shortfall, SpillDir};
use crate::budget::{switch_fit, MemoryBudget, Plan};
use crate::contract::{CacheOrigin, ConversationId, MarkerKind};
use crate::error::{EngineError, Result};
use crate::generate::session::Session;
use crate::kv::{ConvertPlan, PrecisionPolicy};
use crate::memory::{format_bytes, RssProbe, SwitchEvent};
use crate::models::common::Model;

/// What the pool borrows from the engine loop for one call.
pub(crate) struct Host<'a> {
    pub model: &'a Model,
    /// The weights' file or folder (cache files name the model by it).
    pub weights: &'a Path,
    /// KV bytes all conversations may hold now.
    pub limit: u64,
    pub settings: &'a PoolSettings,
    pub spill: Option<&'a SpillDir>,
    pub rewind_margin: usize,
    pub probe: &'a mut RssProbe,
    /// The markers the call made (demotions, spills, drops, restores), for the loop to keep
    /// whatever the call's outcome.
    pub markers: Vec<SwitchEvent>,
}

impl Host<'_> {
    /// KV bytes a conversation of `tokens` tokens in `policy` allocates.
    fn allocated(&self, policy: &PrecisionPolicy, tokens: usize) -> Result<u64> {
        crate::memory::estimate_kv_allocated(
            self.model.config(),
            policy,
            tokens,
            self.rewind_margin,
        )
    }
}

/// What the memory of a need is for: what its refusal offers instead.
#[derive(Debug, Clone)]
pub(crate) enum Purpose {
    /// A conversation growing to `context` tokens in `policy`.
    Grow {
        policy: PrecisionPolicy,
        context: usize,
    },
    /// A switch.
    Switch(ConvertPlan),
    /// Anything else.
    Other,
}

/// What a turn asks of its conversation.
pub(crate) struct TurnAsk<'a> {
    /// The cache the request names (`None`: as the conversation holds it).
    pub wanted: Option<&'a PrecisionPolicy>,
    /// What a new conversation holds unless the request names a cache.
    pub default: &'a PrecisionPolicy,
    /// Tokens of context the turn may reach.
    pub grown: usize,
    /// The request continues an unnamed conversation of its client's: one it registers is
    /// marked so, for its next request to find.
    pub unnamed: bool,
}

impl Pool {
    /// The one admission: makes room for `need` under `host.limit`, or refuses it with
    /// `out_of_memory` naming what it needs, what is held, and (for `purpose`) what would fit.
    pub(crate) fn admit(
        &mut self,
        host: &mut Host<'_>,
        need: Need,
        purpose: Purpose,
    ) -> Result<()> {
        if host.settings.spill_dir.is_some() {
            // Spills write cache files, which name the model.
            let _ = self.identity_of(host.weights);
        }
        let actions = match self.plan(&need, host.limit, host.settings)? {
            Ok(actions) => actions,
            Err(short) => return Err(self.refusal(host, &need, purpose, short)),
        };
        if actions.is_empty() {
            return Ok(());
        }
        let for_client = need.owner.as_ref().map_or("", crate::worker::client_of_id);
        let markers = self.apply(&actions, host.settings, host.spill, host.probe, for_client);
        host.markers.extend(markers);
        Ok(())
    }

    /// The model's identity in cache files, read from its weights once.
    pub(crate) fn identity_of(&mut self, weights: &Path) -> Result<String> {
        if let Some(id) = self.identity() {
            return Ok(id.to_owned());
        }
        let id = crate::kv::persist::weights_identity(weights)?;
        self.set_identity(id.clone());
        Ok(id)
    }

    /// The `out_of_memory` of a need the pool cannot meet: the figures, and for a growing
    /// conversation the TurboQuant cache or the shorter context that would fit, for a switch
    /// its peak.
    fn refusal(
        &self,
        host: &Host<'_>,
        need: &Need,
        purpose: Purpose,
        short: Shortfall,
    ) -> EngineError {
        let room = MemoryBudget::fixed(short.room, 0);
        let owner_bytes = need.owner.as_ref().map_or(0, |id| self.bytes_of(id));
        let fit = match &purpose {
            Purpose::Grow { policy, context } => Plan {
                allocated: true,
                config: host.model.config(),
                weights_bytes: 0,
                held_kv_bytes: owner_bytes,
                context: *context,
                policy,
                rewind_margin: host.rewind_margin,
            }
            .fit(&room)
            .ok(),
            Purpose::Switch(plan) => Some(switch_fit(plan, &room)),
            Purpose::Other => None,
        };
        let mut message = match fit {
            Some(fit) => fit.message(&need.what),
            None => format!(
                "not enough memory to {}: it needs {} more KV cache and at most {} can be made",
                need.what,
                format_bytes(need.extra),
                format_bytes(short.room),
            ),
        };
        message.push_str(&format!(
            " ({} conversation(s) hold {} of a KV limit of {}; none left to demote or spill)",
            short.conversations,
            format_bytes(short.held),
            format_bytes(short.limit),
        ));
        EngineError::OutOfMemory(message)
    }

    /// Opens a turn in `id`: the conversation registered (or found on disk), brought back
    /// to its owner's cache when the pool had demoted it and that fits, admitted for the
    /// whole turn (its room then kept for it while it runs), read back into memory, switched
    /// to the cache the request names; then `start` begins the turn on its session, and the
    /// conversation is busy. Refused anywhere, a conversation it registered is gone again.
    pub(crate) fn open_turn<T, E: From<EngineError>>(
        &mut self,
        host: &mut Host<'_>,
        id: &ConversationId,
        ask: TurnAsk<'_>,
        start: impl FnOnce(&mut Session, CacheOrigin) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let registered = !self.contains(id);
        let opened = self
            .open_in(host, id, &ask)
            .map_err(E::from)
            .and_then(|origin| {
                let session = self
                    .session_mut(id)
                    .ok_or_else(|| EngineError::Internal("the conversation left memory".into()))?;
                start(session, origin)
            });
        match &opened {
            Ok(_) => {
                if registered && ask.unnamed {
                    self.mark_unnamed(id);
                }
                self.set_busy(id, true);
            }
            Err(_) if registered && !self.is_busy(id) => self.discard(id),
            Err(_) => {}
        }
        opened
    }

    /// [`Pool::open_turn`] up to its session: where its cache came from.
    fn open_in(
        &mut self,
        host: &mut Host<'_>,
        id: &ConversationId,
        ask: &TurnAsk<'_>,
    ) -> Result<CacheOrigin> {
        let policy = ask.wanted.unwrap_or(ask.default);
        self.ensure(id, policy, host.spill);
        if !self.contains(id) {
            return Err(EngineError::Internal("the conversation is gone".into()));
        }
        // A conversation the pool demoted to make room for others goes back to its owner's
        // cache when that fits (its history read again there: rows decoded from codes would
        // keep the demotion's loss).
        let mut undemoted = false;
        if let (None, Some(chosen)) = (ask.wanted, self.demoted(id).cloned()) {
            let need = host.allocated(&chosen, ask.grown)?;
            let room = self.admit(
                host,
                Need {
                    owner: Some(id.clone()),
                    extra: need.saturating_sub(self.bytes_of(id)),
                    what: "restore the conversation's own cache".into(),
                },
                Purpose::Other,
            );
            if room.is_ok() {
                self.undemote(id, host.model, host.rewind_margin)?;
                undemoted = true;
            }
        }
        // Room for the whole turn, before anything is read back or allocated.
        let held = self.policy(id).cloned().unwrap_or_else(|| policy.clone());
        let run_policy = ask.wanted.cloned().unwrap_or(held);
        let need = host.allocated(&run_policy, ask.grown)?;
        self.admit(
            host,
            Need {
                owner: Some(id.clone()),
                extra: need.saturating_sub(self.bytes_of(id)),
                what: "grow the conversation's context".into(),
            },
            Purpose::Grow {
                policy: run_policy,
                context: ask.grown,
            },
        )?;
        // Its room is kept for it while it runs: others are admitted against it.
        self.reserve(id, need);
        let (origin, restored) = self.acquire(id, host.model, host.spill, host.rewind_margin)?;
        host.markers.extend(restored);
        if let Some(policy) = ask.wanted {
            if self.policy(id) != Some(policy) {
                let marker = self.switch_held(host, id, policy)?;
                host.markers.push(marker);
            }
        }
        Ok(if undemoted {
            CacheOrigin::Reread
        } else {
            origin
        })
    }

    /// Switches `id`, in memory, to `policy`: its conversion's peak admitted first. Returns
    /// the switch's marker (the loop keeps it with [`Host::markers`]' others).
    pub(crate) fn switch_held(
        &mut self,
        host: &mut Host<'_>,
        id: &ConversationId,
        policy: &PrecisionPolicy,
    ) -> Result<SwitchEvent> {
        let plan = self
            .session(id)
            .ok_or_else(|| EngineError::Internal("no cache to switch".into()))?
            .plan_switch(policy)?;
        let spec = plan.policy.spec_string();
        self.admit(
            host,
            Need {
                owner: Some(id.clone()),
                extra: plan.peak_extra_allocated(),
                what: format!("switch the KV cache to {spec}"),
            },
            Purpose::Switch(plan.clone()),
        )?;
        let session = self
            .session_mut(id)
            .ok_or_else(|| EngineError::Internal("no cache to switch".into()))?;
        let marker = session.switch(&plan, host.probe)?;
        self.switched(id, policy);
        Ok(marker.of(MarkerKind::Switch, id))
    }
}
