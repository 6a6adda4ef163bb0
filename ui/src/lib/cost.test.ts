import { describe, expect, it } from "vitest";
import type { ModelCard } from "./api";
import { contextBytes, documentFit } from "./cost";

const card = {
  max_context: 1000,
  sliding_window: 512,
  token_costs: [
    { spec: "f16", label: "FP16", full_bytes_per_token: 100, sliding_bytes_per_token: 500 },
    { spec: "tq3.5", label: "TQ 3.5", full_bytes_per_token: 25, sliding_bytes_per_token: 125 },
  ],
} as unknown as ModelCard;

describe("document costs", () => {
  it("counts sliding layers only up to their window", () => {
    expect(contextBytes(card.token_costs[0], 100, 512)).toBe(100 * 100 + 100 * 500);
    expect(contextBytes(card.token_costs[0], 600, 512)).toBe(600 * 100 + 512 * 500);
  });

  it("prices a document as the growth of the context under each precision", () => {
    const fit = documentFit(card, 500, 100, 64);
    // full: 100 tokens × 100 B; sliding: from 500 to 512 held = 12 tokens × 500 B.
    expect(fit.costs).toEqual([
      { spec: "f16", label: "FP16", bytes: 100 * 100 + 12 * 500 },
      { spec: "tq3.5", label: "TQ 3.5", bytes: 100 * 25 + 12 * 125 },
    ]);
    expect(fit.contextAfter).toBe(664);
    expect(fit.fits).toBe(true);
  });

  it("says when the document does not fit with room for an answer", () => {
    expect(documentFit(card, 500, 450, 64).fits).toBe(false);
    expect(documentFit(card, 500, 436, 64).fits).toBe(true);
  });
});
