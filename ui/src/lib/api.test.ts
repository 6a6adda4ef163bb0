import { afterEach, describe, expect, it, vi } from "vitest";

// Tauri's IPC stood in for: `invoke` replies at once, and each test delivers the channel's
// messages when it chooses (after the reply, as Tauri may for a larger message).
const ipc = vi.hoisted(() => ({ channels: [] as { onmessage: (m: unknown) => void }[] }));
vi.mock("@tauri-apps/api/core", () => ({
  Channel: class {
    onmessage: (m: unknown) => void = () => {};
    constructor() {
      ipc.channels.push(this);
    }
  },
  invoke: vi.fn(async () => ({ repo: "r", path: "/p" })),
}));
const reply = async () => undefined;

import { startDownload, streaming } from "./api";

type Ev = { type: "token" | "stats" | "done" };

afterEach(() => {
  ipc.channels.length = 0;
  vi.useRealTimers();
});

describe("streaming", () => {
  it("resolves only once the last event has arrived, even when it trails the command's reply", async () => {
    const seen: string[] = [];
    let resolved = false;
    const run = streaming<Ev>(reply, (e) => seen.push(e.type), (e) => e.type === "done").then(() => {
      resolved = true;
    });
    const channel = ipc.channels[0];
    channel.onmessage({ type: "token" });
    // The reply is in; the stats and done are not.
    await new Promise((r) => setTimeout(r, 20));
    expect(resolved).toBe(false);
    channel.onmessage({ type: "stats" });
    await new Promise((r) => setTimeout(r, 20));
    expect(resolved).toBe(false);
    channel.onmessage({ type: "done" });
    await run;
    expect(resolved).toBe(true);
    expect(seen).toEqual(["token", "stats", "done"]);
  });

  it("goes on after the grace period when no last event ever comes", async () => {
    vi.useFakeTimers();
    let resolved = false;
    const run = streaming<Ev>(reply, () => {}, (e) => e.type === "done", 5_000).then(() => {
      resolved = true;
    });
    await vi.advanceTimersByTimeAsync(4_000);
    expect(resolved).toBe(false);
    await vi.advanceTimersByTimeAsync(1_500);
    await run;
    expect(resolved).toBe(true);
  });
});

describe("startDownload", () => {
  it("passes progress on until the result is in, and drops what trails it", async () => {
    const seen: number[] = [];
    const run = startDownload("r", null, (u) => seen.push(u.done));
    const channel = ipc.channels[0];
    channel.onmessage({ done: 1, total: 4 });
    await run;
    channel.onmessage({ done: 3, total: 4 });
    expect(seen).toEqual([1]);
  });
});
