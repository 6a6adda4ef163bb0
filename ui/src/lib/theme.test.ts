/// <reference types="vite/client" />
import { describe, expect, it } from "vitest";
import CSS from "../app.css?raw";
import { chartColors, parseTheme, seriesColor } from "./theme";

/** The custom properties declared in the first block that follows `selector`. */
function block(selector: string): Record<string, string> {
  const at = CSS.indexOf(selector);
  expect(at, selector).toBeGreaterThanOrEqual(0);
  const open = CSS.indexOf("{", at);
  const body = CSS.slice(open + 1, CSS.indexOf("}", open));
  return Object.fromEntries([...body.matchAll(/(--[\w-]+):\s*([^;]+);/g)].map((m) => [m[1], m[2].trim()]));
}

const dark = block(":root {");
const light = block(':root:not([data-theme="dark"])');
const forcedLight = block(':root[data-theme="light"]');

function luminance(hex: string): number {
  const h = hex.replace("#", "");
  const rgb = [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16) / 255);
  const [r, g, b] = rgb.map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
/** Distance between two colours in RGB space (0 to 441). */
function distance(a: string, b: string): number {
  const rgb = (hex: string) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const [x, y] = [rgb(a), rgb(b)];
  return Math.hypot(x[0] - y[0], x[1] - y[1], x[2] - y[2]);
}
function contrast(a: string, b: string): number {
  const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p);
  return (x + 0.05) / (y + 0.05);
}

describe("themes", () => {
  it("define every colour in both schemes, and the forced light theme equals the system's", () => {
    expect(Object.keys(dark).length).toBeGreaterThan(30);
    expect(Object.keys(light).sort()).toEqual(Object.keys(dark).sort());
    expect(forcedLight).toEqual(light);
  });

  it("keep text and chart lines readable on their backgrounds in both schemes", () => {
    for (const [name, t] of [["dark", dark], ["light", light]] as const) {
      expect(contrast(t["--text"], t["--bg"]), `${name} text`).toBeGreaterThanOrEqual(7);
      expect(contrast(t["--muted"], t["--panel"]), `${name} muted`).toBeGreaterThanOrEqual(4.5);
      expect(contrast(t["--on-accent"], t["--accent"]), `${name} primary button`).toBeGreaterThanOrEqual(4.5);
      expect(contrast(t["--danger"], t["--panel"]), `${name} errors`).toBeGreaterThanOrEqual(4.5);
      // Lines and markers are graphics: 3:1 against the chart's background (WCAG 1.4.11).
      for (const k of Object.keys(t).filter((k) => k.startsWith("--chart-") && k !== "--chart-grid")) {
        expect(contrast(t[k], t["--panel"]), `${name} ${k}`).toBeGreaterThanOrEqual(3);
      }
      // The switch marker stands apart from every line it crosses, and the lines usually
      // drawn together (process, weights, KV total, the first four KV parts) from each other.
      const lines = ["--chart-process", "--chart-weights", "--chart-kv", ...[1, 2, 3, 4, 5, 6].map((i) => `--chart-kv-${i}`)];
      for (const k of lines) expect(distance(t[k], t["--chart-marker"]), `${name} marker vs ${k}`).toBeGreaterThanOrEqual(90);
      const together = lines.slice(0, 7);
      for (const [i, a] of together.entries()) {
        for (const b of together.slice(i + 1)) expect(distance(t[a], t[b]), `${name} ${a} vs ${b}`).toBeGreaterThanOrEqual(60);
      }
    }
  });

  it("are forced only by light or dark", () => {
    expect(parseTheme("light")).toBe("light");
    expect(parseTheme(" DARK ")).toBe("dark");
    expect(parseTheme("auto")).toBeNull();
    expect(parseTheme(null)).toBeNull();
  });

  it("give the chart the stylesheet's colours, KV parts in turn", () => {
    const c = chartColors((name) => light[name] ?? "");
    expect(c.marker).toBe(light["--chart-marker"]);
    expect(c.labelBack).toBe(light["--panel"]);
    expect(seriesColor("process", 0, c)).toBe(light["--chart-process"]);
    expect(seriesColor("kv total", 0, c)).toBe(light["--chart-kv"]);
    expect(seriesColor("kv full f16", 0, c)).toBe(light["--chart-kv-1"]);
    expect(seriesColor("kv sliding tq3.5", 7, c)).toBe(light["--chart-kv-2"]);
    // A missing property falls back to the dark palette rather than to no colour.
    expect(chartColors(() => "").axis).toBe("#8b95a5");
  });
});
