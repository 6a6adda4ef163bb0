// What a document (or any extra tokens) will cost in the KV cache under each precision, and
// whether it still fits the context. Mirrors src-tauri/src/cachespec.rs `context_bytes`.

import type { ModelCard, TokenCost } from "./api";

/** KV bytes of a context of `tokens` under `cost`; sliding layers hold at most `window`. */
export function contextBytes(cost: TokenCost, tokens: number, window: number): number {
  const sliding = window > 0 ? Math.min(tokens, window) : tokens;
  return cost.full_bytes_per_token * tokens + cost.sliding_bytes_per_token * sliding;
}

export interface DocumentCost {
  spec: string;
  label: string;
  /** Extra KV bytes the document adds on top of the current context. */
  bytes: number;
}

export interface DocumentFit {
  costs: DocumentCost[];
  /** Context tokens after adding the document and room for the answer. */
  contextAfter: number;
  fits: boolean;
}

/**
 * The cost of adding `docTokens` to a context that already holds `contextTokens`, leaving
 * `reserve` tokens for the answer.
 */
export function documentFit(card: ModelCard, contextTokens: number, docTokens: number, reserve: number): DocumentFit {
  const after = contextTokens + docTokens;
  const costs = card.token_costs.map((c) => ({
    spec: c.spec,
    label: c.label,
    bytes: contextBytes(c, after, card.sliding_window) - contextBytes(c, contextTokens, card.sliding_window),
  }));
  return { costs, contextAfter: after + reserve, fits: after + reserve <= card.max_context };
}
