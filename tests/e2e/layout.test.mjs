// The main window at its default size (1280×800) and at 1440×900, in the dark and the light
// theme (KVLAB_WINDOW_SIZE and KVLAB_THEME, one launch each, each on a fresh data folder, so
// each is a first run on the offline base model). Checked on real geometry: the memory
// timeline's canvas lies inside the viewport beside the chat; a switch started by a first-run
// starter shows its marker while the answer streams; a switch through the precision buttons
// adds a marker that is drawn on the canvas, with nothing scrolled. Screenshots go to the
// artifacts folder as first-run-WxH-THEME.png, switch-mid-answer-1280x800-dark.png and
// layout-WxH-THEME.png.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";
import { ARTIFACTS, launchApp, setNumber, waitForReady } from "./driver.mjs";

const BACKGROUND = { dark: "#12151b", light: "#f5f6f8" };
let app;

const $ = (sel) => app.browser.$(sel);
const shot = (name) => app.browser.saveScreenshot(path.join(ARTIFACTS, name));

async function launch(width, height, theme) {
  await app?.close();
  app = await launchApp({
    env: {
      KVLAB_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-layout-")),
      KVLAB_WINDOW_SIZE: `${width}x${height}`,
      KVLAB_THEME: theme,
    },
  });
  await waitForReady(app.browser);
  // The card arrives with the load's answer; the empty state follows it.
  await app.browser.waitUntil(async () => (await (await $('[data-testid="empty-state"]')).getAttribute("data-kind")) === "base", {
    timeout: 10_000,
    timeoutMsg: "the empty state does not introduce the base model",
  });
}

after(async () => {
  await app?.close();
});

/** What the page looks like now: viewport, boxes, every scroll offset, the chart's markers. */
function geometry() {
  return app.browser.execute(() => {
    const box = (el) => {
      const b = el.getBoundingClientRect();
      return { left: b.left, top: b.top, right: b.right, bottom: b.bottom, width: b.width, height: b.height };
    };
    const chart = document.querySelector('[data-testid="memory-chart"]');
    const canvas = chart.querySelector("canvas");
    const scrolled = [...document.querySelectorAll("*")]
      .filter((e) => e.scrollTop || e.scrollLeft)
      .map((e) => `${e.tagName.toLowerCase()}.${e.className}:${e.scrollTop},${e.scrollLeft}`);
    const root = getComputedStyle(document.documentElement);
    return {
      vw: window.innerWidth,
      vh: window.innerHeight,
      scroll: [`window:${window.scrollX},${window.scrollY}`, ...scrolled],
      canvas: box(canvas),
      canvasPixels: { width: canvas.width, height: canvas.height },
      messages: box(document.querySelector('[data-testid="messages"]')),
      markers: Number(chart.dataset.markers),
      visibleMarkers: Number(chart.dataset.visibleMarkers ?? 0),
      markerX: (chart.dataset.markerX ?? "").split(",").filter(Boolean).map(Number),
      theme: document.documentElement.dataset.theme ?? null,
      bg: root.getPropertyValue("--bg").trim(),
      markerColor: root.getPropertyValue("--chart-marker").trim(),
    };
  });
}

/** For each drawn marker, how many canvas pixels in its column have the marker's colour. */
function markerPixels() {
  return app.browser.execute(() => {
    const chart = document.querySelector('[data-testid="memory-chart"]');
    const canvas = chart.querySelector("canvas");
    const ctx = canvas.getContext("2d");
    const hex = getComputedStyle(document.documentElement).getPropertyValue("--chart-marker").trim().slice(1);
    const want = [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16));
    return (chart.dataset.markerX ?? "")
      .split(",")
      .filter(Boolean)
      .map((x) => {
        const d = ctx.getImageData(Number(x) - 1, 0, 3, canvas.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) {
          if (d[i + 3] > 160 && want.every((c, k) => Math.abs(d[i + k] - c) <= 48)) n += 1;
        }
        return n;
      });
  });
}

function assertInside(box, g, what) {
  assert.ok(box.width > 200 && box.height > 120, `${what} is ${box.width}×${box.height}`);
  assert.ok(box.left >= 0 && box.top >= 0 && box.right <= g.vw && box.bottom <= g.vh, `${what} ${JSON.stringify(box)} outside the ${g.vw}×${g.vh} viewport`);
}

/** The window, the theme and the first-run layout every launch must show. */
async function checkLaunch(width, height, theme) {
  const g = await geometry();
  assert.deepEqual([g.vw, g.vh], [width, height], "the window's viewport");
  assert.equal(g.theme, theme);
  assert.equal(g.bg, BACKGROUND[theme], `the ${theme} background`);
  assertInside(g.canvas, g, "the timeline's canvas");
  // Side by side: the chart is right of the chat, and they share most of their height band.
  assert.ok(g.canvas.left >= g.messages.right, `chart at x=${g.canvas.left}, chat ends at x=${g.messages.right}`);
  assert.ok(g.messages.width >= 500, `the chat is ${g.messages.width} px wide`);
  assert.ok(g.canvas.top < g.messages.top + g.messages.height / 2, "the chart sits in the upper half, beside the chat");
  const empty = await $('[data-testid="empty-state"]');
  assert.match(await empty.getText(), /is a small base model/);
  assert.match(await empty.getText(), /continues text/);
  assert.equal(await (await $('[data-testid="starter-document"]')).isDisplayed(), true);
  assert.equal(await (await $('[data-testid="starter-switch"]')).isDisplayed(), true);
  await shot(`first-run-${width}x${height}-${theme}.png`);
}

