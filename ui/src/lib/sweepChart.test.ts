import { describe, expect, it } from "vitest";
import { KLD_FLOOR, labelBox, layoutSweep, type Box } from "./sweepChart";
import type { SweepPoint } from "./bindings";

const box: Box = { width: 300, height: 160, left: 40, right: 10, top: 10, bottom: 20 };
const point = (kv: string, bits: number, kld: number): SweepPoint => ({
  kv,
  bits_per_coordinate: bits,
  mean_kld: kld,
  p99_kld: kld * 5,
  top1_agreement: 0.9,
  ppl: 10,
  ppl_reference: 10,
  tokens_scored: 100,
});

describe("layoutSweep", () => {
  it("puts bits on a log2 axis and KLD on a log10 axis, loss upwards", () => {
    const l = layoutSweep([point("f16", 16, 0), point("tq4@all", 4, 0.01), point("tq2@all", 2, 1)], (k) => k.toUpperCase(), "tq4@all", box);
    const [f16, tq4, tq2] = l.points;
    // Powers of two 2..16 span the plot width; 4 bits sits a third of the way.
    expect(l.xTicks.map((t) => t.label)).toEqual(["2", "4", "8", "16"]);
    expect(tq2.x).toBeCloseTo(40);
    expect(f16.x).toBeCloseTo(290);
    expect(tq4.x).toBeCloseTo(40 + 250 / 3);
    // Decades from the floor (1e-4) to 1: the lossless cache on the floor, the worst on top.
    expect(l.yTicks.map((t) => t.label)).toEqual(["1e-4", "1e-3", "1e-2", "1e-1", "1"]);
    expect(f16.floored && !tq4.floored).toBe(true);
    expect(f16.y).toBeCloseTo(140);
    expect(tq2.y).toBeCloseTo(10);
    expect(tq4.y).toBeCloseTo(10 + 130 / 2);
    expect(l.points.filter((p) => p.current).map((p) => p.label)).toEqual(["TQ4@ALL"]);
  });

  it("draws nothing without points and keeps one decade for a single one", () => {
    expect(layoutSweep([], (k) => k, "", box).points).toEqual([]);
    const l = layoutSweep([point("tq3@all", 3.1, 0.2)], (k) => k, "x", box);
    expect(l.xTicks.length).toBe(2);
    expect(l.yTicks.length).toBe(2);
    expect(l.points[0].kld).toBeGreaterThan(KLD_FLOOR);
  });

  it("places labels of close points apart and off the other points", () => {
    const wide: Box = { width: 420, height: 170, left: 38, right: 12, top: 10, bottom: 30 };
    // The app's sweep of a short conversation (the e2e test's): TQ 3.1, TQ 3.6 and q4_0 sit
    // within 40 px of one another, where labels right of their points overlapped.
    const pts = [
      point("f32", 32, 0.0014),
      point("f16", 16, 0),
      point("k8v4", 6.42, 0.0117),
      point("k5v4", 4.92, 0.0117),
      point("tq4", 4.42, 0.0197),
      point("k4v3", 3.92, 0.0472),
      point("tq3", 3.42, 0.0584),
      point("q8_0", 8.5, 0.0017),
      point("q8_0/q4_0", 6.5, 0.0052),
      point("q4_0", 4.5, 0.0902),
    ];
    const names: Record<string, string> = { f32: "FP32", f16: "FP16", k8v4: "TQ 6.1", k5v4: "TQ 4.6", tq4: "TQ 4.1", k4v3: "TQ 3.6", tq3: "TQ 3.1" };
    const l = layoutSweep(pts, (k) => names[k] ?? k, "k4v3", wide);
    const rects = l.points.map((p) => labelBox(p.label, p));
    for (let i = 0; i < rects.length; i++)
      for (let j = i + 1; j < rects.length; j++) {
        const [a, b] = [rects[i], rects[j]];
        const clash = a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
        expect(clash, `${l.points[i].label} and ${l.points[j].label}`).toBe(false);
      }
    // No label covers another cache's point.
    l.points.forEach((p, i) => {
      l.points.forEach((q, j) => {
        const r = rects[j];
        const covers = i !== j && p.x > r.x0 - 4 && p.x < r.x1 + 4 && p.y > r.y0 - 4 && p.y < r.y1 + 4;
        expect(covers, `${q.label} covers ${p.label}'s point`).toBe(false);
      });
    });
    // Labels stay next to their points.
    for (const p of l.points) expect(Math.abs(p.labelX - p.x)).toBe(6);
    // A point near the right edge is labelled on its left.
    const f32 = l.points.find((p) => p.kv === "f32")!;
    expect(f32.anchor).toBe("end");
  });
});
