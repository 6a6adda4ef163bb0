// The real app, built and launched under Xvfb: window, command round trip, memory events,
// colours that follow the system's theme.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { invokeInPage, launchApp } from "./driver.mjs";

let app;

before(async () => {
  // KVLAB_THEME empty: the system's theme, whatever the shell that runs the tests says.
  app = await launchApp({ env: { KVLAB_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-")), KVLAB_THEME: "" } });
});

after(async () => {
  await app?.close();
});

test("the window is titled KV Lab and shows the engine status", async () => {
  const { browser } = app;
  assert.equal(await browser.getTitle(), "KV Lab");
  const status = await browser.$('[data-testid="engine-status"]');
  await status.waitForDisplayed({ timeout: 15_000 });
  const states = ["starting", "no_model", "loading", "ready", "generating", "failed"];
  assert.ok(states.includes(await status.getAttribute("data-state")));
});

test("system_info round-trips through the Rust command", async () => {
  const { browser } = app;
  const reply = await invokeInPage(browser, "system_info");
  assert.equal(reply.ok, true, JSON.stringify(reply.error));
  // Both read the kernel's MemTotal; allow for rounding to KiB.
  assert.ok(Math.abs(reply.value.total_memory_bytes - os.totalmem()) <= 4096, "total memory");
  assert.equal(reply.value.cpu_cores, os.availableParallelism());
  assert.match(reply.value.data_dir, /kvlab-e2e-/);
});

test("memory samples arrive as events about every 500 ms", async () => {
  const { browser } = app;
  const counter = await browser.$('[data-testid="sample-count"]');
  const count = async () => Number(await counter.getAttribute("data-count"));
  const start = await count();
  await browser.waitUntil(async () => (await count()) >= start + 2, {
    timeout: 10_000,
    timeoutMsg: "fewer than two memory-sample events in 10 s",
  });
});

test("without KVLAB_THEME the colours follow the system's light or dark preference", async () => {
  const { browser } = app;
  const seen = await browser.execute(() => ({
    forced: document.documentElement.dataset.theme ?? null,
    light: window.matchMedia("(prefers-color-scheme: light)").matches,
    bg: getComputedStyle(document.documentElement).getPropertyValue("--bg").trim(),
  }));
  assert.equal(seen.forced, null);
  assert.equal(seen.bg, seen.light ? "#f5f6f8" : "#12151b", JSON.stringify(seen));
});
