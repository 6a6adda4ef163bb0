import { beforeEach, describe, expect, it, vi } from "vitest";
import type { DocumentFit, InspectedDocument } from "./api";

// The engine, as api.ts reaches it: counts what it is given, refuses what it is told to.
const engine = vi.hoisted(() => ({ fitCalls: [] as [number[], number][], refuseFits: false }));
vi.mock("./api", async (importOriginal) => {
  const real = await importOriginal<typeof import("./api")>();
  return {
    ...real,
    documentFits: vi.fn(async (_conversation: string | null, tokens: number[], reserve: number): Promise<DocumentFit[]> => {
      engine.fitCalls.push([tokens, reserve]);
      if (engine.refuseFits) throw { code: "no_model", message: "no model is loaded" };
      let before = 0;
      return tokens.map((t) => {
        before += t;
        return { tokens: t, kv_bytes: t * 10, total_tokens: before, fits: before + reserve <= 100 } as unknown as DocumentFit;
      });
    }),
  };
});

const { AttachmentStore } = await import("./attachments.svelte");

const doc = (name: string, tokens: number) => ({ name, tokens, text: name, kind: "text" }) as unknown as InspectedDocument;

describe("AttachmentStore", () => {
  let loaded = true;
  const store = () => new AttachmentStore(() => ({ loaded, reserve: 16, maxBytes: 1 << 20 }));
  beforeEach(() => {
    engine.fitCalls = [];
    engine.refuseFits = false;
    loaded = true;
  });

  it("counts every attachment's cost after the ones before it, with the answer's reserve", async () => {
    const s = store();
    await s.attach(async () => doc("a.txt", 30));
    await s.attach(async () => doc("b.txt", 50));
    expect(s.attachments.map((d) => d.name)).toEqual(["a.txt", "b.txt"]);
    expect(engine.fitCalls.at(-1)).toEqual([[30, 50], 16]);
    expect(s.fits.map((f) => f.fits)).toEqual([true, true]);
    await s.detach(s.attachments[0]);
    expect(engine.fitCalls.at(-1)).toEqual([[50], 16]);
    expect(s.fits).toHaveLength(1);
  });

  it("keeps what it had when the engine refuses a document, and says why", async () => {
    const s = store();
    await s.attach(async () => doc("a.txt", 30));
    await s.attach(async () => {
      throw { code: "binary_document", message: "photo.png is not a text document" };
    });
    expect(s.attachments.map((d) => d.name)).toEqual(["a.txt"]);
    expect(s.notice).toContain("photo.png is not a text document");
    // The next good document clears the notice.
    await s.attach(async () => doc("c.txt", 5));
    expect(s.notice).toBe("");
  });

  it("asks nothing without a model, and hands its documents over once", async () => {
    loaded = false;
    const s = store();
    await s.attach(async () => doc("a.txt", 30));
    expect(engine.fitCalls).toEqual([]);
    expect(s.fits).toEqual([]);
    expect(s.take().map((d) => d.name)).toEqual(["a.txt"]);
    expect(s.attachments).toEqual([]);
  });
});
