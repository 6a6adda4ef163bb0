// The real app, built and launched under Xvfb: window, command round trip, memory events.

import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { ARTIFACTS, invokeInPage, launchApp } from "./driver.mjs";

let app;

before(async () => {
  app = await launchApp();
});

after(async () => {
  await app?.close();
});

test("the window is titled KV Lab and shows the engine status", async () => {
  const { browser } = app;
  assert.equal(await browser.getTitle(), "KV Lab");
  const status = await browser.$('[data-testid="engine-status"]');
  await status.waitForDisplayed({ timeout: 15_000 });
  assert.equal(await status.getText(), "no model loaded");
});

test("system_info round-trips through the Rust command", async () => {
  const { browser } = app;
  const reply = await invokeInPage(browser, "system_info");
  assert.equal(reply.ok, true, JSON.stringify(reply.error));
  // Both read the kernel's MemTotal; allow for rounding to KiB.
  assert.ok(Math.abs(reply.value.total_memory_bytes - os.totalmem()) <= 4096, "total memory");
  assert.equal(reply.value.cpu_cores, os.availableParallelism());
  const cores = await browser.$('[data-testid="cpu-cores"]');
  await cores.waitForDisplayed({ timeout: 10_000 });
  assert.equal(await cores.getText(), String(os.availableParallelism()));
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
  await browser.saveScreenshot(path.join(ARTIFACTS, "main-window.png"));
});
