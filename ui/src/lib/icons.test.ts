/// <reference types="vite/client" />
import { render } from "svelte/server";
import { describe, expect, it } from "vitest";
import Icon from "./Icon.svelte";
import { ICONS, type IconName } from "./icons";

// Every component's source, by path relative to this folder.
const SOURCES = import.meta.glob("../**/*.svelte", { query: "?raw", import: "default", eager: true }) as Record<string, string>;

describe("icons", () => {
  it("render as inline SVG paths, with no text a font would have to draw", () => {
    for (const name of Object.keys(ICONS) as IconName[]) {
      const { body } = render(Icon, { props: { name, size: 20 } });
      expect(body, name).toMatch(/^(<!--[^>]*-->)?<svg [^>]*viewBox="0 0 24 24"[^>]*width="20"[^>]*height="20"/);
      const paths = [...body.matchAll(/<path d="([^"]+)"/g)].map((m) => m[1]);
      expect(paths.length, name).toBe(ICONS[name].paths.length);
      for (const d of paths) expect(d, name).toMatch(/^M[\d\s.,\-MLHVACZmlhvacz]+$/);
      expect(body.replace(/<[^>]*>/g, "").trim(), name).toBe("");
    }
  });

  it("are stroked, or filled when the shape says so", () => {
    expect(render(Icon, { props: { name: "plus" } }).body).toMatch(/fill="none"[^>]*stroke="currentColor"/);
    expect(render(Icon, { props: { name: "stop" } }).body).toMatch(/fill="currentColor"[^>]*stroke="none"/);
  });

  it("replace every symbol glyph in the components' markup", () => {
    // Arrows, technical symbols, geometric shapes, dingbats, fullwidth forms and emoji are
    // icons drawn by fonts: a machine without the font shows a box (＋ did, on a bare Debian).
    const glyph = /[\u2190-\u21ff\u2300-\u23ff\u25a0-\u25ff\u2600-\u27bf\uff00-\uffef]|[\u{1f000}-\u{1faff}]/u;
    const files = Object.entries(SOURCES);
    expect(files.length).toBeGreaterThan(8);
    for (const [f, source] of files) {
      const markup = source
        // Scripts and styles blanked line for line, so the line numbers stay true.
        .replace(/<script[\s\S]*?<\/script>|<style[\s\S]*?<\/style>/g, (block) => block.replace(/[^\n]/g, ""));
      markup.split("\n").forEach((line, i) => {
        expect(glyph.test(line), `${f}:${i + 1}: ${line.trim()}`).toBe(false);
      });
    }
  });
});
