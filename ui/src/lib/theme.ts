// Light and dark: the system's choice (prefers-color-scheme) unless KVLAB_THEME forces one,
// which the app reports through the `ui_theme` command and the UI applies as `data-theme` on
// <html> (app.css honours it). The memory chart draws on a canvas, so it reads its colours
// from the CSS custom properties at draw time and redraws when the theme changes.

export type Theme = "light" | "dark";

/** A forced theme from its setting ("light" or "dark", any case); anything else is none. */
export function parseTheme(value: unknown): Theme | null {
  const v = typeof value === "string" ? value.trim().toLowerCase() : "";
  return v === "light" || v === "dark" ? v : null;
}

/** Forces `theme` over the system's, or follows the system again with null. */
export function forceTheme(theme: Theme | null, root: HTMLElement = document.documentElement): void {
  if (theme) root.dataset.theme = theme;
  else delete root.dataset.theme;
}

/** The theme in effect now: the forced one, else the system's. */
export function currentTheme(): Theme {
  const forced = parseTheme(document.documentElement.dataset.theme);
  if (forced) return forced;
  return window.matchMedia?.("(prefers-color-scheme: light)").matches ? "light" : "dark";
}

/** Calls `cb` whenever the theme in effect may have changed; returns the unsubscribe. */
export function onThemeChange(cb: () => void): () => void {
  const media = window.matchMedia?.("(prefers-color-scheme: light)");
  media?.addEventListener("change", cb);
  const observer = new MutationObserver(cb);
  observer.observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
  return () => {
    media?.removeEventListener("change", cb);
    observer.disconnect();
  };
}

/** The chart's colours as the stylesheet defines them for the theme in effect. */
export interface ChartColors {
  axis: string;
  grid: string;
  marker: string;
  /** Behind a marker's label, so the series it crosses never run through its text. */
  labelBack: string;
  process: string;
  weights: string;
  kv: string;
  /** One colour per KV series by kind and precision, used in turn. */
  kvParts: string[];
  font: string;
}

/** Reads the --chart-* custom properties (`read` is getComputedStyle(root).getPropertyValue). */
export function chartColors(read: (name: string) => string): ChartColors {
  const v = (name: string, fallback: string) => read(name).trim() || fallback;
  return {
    axis: v("--chart-axis", "#8b95a5"),
    grid: v("--chart-grid", "#262c36"),
    marker: v("--chart-marker", "#e0af68"),
    labelBack: v("--panel", "#1a1f27"),
    process: v("--chart-process", "#8b95a5"),
    weights: v("--chart-weights", "#bb9af7"),
    kv: v("--chart-kv", "#7aa2f7"),
    kvParts: [1, 2, 3, 4, 5, 6].map((i) => v(`--chart-kv-${i}`, "#9ece6a")),
    font: v("--text", "#e6e9ef"),
  };
}

/** The colour of the series `name`; KV parts take the palette in turn (`kvIndex`). */
export function seriesColor(name: string, kvIndex: number, c: ChartColors): string {
  if (name === "process") return c.process;
  if (name === "weights") return c.weights;
  if (name === "kv total") return c.kv;
  return c.kvParts[kvIndex % c.kvParts.length];
}
