import { render } from "svelte/server";
import { describe, expect, it } from "vitest";
import type { ModelCard } from "./api";
import EmptyState from "./EmptyState.svelte";
import type { AppStore } from "./store.svelte";

// The empty state reads the card and whether an answer is running, nothing else.
const storeWith = (card: Partial<ModelCard> | null) => ({ model: { card }, chat: { generating: false } }) as unknown as AppStore;

describe("the empty conversation", () => {
  it("introduces a base model and offers the two starters", () => {
    const { body } = render(EmptyState, { props: { store: storeWith({ name: "gemma-3-270m-q4_k_m", has_chat_template: false }) } });
    expect(body).toContain('data-kind="base"');
    expect(body).toContain("gemma-3-270m-q4_k_m is a small base model");
    expect(body).toMatch(/continues text/);
    expect([...body.matchAll(/data-testid="starter-(\w+)"/g)].map((m) => m[1])).toEqual(["document", "switch"]);
    expect(body).toContain("Continue a long document");
    expect(body).toContain("Switch the cache mid-answer");
  });

  it("greets as a chat on an instruction-tuned model, and when it is not known", () => {
    for (const has_chat_template of [true, null, undefined]) {
      const { body } = render(EmptyState, { props: { store: storeWith({ name: "gemma-4-E2B-it", has_chat_template }) } });
      expect(body, String(has_chat_template)).toContain('data-kind="chat"');
      expect(body).toContain("Chat with gemma-4-E2B-it");
      expect(body).not.toContain("starter-");
    }
  });

  it("says a model is loading before there is a card", () => {
    const { body } = render(EmptyState, { props: { store: storeWith(null) } });
    expect(body).toContain('data-kind="loading"');
    expect(body).toContain("Loading a model");
  });
});
