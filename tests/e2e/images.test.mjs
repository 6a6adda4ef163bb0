// Images in the real app on the tiny Gemma 4 with its vision tower (the engine's
// fixtures/vision/e, random weights, with the image vocabulary and the Jul 14 template in a
// folder of its own): a dropped image shows its thumbnail, its tokens and what it costs in KV
// under each preset before sending; it is sent, the answer streams, and the message shows
// it; an image the reader cannot decode is refused with a notice, the chat untouched.

import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { ARTIFACTS, dropFile, launchApp, waitForReady } from "./driver.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const FIXTURES = path.join(HERE, "..", "..", "crates", "engine", "tests", "fixtures");
const DATA_DIR = mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-images-"));
let app;

const $ = (sel) => app.browser.$(sel);
const $$ = (sel) => app.browser.$$(sel);
const shot = (name) => app.browser.saveScreenshot(path.join(ARTIFACTS, name));

/** The vision fixture in a folder of its own, its context lengthened to 2048 tokens. */
function visionModel() {
  const dir = mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-vision-"));
  const src = path.join(FIXTURES, "vision", "e");
  for (const f of ["model.safetensors", "preprocessor_config.json"]) copyFileSync(path.join(src, f), path.join(dir, f));
  const config = JSON.parse(readFileSync(path.join(src, "config.json"), "utf8"));
  config.text_config.max_position_embeddings = 2048;
  writeFileSync(path.join(dir, "config.json"), JSON.stringify(config));
  copyFileSync(path.join(FIXTURES, "vision", "tokenizer.json"), path.join(dir, "tokenizer.json"));
  copyFileSync(path.join(FIXTURES, "templates", "g4_e2b_jul14.jinja"), path.join(dir, "chat_template.jinja"));
  return dir;
}

const drop = (name, bytes) => dropFile(app.browser, name, bytes);

before(async () => {
  app = await launchApp({ env: { KVLAB_DATA_DIR: DATA_DIR, KVLAB_DEFAULT_MODEL: visionModel() } });
});

after(async () => {
  await app?.close();
});

test("a dropped image shows its thumbnail, tokens and KV cost, is sent, and the answer streams", async () => {
  await waitForReady(app.browser);
  const vision = await $('[data-testid="card-vision"]');
  await vision.waitForDisplayed({ timeout: 10_000 });
  assert.match(await vision.getText(), /^up to 70 tokens each · tower /);
  const image = readFileSync(path.join(FIXTURES, "vision", "images", "model.png"));

  // A file the reader cannot decode: refused, nothing attached.
  await drop("broken.png", image.subarray(0, image.length >> 1));
  const notice = await $('[data-testid="doc-notice"]');
  await notice.waitForDisplayed({ timeout: 20_000 });
  assert.match(await notice.getText(), /broken\.png: .*(cannot read|image)/i);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);

  await drop("model.png", image);
  const att = await $('[data-testid="attachment"][data-kind="image"]');
  await att.waitForDisplayed({ timeout: 20_000 });
  // 50×38 read at 108×84 by the fixture's processor (patch 4, pooling 3, 70 soft tokens at
  // most): 63 soft tokens and the two markers.
  assert.equal(Number(await att.getAttribute("data-tokens")), 65);
  assert.match(await (await att.$('[data-testid="doc-summary"]')).getText(), /50×38, read at 108×84 · 65 tokens/);
  const thumb = await att.$('[data-testid="attachment-thumbnail"]');
  assert.match(await thumb.getAttribute("src"), /^data:image\/png;base64,/);
  const costs = await (await att.$('[data-testid="doc-costs"]')).getText();
  assert.match(costs, /FP16 \d/);
  await shot("image-attached.png");

  const box = await $('[data-testid="composer"]');
  await box.click();
  await box.setValue("What is in the picture?");
  await app.browser.keys("Enter");
  await app.browser.waitUntil(
    async () => {
      const a = await $$('[data-testid="message"][data-role="model"]');
      if (a.length !== 1) return false;
      return (await a[0].$('[data-testid="stats"]').isExisting()) || (await a[0].$('[data-testid="message-error"]').isExisting());
    },
    { timeout: 120_000, timeoutMsg: "the answer never finished" },
  );
  const error = await $('[data-testid="message"][data-role="model"] [data-testid="message-error"]');
  assert.equal(await error.isExisting(), false, `the answer failed: ${(await error.isExisting()) ? await error.getText() : ""}`);
  const shown = await $('[data-testid="message-images"] img');
  assert.equal(await shown.getAttribute("alt"), "model.png");
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);
  // The memory panel names the images' share of the context: the image's 63 soft tokens.
  const share = await $('[data-testid="image-tokens"]');
  await share.waitForExist({ timeout: 10_000 });
  await shot("image-answered.png");
  assert.equal(await share.getAttribute("data-tokens"), "63");
});
