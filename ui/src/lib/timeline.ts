// The memory timeline's data model: multi-series samples and cache-switch markers in,
// columnar data out (what uPlot draws), plus CSV. Bounded: past `capacity` samples the older
// half is thinned two-to-one keeping each series' larger value, so an hour of 500 ms samples
// stays smooth to draw, peaks never vanish, and the recent past keeps full resolution.

import type { MarkerKind, MemorySample, SwitchEvent } from "./bindings";
import { formatBytes } from "./format";

export interface TimelineSample {
  /** Milliseconds since the Unix epoch. */
  tMs: number;
  /** Tokens in the context at that moment. */
  tokens: number;
  /** Bytes per series name ("process", "weights", "kv total", "kv full f16", …). */
  values: Record<string, number>;
}

export interface SwitchMarker {
  tMs: number;
  tokens: number;
  from: string;
  to: string;
  beforeBytes: number;
  afterBytes: number;
  /** What happened: the owner's switch, or the pool's demotion, spill, restore or drop. */
  kind?: MarkerKind;
  /** Whose cache it was. */
  conversation?: string;
}

/** A marker as the engine sent it (a switch's reply, or the pool's marker event). */
export function markerOf(e: SwitchEvent): SwitchMarker {
  return {
    tMs: e.t_ms,
    tokens: e.tokens,
    from: e.from,
    to: e.to,
    beforeBytes: e.kv_before.used,
    afterBytes: e.kv_after.used,
    kind: e.kind,
    conversation: e.conversation,
  };
}

/** How a marker reads on the chart: the pool's say what they did to which conversation. */
export function markerLabel(m: SwitchMarker): string {
  const bytes = `${formatBytes(m.beforeBytes)}→${formatBytes(m.afterBytes)}`;
  const who = m.conversation ? ` ${m.conversation}` : "";
  switch (m.kind) {
    case "demote":
      return `demoted${who} →${m.to}  ${bytes}`;
    case "spill":
      return `spilled${who} to disk  ${bytes}`;
    case "restore":
      return `restored${who}  ${bytes}`;
    case "drop":
      return `dropped${who}  ${bytes}`;
    default:
      return `→${m.to}  ${bytes}`;
  }
}

/** How several markers at one place on the chart read: each one's label when it is alone,
 * else what the pool did to how many conversations and the bytes before and after. */
export function clusterLabel(ms: SwitchMarker[]): string {
  if (ms.length === 1) return markerLabel(ms[0]);
  const verbs: Record<string, string> = { switch: "switched", demote: "demoted", spill: "spilled", restore: "restored", drop: "dropped" };
  const counts = new Map<string, number>();
  for (const m of ms) counts.set(m.kind ?? "switch", (counts.get(m.kind ?? "switch") ?? 0) + 1);
  const what = [...counts].map(([k, n]) => `${verbs[k] ?? k} ${n}`).join(", ");
  // Each conversation's bytes once: before its first change, after its last.
  const first = new Map<string, number>();
  const last = new Map<string, number>();
  for (const m of ms) {
    const who = m.conversation ?? "";
    if (!first.has(who)) first.set(who, m.beforeBytes);
    last.set(who, m.afterBytes);
  }
  const sum = (v: Map<string, number>) => [...v.values()].reduce((a, b) => a + b, 0);
  return `${what}  ${formatBytes(sum(first))}→${formatBytes(sum(last))}`;
}

/** A group of markers drawn at one x (pixels), as the chart clusters them. */
export interface MarkerCluster {
  x: number;
  ms: SwitchMarker[];
}

/** Where one marker label goes: its text, the x its text starts at, and its row from the top. */
export interface PlacedLabel {
  label: string;
  tx: number;
  row: number;
}

