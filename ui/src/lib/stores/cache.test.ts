import { beforeEach, describe, expect, it, vi } from "vitest";
import type { CacheOptions, CacheSelection, ModelCard } from "../api";

const engine = vi.hoisted(() => ({ refuse: "", switched: [] as string[], kvBudget: undefined as number | null | undefined }));
vi.mock("../api", async (importOriginal) => {
  const real = await importOriginal<typeof import("../api")>();
  const bytes = (used: number) => ({ used, allocated: used });
  return {
    ...real,
    cacheOptions: vi.fn(async () => ({ default_spec: "f16", suggested_spec: "k4v3+qw@all", presets: [] })),
    setKvBudget: vi.fn(async (b: number | null) => {
      engine.kvBudget = b;
    }),
    switchCache: vi.fn(async (_c: string, cache: CacheSelection) => {
      if (engine.refuse) throw { code: "busy", message: engine.refuse };
      const to = typeof cache === "string" ? cache : "choice";
      engine.switched.push(to);
      return { kind: "switch", t_ms: 1, from: "f16", to, tokens: 3, kv_before: bytes(8), kv_after: bytes(2), rss_before: 0, rss_after: 0, duration_ms: 1 };
    }),
    restoreSessionCache: vi.fn(async (id: string) => {
      if (engine.refuse) throw { code: "cache_corrupt", message: engine.refuse };
      return { id, cache: { spec: "q8_0", tokens: 12, bytes: 4096 }, secs: 0.01, dropped: [] };
    }),
  };
});

const { CacheStore } = await import("./cache.svelte");

const card = (specs: string[]) => ({ token_costs: specs.map((spec) => ({ spec })) }) as unknown as ModelCard;

describe("CacheStore", () => {
  let loaded: ModelCard | null = null;
  let refreshed = 0;
  const store = () =>
    new CacheStore({
      conversation: () => "s-1",
      card: () => loaded,
      sessionsChanged: async () => {
        refreshed += 1;
      },
      sessionError: () => {},
    });
  beforeEach(() => {
    engine.refuse = "";
    engine.switched = [];
    engine.kvBudget = undefined;
    loaded = null;
    refreshed = 0;

  });

  it("takes the engine's default cache unless one is chosen", async () => {
    const c = store();
    await c.start();
    expect(c.spec).toBe("f16");
    const chosen = store();
    chosen.spec = "tq4@all";
    await chosen.start();
    expect(chosen.spec).toBe("tq4@all");
  });

  it("keeps the switched SPEC, and says why a switch was refused", async () => {
    const c = store();
    expect((await c.switchTo("q8_0"))?.to).toBe("q8_0");
    expect(c.spec).toBe("q8_0");
    engine.refuse = "cannot switch while a generation is running";
    expect(await c.switchTo("q4_0")).toBeNull();
    expect(c.spec).toBe("q8_0");
    expect(c.switchError).toMatch(/generation is running/);
    expect(engine.switched).toEqual(["q8_0"]);
  });

  it("names the presets the loaded model cannot hold", () => {
    const c = store();
    c.options = {
      presets: [
        { specs: { all: "f16", full: "f16@full", sliding: "f16@sliding" } },
        { specs: { all: "q8_0", full: "q8_0@full", sliding: "q8_0@sliding" } },
      ],
    } as unknown as CacheOptions;
    expect(c.unfitSpecs.size).toBe(0);
    loaded = card(["f16"]);
    expect([...c.unfitSpecs].sort()).toEqual(["q8_0", "q8_0@full", "q8_0@sliding"]);
  });

  it("restores a saved cache's SPEC, and reads the conversation again when it cannot", async () => {
    const c = store();
    await c.restore("s-1");
    expect(c.spec).toBe("q8_0");
    expect(c.notice).toMatch(/^Restored 12 tokens/);
    engine.refuse = "checksum failed";
    await c.restore("s-1");
    expect(c.notice).toMatch(/not used \(checksum failed\): the next answer reads the conversation again/);
    expect(refreshed).toBe(1);
  });

  it("sends the memory budget to the engine", async () => {
    const c = store();
    await c.setKvBudget(1 << 30);
    expect([c.kvBudget, engine.kvBudget]).toEqual([1 << 30, 1 << 30]);
    await c.setKvBudget(null);
    expect(engine.kvBudget).toBeNull();
  });
});
