import { beforeEach, describe, expect, it, vi } from "vitest";
import type { ModelCard } from "../api";

const engine = vi.hoisted(() => ({ fail: "", status: "ready", loads: [] as [string, string, number][] }));
vi.mock("../api", async (importOriginal) => {
  const real = await importOriginal<typeof import("../api")>();
  return {
    ...real,
    inspectModel: vi.fn(async (path: string) => ({ weights_bytes: path.length })),
    loadModel: vi.fn(async (path: string, spec: string, _w: unknown, context: number) => {
      engine.loads.push([path, spec, context]);
      if (engine.fail) throw { code: "bad_model_file", message: engine.fail };
      return { name: path, path, supports_thinking: false } as unknown as ModelCard;
    }),
    engineStatus: vi.fn(async () => ({ state: engine.status })),
    contextCosts: vi.fn(async (tokens: number) => [{ label: "FP16", spec: "f16", bytes: tokens * 2 }]),
  };
});

const { ModelStore } = await import("./model.svelte");

describe("ModelStore", () => {
  let loaded: string[] = [];
  const store = () =>
    new ModelStore({
      cacheSpec: () => "k4v3+qw@all",
      loaded: async (card) => {
        loaded.push(card.name);
      },
    });
  beforeEach(() => {
    engine.fail = "";
    engine.status = "ready";
    engine.loads = [];
    loaded = [];
  });

  it("loads with the chat's cache and context, then prices the context", async () => {
    const m = store();
    m.context = 2048;
    await m.load("/m/a.gguf");
    expect(engine.loads).toEqual([["/m/a.gguf", "k4v3+qw@all", 2048]]);
    expect(m.card?.name).toBe("/m/a.gguf");
    expect(m.estimate?.weights_bytes).toBe(9);
    expect(m.contextCosts[0].bytes).toBe(4096);
    expect(loaded).toEqual(["/m/a.gguf"]);
    expect(m.loadError).toBe("");
  });

  it("keeps the model the engine still serves when a load fails", async () => {
    const m = store();
    await m.load("/m/a.gguf");
    engine.fail = "not a GGUF file";
    await m.load("/m/b.gguf");
    expect(m.card?.name).toBe("/m/a.gguf");
    expect(m.modelPath).toBe("/m/a.gguf");
    expect(m.loadError).toBe("not a GGUF file");
    // The engine lost it (the load had begun replacing it): no card.
    engine.status = "idle";
    await m.load("/m/c.gguf");
    expect(m.card).toBeNull();
    expect(loaded).toEqual(["/m/a.gguf"]);
  });
});