/**
 * Lays the clusters' labels out over the plot (clusters sorted by x): each label right of its
 * marker, or left of it where it would pass the plot's right edge, in the first of `rows`
 * rows where it overlaps no label already placed (`gap` pixels apart). A label that fits no
 * row is merged into the last label placed, which then names both clusters (`clusterLabel`
 * of their markers together) and is laid out again: close markers read as one summary
 * instead of a stack of labels over the series.
 */
export function layoutMarkerLabels(
  clusters: MarkerCluster[],
  measure: (label: string) => number,
  bounds: { left: number; right: number },
  rows: number,
  gap: number,
): PlacedLabel[] {
  const place = (x: number, label: string) => {
    const w = measure(label);
    const right = x + 4 + w > bounds.right;
    // Left of the marker near the right edge, but never over the left axis.
    const tx = right ? Math.max(bounds.left + 2, x - 4 - w) : x + 4;
    return { label, tx, end: tx + w };
  };
  // Each placed label with the markers it names and the x of its first marker.
  const placed: { x: number; ms: SwitchMarker[]; row: number; label: string; tx: number; end: number }[] = [];
  // Where each row's last label ends: labels go left to right, so a row's last is its rightmost.
  const rowEnd: number[] = Array(Math.max(rows, 1)).fill(-Infinity);
  for (const c of clusters) {
    const one = place(c.x, clusterLabel(c.ms));
    const row = rowEnd.findIndex((end) => end + gap <= one.tx);
    if (row >= 0 || placed.length === 0) {
      const r = Math.max(row, 0);
      placed.push({ x: c.x, ms: c.ms, row: r, ...one });
      rowEnd[r] = one.end;
      continue;
    }
    const last = placed.pop()!;
    const ms = [...last.ms, ...c.ms];
    // The merged label spans both markers: anchored at the first, moved left if it runs
    // past the edge, on the row the first had.
    const merged = place(last.x, clusterLabel(ms));
    placed.push({ x: last.x, ms, row: last.row, ...merged });
    rowEnd[last.row] = merged.end;
  }
  return placed.map(({ label, tx, row }) => ({ label, tx, row }));
}

/**
 * A sample's series: the process, the weights, every conversation's KV together and by layer
 * kind and precision, then KV by conversation and tier: this chat's, the other chats held in
 * memory as they were, those demoted by the pool, and what waits on disk.
 */
export function sampleValues(s: MemorySample, focus: string): Record<string, number> {
  const values: Record<string, number> = { process: s.rss_bytes };
  if (s.weights_bytes) values.weights = s.weights_bytes;
  if (s.kv.parts.length) {
    values["kv total"] = s.kv.total_used;
    for (const p of s.kv.parts) values[`kv ${p.kind} ${p.precision}`] = p.bytes.used;
  }
  const others = s.conversations.filter((c) => c.id !== focus);
  if (others.length) {
    const sum = (cs: typeof others) => cs.reduce((n, c) => n + c.bytes, 0);
    values["kv this chat"] = s.conversations.find((c) => c.id === focus)?.bytes ?? 0;
    values["kv other chats"] = sum(others.filter((c) => c.tier === "held"));
    values["kv demoted"] = sum(others.filter((c) => c.tier === "demoted"));
    values["kv on disk"] = s.conversations.reduce((n, c) => n + c.disk_bytes, 0);
  }
  return values;
}

export type XAxis = "time" | "tokens";

export class MemoryTimeline {
  private samples: TimelineSample[] = [];
  private markerList: SwitchMarker[] = [];
  private keys: string[] = [];
  private t0: number | undefined;

  constructor(readonly capacity = 4000) {
    if (capacity < 4) throw new Error("capacity must be at least 4");
  }

  get length(): number {
    return this.samples.length;
  }

  /** Series names in order of first appearance. */
  get series(): readonly string[] {
    return this.keys;
  }

  get markers(): readonly SwitchMarker[] {
    return this.markerList;
  }