/** Runs the mid-answer switch starter to the end; resolves with what was seen while streaming. */
async function runSwitchStarter() {
  // Greedy: at the default temperature the time-seeded answer could end before the switch.
  await setNumber(app.browser, "temperature", 0);
  await setNumber(app.browser, "max-tokens", 64);
  await (await $('[data-testid="starter-switch"]')).click();
  const answer = await $('[data-testid="message"][data-role="model"]');
  await answer.waitForExist({ timeout: 10_000 });
  let during = null;
  await app.browser.waitUntil(
    async () => {
      const g = await geometry();
      if ((await answer.getAttribute("data-streaming")) !== "true") return true;
      if (g.visibleMarkers >= 1 && !during) during = g;
      return during !== null;
    },
    { timeout: 180_000, interval: 50, timeoutMsg: "the answer never streamed" },
  );
  return { answer, during };
}

async function waitDone(answer) {
  await app.browser.waitUntil(async () => (await answer.getAttribute("data-streaming")) === "false", {
    timeout: 180_000,
    timeoutMsg: "the answer did not finish",
  });
}

describe("the default window, 1280×800, dark", () => {
  test("opens at 1280×800 with the timeline beside the chat and the first run explained", async () => {
    await launch(1280, 800, "dark");
    await checkLaunch(1280, 800, "dark");
  });

  test("the switch starter marks the timeline while its answer streams", async () => {
    const { answer, during } = await runSwitchStarter();
    assert.ok(during, "no marker was drawn while the answer streamed");
    assert.equal(during.markers, 1);
    assertInside(during.canvas, during, "the timeline's canvas while streaming");
    const kv = await (await $('[data-testid="latest-kv"]')).getText();
    assert.match(kv, /^\d+(\.\d+)? (B|KiB|MiB)$/);
    assert.notEqual(kv, "0 B");
    await shot("switch-mid-answer-1280x800-dark.png");
    await waitDone(answer);
    assert.match(await (await answer.$('[data-testid="stats"]')).getText(), /cache k4v3\+qw\b/);
  });

  test("a precision switch through the buttons adds a visible marker without scrolling", async () => {
    const before = await geometry();
    assertInside(before.canvas, before, "the timeline's canvas");
    const button = await $('[data-testid="precision-f16"]');
    const b = await app.browser.execute((el) => {
      const r = el.getBoundingClientRect();
      return { left: r.left, top: r.top, right: r.right, bottom: r.bottom };
    }, button);
    assert.ok(b.top >= 0 && b.bottom <= before.vh && b.left >= 0 && b.right <= before.vw, `FP16 button ${JSON.stringify(b)} is off screen`);
    await button.click();
    await app.browser.waitUntil(async () => (await geometry()).visibleMarkers === before.visibleMarkers + 1, {
      timeout: 30_000,
      timeoutMsg: `still ${before.visibleMarkers} markers drawn after the switch`,
    });
    const afterSwitch = await geometry();
    assert.equal(afterSwitch.markers, before.markers + 1);
    assert.deepEqual(afterSwitch.scroll, before.scroll, "something scrolled");
    assert.deepEqual(afterSwitch.canvas, before.canvas, "the chart moved");
    // The marker is on the canvas inside the viewport, drawn in the marker colour.
    const x = afterSwitch.markerX.at(-1);
    const css = afterSwitch.canvas.left + (x * afterSwitch.canvas.width) / afterSwitch.canvasPixels.width;
    assert.ok(css > afterSwitch.canvas.left && css < Math.min(afterSwitch.canvas.right, afterSwitch.vw), `marker at x=${css}`);
    const pixels = await markerPixels();
    assert.equal(pixels.length, afterSwitch.visibleMarkers);
    for (const [i, n] of pixels.entries()) assert.ok(n >= 20, `marker ${i} has ${n} pixels of ${afterSwitch.markerColor}`);
    await app.browser.pause(1200);
    await shot("layout-1280x800-dark.png");
  });
});

for (const [width, height, theme] of [
  [1280, 800, "light"],
  [1440, 900, "dark"],
  [1440, 900, "light"],
]) {
  test(`${width}×${height}, ${theme}: the timeline beside the chat, a switch marked mid-answer`, async () => {
    await launch(width, height, theme);
    await checkLaunch(width, height, theme);
    const { answer, during } = await runSwitchStarter();
    await waitDone(answer);
    assert.ok(during, "no marker was drawn while the answer streamed");
    const g = await geometry();
    assertInside(g.canvas, g, "the timeline's canvas");
    assert.equal(g.visibleMarkers, 1);
    const pixels = await markerPixels();
    assert.ok(pixels[0] >= 20, `the marker has ${pixels[0]} pixels of ${g.markerColor}`);
    await app.browser.pause(1200);
    await shot(`layout-${width}x${height}-${theme}.png`);
  });
}
