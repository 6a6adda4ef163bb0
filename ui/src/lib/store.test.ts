import { beforeEach, describe, expect, it, vi } from "vitest";
import type { CacheSelection, ModelCard, SwitchEvent } from "./api";

// The app store ties the domains to the conversation on screen: stand in for the engine.
const engine = vi.hoisted(() => ({
  saved: new Map<string, unknown>(),
  restored: [] as string[],
  switched: [] as [string, string][],
}));
vi.mock("./api", async (importOriginal) => {
  const real = await importOriginal<typeof import("./api")>();
  const bytes = (used: number) => ({ used, allocated: used });
  return {
    ...real,
    saveSession: vi.fn(async (s: { id: string }) => {
      engine.saved.set(s.id, structuredClone(s));
    }),
    loadSession: vi.fn(async (id: string) => {
      const s = engine.saved.get(id);
      if (!s) throw { code: "session_not_found", message: `no session ${id}` };
      return s;
    }),
    listSessions: vi.fn(async () => ({ sessions: [], unreadable: [] })),
    switchCache: vi.fn(async (conversation: string, cache: CacheSelection): Promise<SwitchEvent> => {
      const to = typeof cache === "string" ? cache : "choice";
      engine.switched.push([conversation, to]);
      return { kind: "switch", t_ms: 5, from: "f16", to, tokens: 2, kv_before: bytes(100), kv_after: bytes(30), rss_before: 0, rss_after: 0, duration_ms: 1 };
    }),
    restoreSessionCache: vi.fn(async (id: string) => {
      engine.restored.push(id);
      return null;
    }),
  };
});

const { AppStore } = await import("./store.svelte");

const msg = (role: "user" | "model", content: string, streaming = false) => ({ id: `${role}-${content}`, role, content, thinking: "", streaming });

function storeWithModel() {
  const store = new AppStore();
  store.cache.spec = "f16";
  store.model.card = { name: "m", path: "/m.gguf", supports_thinking: true } as ModelCard;
  store.model.modelPath = "/m.gguf";
  return store;
}

beforeEach(() => {
  engine.saved.clear();
  engine.restored = [];
  engine.switched = [];
});

describe("AppStore", () => {
  it("switches the conversation's cache, marks it and saves the session with it", async () => {
    const store = storeWithModel();
    store.chat.messages = [msg("user", "Hi")];
    await store.switchCache("q8_0");
    expect(engine.switched).toEqual([[store.sessionId, "q8_0"]]);
    expect(store.timeline.series.markers.map((m) => m.to)).toEqual(["q8_0"]);
    expect(store.snapshot().cache_spec).toBe("q8_0");
    expect((engine.saved.get(store.sessionId) as { cache_spec: string }).cache_spec).toBe("q8_0");
  });

  it("leaves a conversation for a new one and opens it again as it was", async () => {
    const store = storeWithModel();
    const first = store.sessionId;
    store.chat.system = "Be brief.";
    store.chat.messages = [
      msg("user", "Hi"),
      msg("model", "Hello", true),
    ];
    store.sessionTitle = "Greeting";
    await store.switchCache("tq4@all");
    await store.reset();
    expect(store.sessionId).not.toBe(first);
    expect([store.chat.messages.length, store.sessionTitle, store.timeline.series.markers.length]).toEqual([0, "New chat", 0]);
    const s = await store.openSession(first);
    expect(s?.title).toBe("Greeting");
    expect(store.sessionId).toBe(first);
    expect(store.chat.system).toBe("Be brief.");
    // An answer saved mid-stream opens finished; the marker comes back with its timeline.
    expect(store.chat.messages.map((m) => [m.content, !!m.streaming])).toEqual([
      ["Hi", false],
      ["Hello", false],
    ]);
    expect(store.timeline.series.markers.map((m) => m.to)).toEqual(["tq4@all"]);
    expect(engine.restored).toEqual([first]);
    // The cache was already what the session saved: no second switch.
    expect(engine.switched.map(([, to]) => to)).toEqual(["tq4@all"]);
  });

  it("says when a session cannot be opened, and keeps the one on screen", async () => {
    const store = storeWithModel();
    const here = store.sessionId;
    expect(await store.openSession("s-gone")).toBeNull();
    expect(store.sessionId).toBe(here);
    expect(store.sessionList.error).toBe("Not opened: no session s-gone");
  });
});
