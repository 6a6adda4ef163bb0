import { describe, expect, it } from "vitest";
import type { ConversationInfo, MemorySample, SwitchEvent } from "../api";
import { TimelineStore } from "./timeline.svelte";

const conv = (id: string, tokens: number, bytes: number, tier: ConversationInfo["tier"] = "held", calibrating = false): ConversationInfo => ({
  id,
  tier,
  tokens,
  spec: "f16",
  bytes,
  allocated: bytes,
  calibrating,
  disk_bytes: 0,
  busy: false,
  last_used_ms: 0,
  layers: [],
});

const sample = (t: number, conversations: ConversationInfo[]): MemorySample => ({
  t_ms: t,
  tokens_in_context: 999,
  kv: { total_used: 3000, total_allocated: 3000, parts: [] } as unknown as MemorySample["kv"],
  weights_bytes: 100,
  rss_bytes: 5000,
  cache_spec: "engine's",
  calibrating: true,
  conversations,
});

const bytes = (used: number) => ({ used, allocated: used });

describe("TimelineStore", () => {
  it("reads a sample's figures for the conversation on screen", () => {
    const t = new TimelineStore();
    t.onSample(sample(1000, [conv("a", 10, 1000, "held", true), conv("b", 40, 2000, "demoted")]), "b", "tq4");
    expect(t.lastSample?.tokens_in_context).toBe(40);
    expect(t.lastSample?.cache_spec).toBe("f16");
    // Whether its cache still waits to calibrate is the conversation's too, not the sample's.
    expect(t.lastSample?.calibrating).toBe(false);
    expect(t.conversation("a")?.bytes).toBe(1000);
    expect(t.series.length).toBe(1);
    expect(t.version).toBe(1);
    // A conversation the engine does not hold yet: no tokens, and the chat's own cache name.
    t.onSample(sample(1500, [conv("a", 10, 1000)]), "new", "tq4");
    expect(t.lastSample?.tokens_in_context).toBe(0);
    expect(t.lastSample?.calibrating).toBe(false);
    expect(t.lastSample?.cache_spec).toBe("tq4");
    expect(t.conversations.map((c) => c.id)).toEqual(["a"]);
  });

  it("marks switches, clears and restores a saved series with a break", () => {
    const t = new TimelineStore();
    t.onSample(sample(1000, [conv("a", 10, 1000)]), "a", "f16");
    const sw: SwitchEvent = { kind: "switch", t_ms: 1200, from: "f16", to: "tq4", tokens: 10, kv_before: bytes(1000), kv_after: bytes(250), rss_before: 0, rss_after: 0, duration_ms: 3 };
    t.mark(sw);
    expect(t.series.markers.map((m) => [m.to, m.beforeBytes, m.afterBytes])).toEqual([["tq4", 1000, 250]]);
    const saved = t.series.toJSON();
    t.clear();
    expect([t.series.length, t.series.markers.length]).toEqual([0, 0]);
    t.restore(saved, 9000);
    // The saved sample, then an empty one that breaks the lines before the live ones.
    expect(t.series.length).toBe(2);
    expect(t.series.markers).toHaveLength(1);
    expect(t.version).toBe(4);
    t.restore(new TimelineStore().series.toJSON(), 9000);
    expect(t.series.length).toBe(0);
  });
});
