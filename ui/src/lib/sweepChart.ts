// Geometry of the compare view's sweep chart: mean KL divergence (log scale) against bits per
// coordinate (log2 scale), one point per cache, the conversation's current cache marked.
// Pure functions, so the placement is unit-tested apart from the SVG.

import type { SweepPoint } from "./bindings";

/** KLDs below this (a lossless cache scores exactly 0) sit on the chart's floor. */
export const KLD_FLOOR = 1e-4;

export interface PlacedPoint {
  kv: string;
  label: string;
  bits: number;
  kld: number;
  x: number;
  y: number;
  /** The cache the conversation holds now. */
  current: boolean;
  /** Below the floor: drawn on it, labelled "≈0". */
  floored: boolean;
}

export interface Tick {
  at: number;
  label: string;
}

export interface SweepLayout {
  points: PlacedPoint[];
  xTicks: Tick[];
  yTicks: Tick[];
}

export interface Box {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

/** Places `points` in `box`: x = log2(bits) over whole powers of two, y = log10(KLD) over
 * whole decades (higher loss higher up). */
export function layoutSweep(points: SweepPoint[], labelOf: (kv: string) => string, current: string, box: Box): SweepLayout {
  if (points.length === 0) return { points: [], xTicks: [], yTicks: [] };
  const bits = points.map((p) => Math.max(p.bits_per_coordinate, 1));
  const klds = points.map((p) => Math.max(p.mean_kld, KLD_FLOOR));
  const x0 = Math.floor(Math.log2(Math.min(...bits)));
  const x1 = Math.max(x0 + 1, Math.ceil(Math.log2(Math.max(...bits))));
  const y0 = Math.floor(Math.log10(Math.min(...klds)));
  const y1 = Math.max(y0 + 1, Math.ceil(Math.log10(Math.max(...klds))));
  const w = box.width - box.left - box.right;
  const h = box.height - box.top - box.bottom;
  const px = (b: number) => box.left + ((Math.log2(b) - x0) / (x1 - x0)) * w;
  const py = (k: number) => box.top + (1 - (Math.log10(k) - y0) / (y1 - y0)) * h;
  const xTicks: Tick[] = [];
  for (let e = x0; e <= x1; e++) xTicks.push({ at: px(2 ** e), label: String(2 ** e) });
  const yTicks: Tick[] = [];
  for (let e = y0; e <= y1; e++) yTicks.push({ at: py(10 ** e), label: e >= 0 ? String(10 ** e) : `1e${e}` });
  return {
    points: points.map((p, i) => ({
      kv: p.kv,
      label: labelOf(p.kv),
      bits: p.bits_per_coordinate,
      kld: p.mean_kld,
      x: px(bits[i]),
      y: py(klds[i]),
      current: p.kv === current,
      floored: p.mean_kld < KLD_FLOOR,
    })),
    xTicks,
    yTicks,
  };
}
