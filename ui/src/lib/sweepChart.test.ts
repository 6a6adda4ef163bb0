import { describe, expect, it } from "vitest";
import { KLD_FLOOR, layoutSweep, type Box } from "./sweepChart";
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
});
