// The app's icons as SVG path data on a 24 × 24 grid, drawn with the current text colour:
// no icon font and no remote file, so every icon renders on a machine with any fonts (and
// the CSP, which forbids remote resources, has nothing to block). Icon.svelte draws them.

export interface IconShape {
  /** Path data, each drawn as its own <path>. */
  paths: string[];
  /** Filled with the text colour instead of stroked. */
  fill?: boolean;
}

export const ICONS = {
  plus: { paths: ["M12 5v14", "M5 12h14"] },
  "chevron-down": { paths: ["M6 9l6 6 6-6"] },
  "chevron-right": { paths: ["M9 6l6 6-6 6"] },
  refresh: { paths: ["M20 12a8 8 0 1 1-2.34-5.66L20 8.7", "M20 3.5v5.2h-5.2"] },
  paperclip: {
    paths: ["M21.44 11.05l-9.19 9.19a6 6 0 0 1-8.49-8.49l9.19-9.19a4 4 0 0 1 5.66 5.66l-9.2 9.19a2 2 0 0 1-2.83-2.83l8.49-8.48"],
  },
  close: { paths: ["M18 6L6 18", "M6 6l12 12"] },
  check: { paths: ["M5 12.5l4.5 4.5L19 7.5"] },
  pencil: { paths: ["M12 20h9", "M16.5 3.5a2.12 2.12 0 0 1 3 3L7 19l-4 1 1-4z"] },
  stop: { paths: ["M7 7h10v10H7z"], fill: true },
  document: { paths: ["M14 2H6a2 2 0 0 0-2 2v16a2 2 0 0 0 2 2h12a2 2 0 0 0 2-2V8z", "M14 2v6h6", "M16 13H8", "M16 17H8", "M10 9H8"] },
  switch: { paths: ["M4 7h13", "M14 3.5L17.5 7 14 10.5", "M20 17H7", "M10 13.5L6.5 17l3.5 3.5"] },
} satisfies Record<string, IconShape>;

export type IconName = keyof typeof ICONS;
