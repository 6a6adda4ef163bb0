import { describe, expect, it } from "vitest";
import { MemoryTimeline } from "./timeline";

describe("MemoryTimeline", () => {
  it("turns samples into seconds-since-start columns", () => {
    const t = new MemoryTimeline();
    t.push({ tMs: 10_000, rssBytes: 100 });
    t.push({ tMs: 10_500, rssBytes: 150 });
    t.push({ tMs: 11_000, rssBytes: 120 });
    expect(t.columns()).toEqual([
      [0, 0.5, 1],
      [100, 150, 120],
    ]);
    expect(t.peakBytes()).toBe(150);
    expect(t.latest()).toEqual({ tMs: 11_000, rssBytes: 120 });
  });

  it("ignores samples that go back in time", () => {
    const t = new MemoryTimeline();
    t.push({ tMs: 2000, rssBytes: 1 });
    t.push({ tMs: 1000, rssBytes: 2 });
    expect(t.length).toBe(1);
  });

  it("stays bounded over an hour of 500 ms samples and keeps the peak", () => {
    const t = new MemoryTimeline(1000);
    const n = 7200;
    for (let i = 0; i < n; i++) {
      t.push({ tMs: i * 500, rssBytes: i === 1234 ? 9_999 : 100 + (i % 7) });
    }
    expect(t.length).toBeLessThanOrEqual(1000);
    expect(t.peakBytes()).toBe(9_999);
    const [x] = t.columns();
    // Time stays ordered and the newest sample is kept exactly.
    for (let i = 1; i < x.length; i++) expect(x[i]).toBeGreaterThan(x[i - 1]);
    expect(t.latest()?.tMs).toBe((n - 1) * 500);
  });
});
