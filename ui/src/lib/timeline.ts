// The memory timeline's data model: samples in, columnar series out (what uPlot draws).
// Bounded: past `capacity` samples, the older half is thinned two-to-one, so an hour of
// 500 ms samples stays smooth to draw while the recent past keeps full resolution.

export interface MemoryPoint {
  /** Milliseconds since the Unix epoch. */
  tMs: number;
  rssBytes: number;
}

export class MemoryTimeline {
  private points: MemoryPoint[] = [];

  constructor(readonly capacity = 4000) {
    if (capacity < 4) throw new Error("capacity must be at least 4");
  }

  get length(): number {
    return this.points.length;
  }

  /** Appends a sample; samples that go back in time are ignored (clock jumps, replays). */
  push(point: MemoryPoint): void {
    const last = this.points[this.points.length - 1];
    if (last && point.tMs < last.tMs) return;
    this.points.push(point);
    if (this.points.length > this.capacity) this.thinOlderHalf();
  }

  /** Columns for uPlot: x in seconds since the first sample, y in bytes. */
  columns(): [number[], number[]] {
    const t0 = this.points[0]?.tMs ?? 0;
    return [this.points.map((p) => (p.tMs - t0) / 1000), this.points.map((p) => p.rssBytes)];
  }

  latest(): MemoryPoint | undefined {
    return this.points[this.points.length - 1];
  }

  peakBytes(): number {
    return this.points.reduce((m, p) => Math.max(m, p.rssBytes), 0);
  }

  private thinOlderHalf(): void {
    const half = Math.floor(this.points.length / 2);
    const older = this.points.slice(0, half);
    const thinned: MemoryPoint[] = [];
    for (let i = 0; i < older.length; i += 2) {
      const a = older[i];
      const b = older[i + 1];
      // Keep the larger of each pair so peaks never disappear from the chart.
      thinned.push(b && b.rssBytes > a.rssBytes ? { tMs: a.tMs, rssBytes: b.rssBytes } : a);
    }
    this.points = thinned.concat(this.points.slice(half));
  }
}
