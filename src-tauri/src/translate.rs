//! Engine events in the UI's wire shapes ([`crate::events`]): a generation's stream (text,
//! then `done` carrying the stats), a comparison's panes and fidelity, and the memory the
//! timeline plots. Pure functions of the engine's values: no threads, no Tauri.

use kvlab_engine::compare;
use kvlab_engine::config::AttentionKind;
use kvlab_engine::events::{DoneReason, Event, GenStats};
use kvlab_engine::memory::KvBytes;
use kvlab_engine::worker::EngineStatus as Snapshot;

use crate::cachespec::policy_label;
use crate::error::CommandError;
use crate::events::{ChatEvent, CompareEvent, EngineMemory, GenerationStats, KvPart, StopReason};

/// How a stream ended: `Ok` after `done`, the command's error after `error`.
pub type End = Option<Result<(), CommandError>>;

/// Turns one generation's engine events into the UI's: text as it comes, `stats` held until
/// `done` (the UI gets them together). The second value, when present, ends the stream.
#[derive(Default)]
pub struct ChatStream {
    stats: Option<GenStats>,
    policy: String,
}

impl ChatStream {
    pub fn translate(
        &mut self,
        ev: Event,
        policy: impl Fn() -> String,
    ) -> Option<(ChatEvent, End)> {
        Some(match ev {
            Event::Token { text } => (ChatEvent::Token { text }, None),
            Event::Thinking { text } => (ChatEvent::Thinking { text }, None),
            Event::Stats(s) => {
                self.stats = Some(s);
                self.policy = policy();
                return None;
            }
            Event::Done { reason, .. } => {
                let stats = self
                    .stats
                    .take()
                    .map(|s| generation_stats(&s, std::mem::take(&mut self.policy)))
                    .unwrap_or_default();
                (
                    ChatEvent::Done {
                        reason: stop_reason(reason),
                        stats,
                    },
                    Some(Ok(())),
                )
            }
            Event::Error { code, message } => (
                ChatEvent::Error {
                    code: code.as_str().into(),
                    message: message.clone(),
                },
                Some(Err(CommandError::new(code.as_str(), message))),
            ),
            Event::Loading { .. } | Event::Loaded { .. } => return None,
        })
    }
}

/// One comparison event as the UI's events, and the end of the stream when it ends.
pub fn translate_compare(
    ev: compare::CompareEvent,
    panes: &mut [ChatStream; 2],
    labels: &[String; 2],
) -> (Vec<CompareEvent>, End) {
    match ev {
        compare::CompareEvent::Pane { pane, event } => {
            let Some(stream) = panes.get_mut(pane) else {
                return (Vec::new(), None);
            };
            let label = labels[pane].clone();
            match stream.translate(event, || label.clone()) {
                // A pane's `done` is not the end: fidelity follows.
                Some((event, _)) => (vec![CompareEvent::Pane { pane, event }], None),
                None => (Vec::new(), None),
            }
        }
        compare::CompareEvent::Finished { fidelity } => {
            let events = fidelity
                .map(|f| CompareEvent::Fidelity {
                    mean_kld: f.mean_kld,
                    max_kld: f.max_kld,
                    top1_agreement: f.top1_agreement,
                    tokens_scored: f.tokens_scored,
                    kv_bytes: f.kv_bytes,
                })
                .into_iter()
                .collect();
            (events, Some(Ok(())))
        }
        compare::CompareEvent::Error { code, message } => {
            let events = (0..2)
                .map(|pane| CompareEvent::Pane {
                    pane,
                    event: ChatEvent::Error {
                        code: code.as_str().into(),
                        message: message.clone(),
                    },
                })
                .collect();
            (events, Some(Err(CommandError::new(code.as_str(), message))))
        }
    }
}

fn stop_reason(r: DoneReason) -> StopReason {
    match r {
        DoneReason::Stop => StopReason::EndOfTurn,
        DoneReason::Length => StopReason::MaxTokens,
        DoneReason::Cancelled => StopReason::Cancelled,
    }
}

/// The numbers under an answer, from the engine's stats.
fn generation_stats(s: &GenStats, cache_policy: String) -> GenerationStats {
    GenerationStats {
        ttft_ms: s.time_to_first_token_s * 1000.0,
        prefill_tokens: s.prefill_tokens,
        reused_tokens: s.reused_tokens,
        prefill_tok_s: s.prefill_tok_per_s,
        decode_tokens: s.generated_tokens,
        decode_tok_s: s.decode_tok_per_s,
        context_tokens: s.context_tokens,
        kv_bytes: s.kv_bytes as u64,
        cache_policy,
    }
}

/// KV bytes by kind and precision, weights and context, from the engine's snapshot.
pub fn engine_memory(s: &Snapshot) -> EngineMemory {
    if s.model.is_none() {
        return EngineMemory::default();
    }
    EngineMemory {
        weights_bytes: s.weights_bytes,
        kv: kv_parts(&s.kv),
        context_tokens: s.context_tokens,
        cache_policy: policy_label(&s.policy),
    }
}

