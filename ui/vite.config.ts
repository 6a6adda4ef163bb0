import { defineConfig } from "vitest/config";
import { svelte } from "@sveltejs/vite-plugin-svelte";

// Tauri serves the built files from ui/dist; the dev server is only for `tauri dev`.
export default defineConfig({
  plugins: [svelte()],
  clearScreen: false,
  server: { port: 5173, strictPort: true },
  build: { target: "es2022", outDir: "dist", emptyOutDir: true },
  // css.include: theme.test.ts reads app.css as text (?raw), which vitest otherwise empties.
  test: { include: ["src/**/*.test.ts"], environment: "node", css: { include: [/app\.css/] } },
});
