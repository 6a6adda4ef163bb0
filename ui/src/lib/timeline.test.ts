import { describe, expect, it } from "vitest";
import { MemoryTimeline, clusterLabel, layoutMarkerLabels, markerLabel, sampleValues } from "./timeline";

const s = (tMs: number, tokens: number, values: Record<string, number>) => ({ tMs, tokens, values });

describe("MemoryTimeline", () => {
  it("turns samples into x plus one column per series, null where a series is missing", () => {
    const t = new MemoryTimeline();
    t.push(s(10_000, 0, { process: 100 }));
    t.push(s(10_500, 5, { process: 150, "kv full f32": 40 }));
    t.push(s(11_000, 5, { process: 120, "kv full f16": 20 }));
    expect(t.series).toEqual(["process", "kv full f32", "kv full f16"]);
    expect(t.columns("time")).toEqual([
      [0, 0.5, 1],
      [100, 150, 120],
      [null, 40, null],
      [null, null, 20],
    ]);
    expect(t.peak("process")).toBe(150);
    expect(t.latest()?.tMs).toBe(11_000);
  });

  it("plots against tokens in context, keeping the latest sample per count and restarting on reset", () => {
    const t = new MemoryTimeline();
    t.push(s(0, 1, { kv: 1 }));
    t.push(s(1, 3, { kv: 3 }));
    t.push(s(2, 3, { kv: 4 }));
    t.push(s(3, 9, { kv: 9 }));
    expect(t.columns("tokens")).toEqual([
      [1, 3, 9],
      [1, 4, 9],
    ]);
    t.push(s(4, 2, { kv: 2 }));
    expect(t.columns("tokens")).toEqual([[2], [2]]);
  });

  it("ignores samples that go back in time", () => {
    const t = new MemoryTimeline();
    t.push(s(2000, 0, { process: 1 }));
    t.push(s(1000, 0, { process: 2 }));
    expect(t.length).toBe(1);
  });

  it("keeps switch markers with their before/after bytes, in CSV too", () => {
    const t = new MemoryTimeline();
    t.push(s(1000, 4, { "kv total": 800 }));
    t.mark({ tMs: 1500, tokens: 4, from: "f32", to: "f16", beforeBytes: 800, afterBytes: 400 });
    t.push(s(2000, 4, { "kv total": 400 }));
    expect(t.markers).toHaveLength(1);
    expect(t.x(t.markers[0].tMs, 4, "time")).toBe(0.5);
    expect(t.toCSV()).toBe("t_ms,tokens,kv total\n1000,4,800\n2000,4,400\n# switch,1500,4,f32,f16,800,400\n");
    const back = MemoryTimeline.fromJSON(JSON.parse(JSON.stringify(t.toJSON())));
    expect(back.columns()).toEqual(t.columns());
    expect(back.markers).toEqual(t.markers);
  });

  it("stays bounded over an hour of 500 ms samples and keeps every series' peak", () => {
    const t = new MemoryTimeline(1000);
    const n = 7200;
    for (let i = 0; i < n; i++) {
      t.push(s(i * 500, i, { process: i === 1234 ? 9_999 : 100 + (i % 7), kv: i === 77 ? 5_555 : i }));
    }
    expect(t.length).toBeLessThanOrEqual(1000);
    expect(t.peak("process")).toBe(9_999);
    expect(t.peak("kv")).toBe(n - 1);
    const cols = t.columns();
    expect(Math.max(...(cols[2] as number[]))).toBe(n - 1);
    expect((cols[2] as number[]).includes(5_555)).toBe(true);
    const x = cols[0] as number[];
    for (let i = 1; i < x.length; i++) expect(x[i]).toBeGreaterThan(x[i - 1]);
    expect(t.latest()?.tMs).toBe((n - 1) * 500);
  });
});

