import { beforeEach, describe, expect, it, vi } from "vitest";
import type { Event, GenerateRequest } from "../api";

const engine = vi.hoisted(() => ({ fail: null as null | { code: string; message: string }, requests: [] as GenerateRequest[], stopped: [] as string[] }));
vi.mock("../api", async (importOriginal) => {
  const real = await importOriginal<typeof import("../api")>();
  return {
    ...real,
    generate: vi.fn(async (req: GenerateRequest, onEvent: (e: Event) => void) => {
      engine.requests.push(req);
      if (engine.fail) throw engine.fail;
      onEvent({ type: "token", text: "Hello" });
      onEvent({ type: "token", text: " there" });
      onEvent({ type: "done", reason: "stop", token_ids: [] });
    }),
    stopGeneration: vi.fn(async (id: string) => {
      engine.stopped.push(id);
    }),
  };
});

const { ChatStore } = await import("./chat.svelte");
const { AttachmentStore } = await import("../attachments.svelte");

describe("ChatStore", () => {
  let finished = 0;
  let ready = true;
  const store = () => {
    const docs = new AttachmentStore(() => ({ loaded: true, reserve: 64, maxBytes: 1 << 20, conversation: "s-1" }));
    const chat = new ChatStore(
      {
        conversation: () => "s-1",
        ready: () => ready,
        preset: () => undefined,
        cacheSpec: () => "f16",
        switchCache: async () => {},
        finished: async () => {
          finished += 1;
        },
      },
      docs,
    );
    return { chat, docs };
  };
  beforeEach(() => {
    engine.fail = null;
    engine.requests = [];
    engine.stopped = [];
    finished = 0;
    ready = true;
  });

  it("streams an answer into the conversation and asks with what came before", async () => {
    const { chat } = store();
    chat.system = "Be brief.";
    await chat.send("Hi");
    expect(chat.messages.map((m) => [m.role, m.content])).toEqual([
      ["user", "Hi"],
      ["model", "Hello there"],
    ]);
    expect(chat.generating).toBe(false);
    expect(finished).toBe(1);
    const req = engine.requests[0];
    expect(req.conversation).toEqual({ by: "id", id: "s-1" });
    expect(req.prompt.type === "conversation" && req.prompt.messages.map((m) => m.role)).toEqual(["system", "user"]);
    await chat.regenerate();
    expect(chat.messages).toHaveLength(2);
    expect(engine.requests).toHaveLength(2);
  });

  it("sends nothing without a model or text", async () => {
    const { chat } = store();
    await chat.send("   ");
    ready = false;
    await chat.send("Hi");
    expect([chat.messages.length, engine.requests.length]).toEqual([0, 0]);
  });

  it("shows a refused request as the answer's error, with its code", async () => {
    const { chat } = store();
    engine.fail = { code: "context_overflow", message: "the prompt is 9000 tokens" };
    await chat.send("Hi");
    expect(chat.messages[1].error).toEqual({ code: "context_overflow", message: "the prompt is 9000 tokens" });
    expect(chat.messages[1].streaming).toBe(false);
    expect(finished).toBe(1);
  });
});
