import { describe, expect, it } from "vitest";
import type { Event, GenStats } from "./api";
import { applyEvent, conversationTitle, pendingAnswer, toWire, userMessage, type ChatMessage } from "./chat";

const stats: GenStats = {
  prompt_tokens: 10,
  reused_tokens: 0,
  prefill_tokens: 10,
  generated_tokens: 3,
  time_to_first_token_s: 0.12,
  prefill_tok_per_s: 80,
  decode_tok_per_s: 20,
  context_tokens: 13,
  max_context: 256,
  kv_bytes: 4096,
  kv_bytes_allocated: 8192,
  kv_calibrating: false,
  cache_spec: "f16",
  cache_origin: "new",
};

describe("applyEvent", () => {
  it("splits answer tokens and thinking into their own channels and ends on done", () => {
    const events: Event[] = [
      { type: "thinking", text: "Let me " },
      { type: "thinking", text: "think." },
      { type: "token", text: "Hello" },
      { type: "token", text: ", world" },
      { type: "stats", ...stats },
      { type: "done", reason: "stop", token_ids: [5, 6, 1] },
    ];
    let m = pendingAnswer();
    const seen: string[] = [];
    for (const e of events) {
      m = applyEvent(m, e);
      seen.push(m.content);
    }
    expect(m.thinking).toBe("Let me think.");
    expect(m.content).toBe("Hello, world");
    expect(seen).toEqual(["", "", "Hello", "Hello, world", "Hello, world", "Hello, world"]);
    expect(m.streaming).toBe(false);
    expect(m.stopReason).toBe("stop");
    expect(m.stats).toEqual(stats);
  });

  it("keeps partial text when an error arrives", () => {
    let m = applyEvent(pendingAnswer(), { type: "token", text: "Par" });
    m = applyEvent(m, { type: "error", code: "context_overflow", message: "too long" });
    expect(m.content).toBe("Par");
    expect(m.error).toEqual({ code: "context_overflow", message: "too long" });
    expect(m.streaming).toBe(false);
  });
});

describe("toWire", () => {
  const answered = (q: string, a: string): ChatMessage[] => [
    userMessage(q),
    { ...pendingAnswer(), content: a, streaming: false },
  ];

  it("puts the system prompt first and alternates roles", () => {
    const msgs = [...answered("Hi", "Hello!"), userMessage("Bye")];
    expect(toWire("Be brief.", msgs)).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "model", content: "Hello!" },
      { role: "user", content: "Bye" },
    ]);
  });

  it("drops failed turns and stops at upTo (regenerate)", () => {
    const failed: ChatMessage = { ...pendingAnswer(), streaming: false, error: { code: "x", message: "y" } };
    const msgs = [userMessage("A"), failed, ...answered("B", "b"), userMessage("C")];
    expect(toWire("", msgs)).toEqual([
      { role: "user", content: "B" },
      { role: "model", content: "b" },
      { role: "user", content: "C" },
    ]);
    // Regenerating the answer to B: everything up to and including B's question.
    expect(toWire("", msgs, 3)).toEqual([{ role: "user", content: "B" }]);
  });
});

import { toMarkdown } from "./chat";

describe("toMarkdown", () => {
  it("writes title, system prompt, turns and each answer's stats", () => {
    const answer: ChatMessage = { ...pendingAnswer(), content: "Paris.", streaming: false, stats };
    const md = toMarkdown("Capitals", "Be brief.", [userMessage("Capital of France?"), answer]);
    expect(md).toBe(
      "# Capitals\n\n> **System:** Be brief.\n\n## You\n\nCapital of France?\n\n## Model\n\nParis.\n\n*3 tokens · 20.0 tok/s · cache f16*\n",
    );
  });
});

describe("conversationTitle", () => {
  it("comes from what the user typed, not from the documents they attached", () => {
    const doc = "File `notes.md`:\n```\nsecret plans\n```\n\nSummarize this";
    const msgs = [userMessage(doc, ["notes.md"], "Summarize this\nplease"), pendingAnswer()];
    expect(conversationTitle(msgs)).toBe("Summarize this");
  });

  it("names the files when the user typed nothing", () => {
    expect(conversationTitle([userMessage("File `a.txt`:\n...", ["a.txt", "b.txt"], "")])).toBe("a.txt, b.txt");
  });

  it("is the first line of a plain message, cut to 48 characters", () => {
    expect(conversationTitle([userMessage(`${"x".repeat(60)}\nmore`)])).toBe("x".repeat(48));
    expect(conversationTitle([])).toBe("New chat");
  });
});
