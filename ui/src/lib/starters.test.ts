import { beforeEach, describe, expect, it, vi } from "vitest";
import type { CacheOptions, CacheSelection, Event, GenerateRequest, ModelCard, SwitchEvent } from "./api";

// The store talks to the app through api.ts: stand in for the engine here.
const engine = vi.hoisted(() => ({
  tokens: 40,
  streamed: 0,
  switches: [] as { spec: string; afterTokens: number; streaming: boolean }[],
  requests: [] as unknown[],
}));
vi.mock("./api", async (importOriginal) => {
  const real = await importOriginal<typeof import("./api")>();
  return {
    ...real,
    generate: vi.fn(async (req: GenerateRequest, onEvent: (e: Event) => void) => {
      engine.requests.push(req);
      engine.streamed = 0;
      for (let i = 0; i < engine.tokens; i++) {
        await new Promise((r) => setTimeout(r, 2));
        engine.streamed += 1;
        onEvent({ type: "token", text: ` w${i}` });
      }
      onEvent({
        type: "stats",
        prompt_tokens: 1,
        reused_tokens: 0,
        prefill_tokens: 1,
        generated_tokens: engine.tokens,
        time_to_first_token_s: 0.001,
        prefill_tok_per_s: 1,
        decode_tok_per_s: 1,
        context_tokens: 1,
        max_context: 32768,
        kv_bytes: 1,
        kv_bytes_allocated: 1,
        kv_calibrating: false,
        cache_spec: "x",
        cache_origin: "new",
      });
      onEvent({ type: "done", reason: "length", token_ids: [] });
    }),
    switchCache: vi.fn(async (_conversation: string, cache: CacheSelection): Promise<SwitchEvent> => {
      const spec = typeof cache === "string" ? cache : JSON.stringify(cache);
      engine.switches.push({ spec, afterTokens: engine.streamed, streaming: engine.streamed < engine.tokens });
      const bytes = (used: number) => ({ used, allocated: used });
      return { kind: "switch", t_ms: Date.now(), from: "f16", to: spec, tokens: engine.streamed, kv_before: bytes(1000), kv_after: bytes(250), rss_before: 0, rss_after: 0, duration_ms: 1 };
    }),
    saveSession: vi.fn(async () => ({ id: "s", title: "t", updated_ms: 0 })),
    listSessions: vi.fn(async () => ({ sessions: [], unreadable: [] })),
  };
});

const { AppStore } = await import("./store.svelte");
const { ALICE_OPENING, STARTERS, isBaseModel } = await import("./starters");

const starter = (id: string) => STARTERS.find((s) => s.id === id)!;

function storeWithModel(): InstanceType<typeof AppStore> {
  const store = new AppStore();
  // What the engine's cache options name (see kv/spec/presets.rs).
  store.cache.options = { default_spec: "f16", suggested_spec: "tq3.5@all" } as CacheOptions;
  store.cache.spec = store.cache.options.default_spec;
  store.model.card = { name: "gemma-3-270m", has_chat_template: false, supports_thinking: false } as ModelCard;
  return store;
}

beforeEach(() => {
  engine.tokens = 40;
  engine.streamed = 0;
  engine.switches = [];
  engine.requests = [];
});

describe("first-run starters", () => {
  it("are offered for base models only", () => {
    expect(isBaseModel({ has_chat_template: false })).toBe(true);
    expect(isBaseModel({ has_chat_template: true })).toBe(false);
    // Unknown (a card read before loading): not called a base model.
    expect(isBaseModel({ has_chat_template: null })).toBe(false);
    expect(isBaseModel(null)).toBe(false);
  });

  it("hold a document long enough to pass the 512-token sliding window", () => {
    const words = ALICE_OPENING.trim().split(/\s+/).length;
    expect(words).toBeGreaterThan(900);
    expect(ALICE_OPENING).toMatch(/^CHAPTER I\. Down the Rabbit-Hole\n\nAlice was beginning to get very tired/);
    expect(ALICE_OPENING.trim()).toMatch(/and the fall was over\.$/);
    expect(ALICE_OPENING).not.toMatch(/`|  /);
  });

  it("send the document as an attachment chip whose text goes to the model", async () => {
    const store = storeWithModel();
    await store.chat.sendStarter(starter("document"));
    expect(store.chat.messages.map((m) => m.role)).toEqual(["user", "model"]);
    const user = store.chat.messages[0];
    expect(user.content).toBe(ALICE_OPENING);
    expect(user.display).toBe("");
    expect(user.attachments).toEqual(["Alice's Adventures in Wonderland, chapter I"]);
    const prompt = (engine.requests[0] as GenerateRequest).prompt;
    expect(prompt.type === "conversation" && prompt.messages.at(-1)).toEqual({ role: "user", content: ALICE_OPENING });
    expect(engine.switches).toEqual([]);
    // The user typed nothing: the title names the document, not its first line.
    expect(store.sessionTitle).toBe("Alice's Adventures in Wonderland, chapter I");
  });

  it("switch the cache mid-answer, after the starter's token count, and mark the timeline", async () => {
    const store = storeWithModel();
    const s = starter("switch");
    await store.chat.sendStarter(s);
    expect(engine.switches).toHaveLength(1);
    const [sw] = engine.switches;
    expect(sw.spec).toBe("tq3.5@all");
    expect(sw.streaming).toBe(true);
    expect(sw.afterTokens).toBeGreaterThanOrEqual(s.switchAfter!);
    expect(sw.afterTokens).toBeLessThan(engine.tokens);
    expect(store.timeline.series.markers.map((m) => [m.to, m.beforeBytes, m.afterBytes])).toEqual([["tq3.5@all", 1000, 250]]);
    expect(store.cache.spec).toBe("tq3.5@all");
    expect(store.chat.messages[1].content.trim().split(" ")).toHaveLength(engine.tokens);
    expect(store.chat.generating).toBe(false);
  });

  it("start the switch demo from FP16, switching there first if the cache is elsewhere", async () => {
    const store = storeWithModel();
    store.cache.spec = "tq3.5@all";
    await store.chat.sendStarter(starter("switch"));
    expect(engine.switches.map((s) => [s.spec, s.afterTokens])).toEqual([
      ["f16", 0],
      ["tq3.5@all", engine.switches[1].afterTokens],
    ]);
    expect(engine.switches[1].afterTokens).toBeGreaterThanOrEqual(16);
    expect(store.timeline.series.markers).toHaveLength(2);
  });

  it("still switch, after the answer, when it ends before the token count", async () => {
    engine.tokens = 5;
    const store = storeWithModel();
    await store.chat.sendStarter(starter("switch"));
    expect(engine.switches.map((s) => [s.spec, s.afterTokens, s.streaming])).toEqual([["tq3.5@all", 5, false]]);
  });
});
