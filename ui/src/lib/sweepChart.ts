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
  /** Where the label's text is anchored, and on which side of it the text runs. */
  labelX: number;
  labelY: number;
  anchor: "start" | "end";
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
  const placed = points.map((p, i) => ({
    kv: p.kv,
    label: labelOf(p.kv),
    bits: p.bits_per_coordinate,
    kld: p.mean_kld,
    x: px(bits[i]),
    y: py(klds[i]),
    current: p.kv === current,
    floored: p.mean_kld < KLD_FLOOR,
    labelX: 0,
    labelY: 0,
    anchor: "start" as "start" | "end",
  }));
  placeLabels(placed, box);
  return { points: placed, xTicks, yTicks };
}

/** Width of a label's text at the chart's 8.5 px font, about (no text measuring here). */
const CHAR_WIDTH = 4.7;
const LABEL_HEIGHT = 9;
const DOT_RADIUS = 4;

export interface Rect {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

/** The box a label's text takes when anchored at (`labelX`, `labelY`) on side `anchor`. */
export function labelBox(label: string, at: { labelX: number; labelY: number; anchor: "start" | "end" }): Rect {
  const w = label.length * CHAR_WIDTH;
  const x0 = at.anchor === "start" ? at.labelX : at.labelX - w;
  return { x0, x1: x0 + w, y0: at.labelY - LABEL_HEIGHT + 2, y1: at.labelY + 2 };
}

const overlaps = (a: Rect, b: Rect) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;

/** Gives every label a place beside its point that overlaps no label placed before it and no
 * other point, trying above-right, below-right, above-left and below-left (left first near
 * the right edge); the current cache's label is placed first. Where no place is free the
 * label keeps the first one that stays inside the chart. */
function placeLabels(points: PlacedPoint[], box: Box) {
  const taken: Rect[] = [];
  const dots: Rect[] = points.map((p) => ({ x0: p.x - DOT_RADIUS, x1: p.x + DOT_RADIUS, y0: p.y - DOT_RADIUS, y1: p.y + DOT_RADIUS }));
  const order = points.map((_, i) => i).sort((a, b) => Number(points[b].current) - Number(points[a].current) || points[a].x - points[b].x);
  for (const i of order) {
    const p = points[i];
    const nearRight = p.x > box.width * 0.75;
    const sides: ("start" | "end")[] = nearRight ? ["end", "start"] : ["start", "end"];
    const candidates = sides.flatMap((anchor) => [
      { anchor, labelX: anchor === "start" ? p.x + 6 : p.x - 6, labelY: p.y - 5 },
      { anchor, labelX: anchor === "start" ? p.x + 6 : p.x - 6, labelY: p.y + 4 + LABEL_HEIGHT },
    ]);
    const rect = (c: (typeof candidates)[number]) => labelBox(p.label, c);
    const inside = (r: Rect) => r.x0 >= 0 && r.x1 <= box.width && r.y0 >= 0 && r.y1 <= box.height - box.bottom;
    const free = (r: Rect) => inside(r) && !taken.some((t) => overlaps(t, r)) && !dots.some((d, j) => j !== i && overlaps(d, r));
    const chosen = candidates.find((c) => free(rect(c))) ?? candidates.find((c) => inside(rect(c))) ?? candidates[0];
    Object.assign(p, chosen);
    taken.push(rect(chosen));
  }
}