/// The engine's per-layer bytes summed per (kind, precision), in layer order.
fn kv_parts(kv: &KvBytes) -> Vec<KvPart> {
    let mut parts: Vec<KvPart> = Vec::new();
    for layer in &kv.layers {
        let kind = match layer.kind {
            AttentionKind::Full => "full",
            AttentionKind::Sliding => "sliding",
        };
        match parts
            .iter_mut()
            .find(|p| p.kind == kind && p.precision == layer.precision)
        {
            Some(p) => p.bytes += layer.bytes.used,
            None => parts.push(KvPart {
                kind,
                precision: layer.precision.clone(),
                bytes: layer.bytes.used,
            }),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_engine::events::ErrorCode;
    use kvlab_engine::memory::{ByteCount, LayerBytes};

    fn stats() -> GenStats {
        GenStats {
            prompt_tokens: 10,
            reused_tokens: 4,
            prefill_tokens: 6,
            generated_tokens: 3,
            time_to_first_token_s: 0.25,
            prefill_tok_per_s: 12.0,
            decode_tok_per_s: 30.0,
            context_tokens: 12,
            max_context: 256,
            kv_bytes: 1024,
            kv_bytes_allocated: 2048,
        }
    }

    #[test]
    fn a_generation_streams_text_then_done_with_its_stats() {
        let mut s = ChatStream::default();
        let label = || "tq3.5".to_string();
        let (ev, end) = s
            .translate(Event::Token { text: "Pa".into() }, label)
            .unwrap();
        assert_eq!(ev, ChatEvent::Token { text: "Pa".into() });
        assert!(end.is_none());
        assert!(s.translate(Event::Stats(stats()), label).is_none());
        let (ev, end) = s
            .translate(
                Event::Done {
                    reason: DoneReason::Cancelled,
                    token_ids: vec![1, 2, 3],
                },
                || "ignored".to_string(),
            )
            .unwrap();
        assert_eq!(end, Some(Ok(())));
        let ChatEvent::Done { reason, stats } = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(reason, StopReason::Cancelled);
        assert_eq!(
            stats,
            GenerationStats {
                ttft_ms: 250.0,
                prefill_tokens: 6,
                reused_tokens: 4,
                prefill_tok_s: 12.0,
                decode_tokens: 3,
                decode_tok_s: 30.0,
                context_tokens: 12,
                kv_bytes: 1024,
                cache_policy: "tq3.5".into(),
            }
        );
        let (ev, end) = s
            .translate(
                Event::Error {
                    code: ErrorCode::ContextOverflow,
                    message: "too long".into(),
                },
                label,
            )
            .unwrap();
        assert_eq!(
            ev,
            ChatEvent::Error {
                code: "context_overflow".into(),
                message: "too long".into()
            }
        );
        assert_eq!(end.unwrap().unwrap_err().code, "context_overflow");
    }

    #[test]
    fn a_comparison_tags_panes_and_ends_with_fidelity_or_errors_in_both() {
        let mut panes = [ChatStream::default(), ChatStream::default()];
        let labels = ["f16".to_string(), "tq3.5".to_string()];
        let pane = |pane, event| compare::CompareEvent::Pane { pane, event };
        let (evs, end) = translate_compare(pane(1, Event::Stats(stats())), &mut panes, &labels);
        assert!(evs.is_empty() && end.is_none());
        let done = Event::Done {
            reason: DoneReason::Stop,
            token_ids: vec![1],
        };
        let (evs, end) = translate_compare(pane(1, done), &mut panes, &labels);
        assert!(end.is_none(), "a pane's done is not the end");
        let [CompareEvent::Pane {
            pane: 1,
            event: ChatEvent::Done { reason, stats },
        }] = evs.as_slice()
        else {
            panic!("{evs:?}")
        };
        assert_eq!(
            (*reason, stats.cache_policy.as_str()),
            (StopReason::EndOfTurn, "tq3.5")
        );
        let fidelity = compare::CompareFidelity {
            mean_kld: 0.01,
            max_kld: 0.2,
            top1_agreement: 0.9,
            tokens_scored: 30,
            ppl: 5.0,
            ppl_reference: 4.9,
            kv_bytes: [100, 30],
        };
        let (evs, end) = translate_compare(
            compare::CompareEvent::Finished {
                fidelity: Some(fidelity),
            },
            &mut panes,
            &labels,
        );
        assert_eq!(end, Some(Ok(())));
        assert_eq!(
            serde_json::to_value(&evs[0]).unwrap(),
            serde_json::json!({"type": "fidelity", "mean_kld": 0.01, "max_kld": 0.2,
                "top1_agreement": 0.9, "tokens_scored": 30, "kv_bytes": [100, 30]})
        );
        let (evs, end) = translate_compare(
            compare::CompareEvent::Error {
                code: ErrorCode::Busy,
                message: "busy".into(),
            },
            &mut panes,
            &labels,
        );
        assert_eq!(evs.len(), 2);
        assert_eq!(end.unwrap().unwrap_err().code, "busy");
    }

    #[test]
    fn memory_parts_sum_layers_per_kind_and_precision() {
        let layer = |layer, kind, precision: &str, used| LayerBytes {
            layer,
            kind,
            precision: precision.into(),
            tokens: 1,
            bytes: ByteCount {
                used,
                allocated: used,
            },
        };
        let kv = KvBytes {
            layers: vec![
                layer(0, AttentionKind::Sliding, "f16", 10),
                layer(1, AttentionKind::Full, "tq3.5", 3),
                layer(2, AttentionKind::Sliding, "f16", 10),
                layer(3, AttentionKind::Full, "tq3.5", 3),
            ],
            ..Default::default()
        };
        assert_eq!(
            kv_parts(&kv),
            vec![
                KvPart {
                    kind: "sliding",
                    precision: "f16".into(),
                    bytes: 20
                },
                KvPart {
                    kind: "full",
                    precision: "tq3.5".into(),
                    bytes: 6
                },
            ]
        );
    }
}