describe("conversations and the pool's markers", () => {
  const conv = (id: string, tier: "held" | "demoted" | "on_disk" | "dropped", bytes: number, disk = 0) => ({
    id,
    tier,
    tokens: 10,
    spec: "f16",
    bytes,
    disk_bytes: disk,
    busy: false,
    last_used_ms: 0,
  });
  const sample = (conversations: ReturnType<typeof conv>[]) =>
    ({
      t_ms: 1,
      tokens_in_context: 0,
      kv: { by_kind: {}, by_precision: {}, parts: [], layers: [], total_used: 0, total_allocated: 0 },
      weights_bytes: 5,
      rss_bytes: 9,
      cache_spec: "f16",
      conversations,
    }) as unknown as import("./bindings").MemorySample;

  it("splits KV by this chat, the others held, the demoted and what is on disk", () => {
    const v = sampleValues(sample([conv("s-1", "held", 100), conv("s-2", "held", 40), conv("s-3", "demoted", 7, 3), conv("s-4", "on_disk", 0, 20)]), "s-1");
    expect([v["kv this chat"], v["kv other chats"], v["kv demoted"], v["kv on disk"]]).toEqual([100, 40, 7, 23]);
    // One conversation alone adds no series: the chart stays as it was.
    expect(Object.keys(sampleValues(sample([conv("s-1", "held", 100)]), "s-1"))).toEqual(["process", "weights"]);
  });

  it("labels each marker with what the pool did to whom", () => {
    const m = (kind: "switch" | "demote" | "spill" | "restore" | "drop") =>
      markerLabel({ tMs: 0, tokens: 1, from: "f16", to: kind === "spill" ? "disk" : "k4v3+qw@all", beforeBytes: 2048, afterBytes: 512, kind, conversation: "s-2" });
    expect(m("switch")).toBe("→k4v3+qw@all  2.00 KiB→512 B");
    expect(m("demote")).toBe("demoted s-2 →k4v3+qw@all  2.00 KiB→512 B");
    expect(m("spill")).toBe("spilled s-2 to disk  2.00 KiB→512 B");
  });
});

describe("markers at one place", () => {
  it("read as what the pool did to how many, with the bytes before and after", () => {
    const m = (kind: "demote" | "spill", conversation: string, beforeBytes: number, afterBytes: number) => ({ tMs: 0, tokens: 0, from: "f16", to: "x", beforeBytes, afterBytes, kind, conversation });
    expect(clusterLabel([m("demote", "a", 4096, 1024)])).toBe("demoted a →x  4.00 KiB→1.00 KiB");
    // a demoted then spilled, b demoted: bytes counted once each, before the first and after the last.
    expect(clusterLabel([m("demote", "a", 4096, 1024), m("demote", "b", 2048, 512), m("spill", "a", 1024, 0)])).toBe(
      "demoted 2, spilled 1  6.00 KiB→512 B",
    );
  });

  describe("labels laid out", () => {
    const sw = (to: string, beforeBytes: number, afterBytes: number) => ({ tMs: 0, tokens: 0, from: "f16", to, beforeBytes, afterBytes });
    // Ten pixels per character.
    const measure = (label: string) => 10 * label.length;
    const bounds = { left: 0, right: 1000 };

    it("put apart labels on the first row, right of their markers", () => {
      const placed = layoutMarkerLabels([{ x: 10, ms: [sw("a", 1, 2)] }, { x: 500, ms: [sw("b", 2, 3)] }], measure, bounds, 2, 4);
      expect(placed.map((p) => [p.tx, p.row])).toEqual([
        [14, 0],
        [504, 0],
      ]);
      expect(placed[1].label).toBe(markerLabel(sw("b", 2, 3)));
    });

    it("stagger close labels, then merge what fits no row into one summary", () => {
      const clusters = [100, 120, 140, 160].map((x, i) => ({ x, ms: [sw(`t${i}`, 1024 * (4 - i), 1024 * (3 - i))] }));
      const placed = layoutMarkerLabels(clusters, measure, bounds, 2, 4);
      expect(placed.map((p) => p.row)).toEqual([0, 1]);
      // The third and fourth fit no row: merged into the second, whose label names all three.
      expect(placed[1].label).toBe(clusterLabel(clusters.slice(1).flatMap((c) => c.ms)));
      expect(placed[1].tx).toBe(124);
      // No two labels of a row overlap.
      for (const row of [0, 1]) {
        const spans = placed.filter((p) => p.row === row).map((p) => [p.tx, p.tx + measure(p.label)]);
        spans.slice(1).forEach(([start], i) => expect(start).toBeGreaterThanOrEqual(spans[i][1]));
      }
    });

    it("end a label left of its marker near the right edge, never over the left axis", () => {
      const [p] = layoutMarkerLabels([{ x: 990, ms: [sw("q8_0", 1, 2)] }], measure, bounds, 2, 4);
      expect(p.tx + measure(p.label)).toBe(986);
      const [q] = layoutMarkerLabels([{ x: 30, ms: [sw("q8_0", 1, 2)] }], measure, { left: 20, right: 60 }, 2, 4);
      expect(q.tx).toBe(22);
    });
  });
});