  /** Appends a sample; samples that go back in time are ignored (clock jumps, replays). */
  push(sample: TimelineSample): void {
    const last = this.samples[this.samples.length - 1];
    if (last && sample.tMs < last.tMs) return;
    if (this.t0 === undefined) this.t0 = sample.tMs;
    for (const k of Object.keys(sample.values)) if (!this.keys.includes(k)) this.keys.push(k);
    this.samples.push(sample);
    if (this.samples.length > this.capacity) this.thinOlderHalf();
  }

  mark(marker: SwitchMarker): void {
    if (this.t0 === undefined) this.t0 = marker.tMs;
    this.markerList.push(marker);
  }

  /** The x value of a time and token count on the chosen axis. */
  x(tMs: number, tokens: number, axis: XAxis): number {
    return axis === "time" ? (tMs - (this.t0 ?? tMs)) / 1000 : tokens;
  }

  /**
   * Columns for uPlot: x (seconds since the first sample, or tokens in context), then one
   * column per series in `series` order, null where a series had no value. On the tokens
   * axis x must not decrease, so only the last sample at each token count is kept.
   */
  columns(axis: XAxis = "time"): (number | null)[][] {
    let rows = this.samples;
    if (axis === "tokens") {
      const kept: TimelineSample[] = [];
      for (const s of rows) {
        const prev = kept[kept.length - 1];
        if (prev && s.tokens < prev.tokens) kept.length = 0; // a reset: start over
        if (prev && kept.length && s.tokens === kept[kept.length - 1].tokens) kept[kept.length - 1] = s;
        else kept.push(s);
      }
      rows = kept;
    }
    const xs = rows.map((s) => this.x(s.tMs, s.tokens, axis));
    return [xs, ...this.keys.map((k) => rows.map((s) => s.values[k] ?? null))];
  }

  latest(): TimelineSample | undefined {
    return this.samples[this.samples.length - 1];
  }

  peak(key: string): number {
    return this.samples.reduce((m, s) => Math.max(m, s.values[key] ?? 0), 0);
  }

  /** All samples as CSV: t_ms, tokens, one column per series; then the markers. */
  toCSV(): string {
    const head = ["t_ms", "tokens", ...this.keys].join(",");
    const rows = this.samples.map((s) => [s.tMs, s.tokens, ...this.keys.map((k) => s.values[k] ?? "")].join(","));
    const marks = this.markerList.map(
      (m) =>
        `# ${m.kind ?? "switch"},${m.tMs},${m.tokens},${csvText(m.from)},${csvText(m.to)},${m.beforeBytes},${m.afterBytes}` +
        (m.conversation ? `,${csvText(m.conversation)}` : ""),
    );
    return [head, ...rows, ...marks].join("\n") + "\n";
  }

  /** Plain data for saving in a session. */
  toJSON(): { samples: TimelineSample[]; markers: SwitchMarker[] } {
    return { samples: this.samples, markers: this.markerList };
  }

  static fromJSON(data: { samples?: TimelineSample[]; markers?: SwitchMarker[] } | undefined, capacity = 4000): MemoryTimeline {
    const t = new MemoryTimeline(capacity);
    for (const s of data?.samples ?? []) t.push(s);
    for (const m of data?.markers ?? []) t.mark(m);
    return t;
  }

  private thinOlderHalf(): void {
    const half = Math.floor(this.samples.length / 2);
    const older = this.samples.slice(0, half);
    const thinned: TimelineSample[] = [];
    for (let i = 0; i < older.length; i += 2) {
      const a = older[i];
      const b = older[i + 1];
      if (!b) {
        thinned.push(a);
        continue;
      }
      const values: Record<string, number> = { ...a.values };
      for (const [k, v] of Object.entries(b.values)) values[k] = Math.max(values[k] ?? v, v);
      thinned.push({ tMs: a.tMs, tokens: Math.max(a.tokens, b.tokens), values });
    }
    this.samples = thinned.concat(this.samples.slice(half));
  }
}

function csvText(s: string): string {
  return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}
