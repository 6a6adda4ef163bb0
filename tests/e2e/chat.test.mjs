// The real app on the real offline model (Gemma 3 270M): loads on start, streams two chat
// turns, stops mid-answer, shows per-answer stats, switches the cache precision mid-chat
// (timeline marker, KV bytes drop), attaches a dropped text file and refuses a binary one,
// attaches a dropped PDF (its text extracted) and refuses locked or textless ones, serves the
// loaded model over the Local API switch, and restores the conversation with its saved KV cache
// after a relaunch (the next answer reads nothing again). Screenshots go to the artifacts dir.

import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { ARTIFACTS, dropFile, invokeInPage, launchApp, setNumber, waitForReady } from "./driver.mjs";

const DATA_DIR = mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-chat-"));
const FIXTURES = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "documents");
let app;

const $ = (sel) => app.browser.$(sel);
const $$ = (sel) => app.browser.$$(sel);
const shot = (name) => app.browser.saveScreenshot(path.join(ARTIFACTS, name));

/** Drops a file named `name` holding `bytes` on the window (see the driver's dropFile). */
const drop = (name, bytes) => dropFile(app.browser, name, bytes);

// A precision button is disabled while the previous switch is being applied and its session
// saved; the sample that shows the new policy can arrive before that ends, so a click must
// wait for the button rather than land on a disabled one (and be dropped).
async function choosePrecision(id) {
  const button = await $(`[data-testid="precision-${id}"]`);
  await button.waitForEnabled({ timeout: 30_000 });
  await button.click();
}

/** Waits until the cache on screen is `spec`; on a timeout says why the switch did not apply. */
async function waitForPolicy(spec, timeout = 10_000) {
  const current = await $('[data-testid="cache-current"]');
  await app.browser.waitUntil(async () => (await current.getAttribute("data-policy")) === spec, { timeout }).catch(async (e) => {
    const error = await $('[data-testid="switch-error"]');
    const why = (await error.isExisting()) ? await error.getText() : "no switch error shown";
    throw new Error(`the cache is ${await current.getAttribute("data-policy")}, not ${spec}: ${why} (${e.message})`);
  });
}

async function answers() {
  return $$('[data-testid="message"][data-role="model"]');
}

/** Types `text` and presses Enter; returns the index of the new answer. */
async function send(text) {
  const before = (await answers()).length;
  // Enter is ignored while an answer is still being generated (the Send button shows only
  // when none is): after a turn's stats show, the app can take a moment to be idle again.
  await (await $('[data-testid="send"]')).waitForExist({ timeout: 30_000 });
  const box = await $('[data-testid="composer"]');
  await box.click();
  await box.setValue(text);
  await app.browser.keys("Enter");
  try {
    await app.browser.waitUntil(async () => (await answers()).length === before + 1, { timeout: 10_000 });
  } catch (e) {
    // What the window showed instead, for the failure's reader.
    await shot("send-timeout.png");
    const left = await (await $('[data-testid="composer"]')).getValue();
    throw new Error(`no answer to "${text.slice(0, 40)}": ${(await answers()).length} answers (${before} before), composer holds "${left.slice(0, 40)}"`, { cause: e });
  }
  return before;
}

async function waitForStats(index, timeout = 120_000) {
  await app.browser.waitUntil(
    async () => {
      const a = (await answers())[index];
      return a && (await a.$('[data-testid="stats"]').isExisting());
    },
    { timeout, timeoutMsg: `answer ${index} never finished` },
  );
  return (await answers())[index];
}

/** Regenerates the last answer and waits until its stats say only the last of its `prompt`
 * tokens ran (the rest read from the cache); `was` (the stats before) names a failure. */
async function regenerateFromCache(prompt, was) {
  await (await $('[data-testid="regenerate"]')).click();
  const again = new RegExp(`prompt ${prompt} \\(${prompt - 1} cached\\)`);
  await app.browser.waitUntil(
    async () => {
      const stats = await (await answers()).at(-1).$('[data-testid="stats"]');
      return (await stats.isExisting()) && again.test(await stats.getText());
    },
    { timeout: 60_000, timeoutMsg: `the regenerated answer did not reuse ${prompt - 1} of ${prompt} prompt tokens (${was})` },
  );
}

before(async () => {
  app = await launchApp({ env: { KVLAB_DATA_DIR: DATA_DIR } });
});

after(async () => {
  await app?.close();
});

test("loads the offline Gemma 3 270M on start and shows its card", async () => {
  await waitForReady(app.browser);
  const layers = await $('[data-testid="card-layers"]');
  await layers.waitForDisplayed({ timeout: 10_000 });
  assert.match(await layers.getText(), /^18 · 15 sliding \(window 512\), 3 full/);
  assert.match(await (await $('[data-testid="card-params"]')).getText(), /^2\d\dM$/);
  const costs = await (await $('[data-testid="card-costs"]')).getText();
  assert.match(costs, /FP16/);
  assert.match(costs, /TQ 3\.6/);
  await shot("model-loaded.png");
});

// A lone chat's decode rate, beside which the compare view's panes print theirs.
let loneDecode = 0;

test("streams two chat turns, each with its stats", async () => {
  await setNumber(app.browser, "temperature", 0);
  await setNumber(app.browser, "max-tokens", 24);
  const first = await send("What is the capital of France? Answer in one sentence.");
  // Streaming: text appears while the answer is still marked as streaming.
  await app.browser.waitUntil(
    async () => {
      const a = (await answers())[first];
      return (await a.getAttribute("data-streaming")) === "true" && (await (await a.$('[data-testid="answer"]')).getText()).trim().length > 0;
    },
    { timeout: 60_000, interval: 50, timeoutMsg: "no partial text was seen while streaming" },
  );
  const a1 = await waitForStats(first);
  const stats1 = await (await a1.$('[data-testid="stats"]')).getText();
  assert.match(stats1, /first token \d+(\.\d+)? m?s/);
  assert.match(stats1, /decode \d+(\.\d+)? tok\/s/);
  loneDecode = Number(stats1.match(/decode (\d+(\.\d+)?) tok\/s/)[1]);
  assert.match(stats1, /KV \d/);
  assert.match(stats1, /cache f16/);
  assert.ok((await (await a1.$('[data-testid="answer"]')).getText()).trim().length > 0);

  const second = await send("And of Italy?");
  const a2 = await waitForStats(second);
  assert.match(await (await a2.$('[data-testid="stats"]')).getText(), /tokens \d+/);
  assert.equal((await $$('[data-testid="message"][data-role="user"]')).length, 2);
  await shot("chat.png");

  // The prompt the second answer read, as the model sees it: the 270M is a base model, so
  // the conversation went in as plain text after <bos>, with no turn markers.
  await (await a2.$('[data-testid="show-prompt"]')).click();
  const view = await $('[data-testid="prompt-view"]');
  await view.waitForDisplayed({ timeout: 10_000 });
  const text = await (await $('[data-testid="prompt-text"]')).getText();
  assert.match(text, /^<bos>What is the capital of France\? Answer in one sentence\.\n\n/);
  assert.match(text, /And of Italy\?$/);
  assert.doesNotMatch(text, /<start_of_turn>/);
  assert.match(await (await $('[data-testid="prompt-tokens"]')).getText(), /^\d+ tokens$/);
  await shot("prompt-view.png");
  await app.browser.keys("Escape");
  await view.waitForDisplayed({ reverse: true, timeout: 5_000 });
});

test("Esc stops an answer mid-stream", async () => {
  await setNumber(app.browser, "max-tokens", 400);
  const i = await send("Write a long story about a dragon who learns to bake bread.");
  await app.browser.waitUntil(
    async () => (await (await (await answers())[i].$('[data-testid="answer"]')).getText()).length > 20,
    { timeout: 60_000, interval: 50 },
  );
  await app.browser.keys("Escape");
  const a = await waitForStats(i, 30_000);
  const stats = await (await a.$('[data-testid="stats"]')).getText();
  assert.match(stats, /stopped/);
  const tokens = Number(stats.match(/tokens (\d+)/)[1]);
  assert.ok(tokens < 400, `stopped after ${tokens} tokens`);
  await setNumber(app.browser, "max-tokens", 24);
});

test("switching the cache precision mid-conversation marks the timeline and shrinks the KV (FP32 → FP16 → q8_0 → q4_0+sink → f32/q4_0 → f32/q4_0+sink → TQ 3.6)", async () => {
  const current = await $('[data-testid="cache-current"]');
  const policy = () => current.getAttribute("data-policy");
  const kvBytes = async () => Number(await current.getAttribute("data-kv-bytes"));
  const chart = await $('[data-testid="memory-chart"]');
  // The stopped answer of the test before may still be leaving the engine: a switch asked
  // while it generates is refused (as it should be), so wait for it to be idle first.
  await waitForReady(app.browser, 30_000);
  await choosePrecision("f32");
  await waitForPolicy("f32");
  const wide = await kvBytes();
  assert.ok(wide > 0, "the conversation holds KV bytes");
  await choosePrecision("f16");
  await waitForPolicy("f16");
  const half = await kvBytes();
  assert.equal(half * 2, wide, `f16 holds half of f32 (${half} vs ${wide})`);
  // llama.cpp's q8_0, stored as ggml stores it: 34 bytes for every 32 coordinates.
  await choosePrecision("q8_0");
  await app.browser.waitUntil(async () => (await policy()) === "q8_0", { timeout: 30_000 });
  const q8 = await kvBytes();
  assert.equal(q8 * 64, half * 34, `q8_0 holds 34/64 of f16 (${q8} vs ${half})`);
  // q4_0 keeping its first token as f16 (KV Lab's +sink): q4_0's 18/64 of f16, and that
  // token's f16 rows on top, a small share of f16's.
  await choosePrecision("q4_0+sink");
  await app.browser.waitUntil(async () => (await policy()) === "q4_0+sink", { timeout: 30_000 });
  const sunk = await kvBytes();
  const sink = sunk - (half * 18) / 64;
  assert.ok(sink > 0 && sink * 8 <= half, `q4_0+sink holds q4_0's bytes and a token's f16 (${sunk} vs ${half})`);
  // Keys and values apart, any two formats: f32 keys (4 bytes a coordinate) beside q4_0
  // values (18 bytes for 32) hold 73/64 of f16's 4 bytes a coordinate pair.
  await (await $('[data-testid="split-kv"]')).click();
  await (await $('[data-testid="split-keys"]')).selectByVisibleText("FP32");
  await (await $('[data-testid="split-values"]')).selectByVisibleText("q4_0");
  const apply = await $('[data-testid="split-apply"]');
  await apply.waitForEnabled({ timeout: 30_000 });
  await apply.click();
  await waitForPolicy("f32/q4_0", 30_000);
  const mixed = await kvBytes();
  assert.equal(mixed * 64, half * 73, `f32/q4_0 holds 73/64 of f16 (${mixed} vs ${half})`);
  // The same with the q4_0 side keeping its first token: that token's f16 values on top.
  await (await $('[data-testid="split-sink"]')).click();
  await apply.waitForEnabled({ timeout: 30_000 });
  await apply.click();
  await waitForPolicy("f32/q4_0+sink", 30_000);
  const mixedSink = await kvBytes();
  assert.ok(mixedSink > mixed && (mixedSink - mixed) * 8 <= half, `f32/q4_0+sink holds f32/q4_0's bytes and a token's f16 values (${mixedSink} vs ${mixed})`);
  await shot("cache-split-f32-q4_0.png");
  await (await $('[data-testid="split-kv"]')).click();
  await choosePrecision("k4v3+qw");
  // The engine's canonical SPEC: TurboQuant on every layer, as the "all" scope asks.
  await app.browser.waitUntil(async () => (await policy()) === "k4v3+qw@all", { timeout: 30_000 });
  const tq = await kvBytes();
  assert.ok(tq > 0 && tq < half * 0.3, `TQ 3.6 holds ${tq} bytes vs ${half} in f16`);
  // The menu says what the preset costs and loses, as the engine measured it.
  // The measured figures are the engine's (kv/spec/presets.rs); the form is the UI's.
  assert.match(
    await (await $('[data-testid="preset-measured"]')).getText(),
    /^k4v3\+qw@all · 3\.63 bits per coordinate · mean KLD 0\.\d+ · top-1 \d+(\.\d)?% vs FP16$/,
  );
  await app.browser.waitUntil(async () => (await chart.getAttribute("data-markers")) === "7", { timeout: 5_000 });
  // The conversation goes on in the new precision.
  const i = await send("Thanks!");
  const a = await waitForStats(i);
  assert.match(await (await a.$('[data-testid="stats"]')).getText(), /cache k4v3\+qw/);
  // Let a few samples land after the switch so the chart shows the drop.
  await app.browser.pause(1500);
  await shot("cache-switch.png");
});

// Before the documents are dropped: the sweep scores every preset on the whole conversation,
// and a short one (three turns) shows the same view in a fraction of the time.
test("Ctrl+K opens the compare view: two panes stream, the tested one gets KLD and top-1", async () => {
  // Enough tokens for each pane's decode rate to mean something: the two panes are two rows
  // of one forward pass per step, so each decodes near a lone chat's rate (printed, not
  // asserted: speed targets live in benchmarks).
  await setNumber(app.browser, "max-tokens", 32);
  await app.browser.keys(["Control", "k"]);
  const view = await $('[data-testid="compare-view"]');
  await view.waitForDisplayed({ timeout: 5_000 });
  await (await $('[data-testid="compare-run"]')).click();
  // Both panes stream at once: each shows text while still streaming.
  await app.browser.waitUntil(
    async () => {
      const panes = await $$('[data-testid="compare-pane"]');
      let seen = 0;
      for (const p of panes) {
        if ((await p.getAttribute("data-streaming")) === "true" && (await (await p.$('[data-testid="compare-text"]')).getText()).length > 0) seen += 1;
      }
      return seen === 2;
    },
    { timeout: 60_000, interval: 50, timeoutMsg: "the two panes did not stream together" },
  );
  const kld = await $('[data-testid="kld"]');
  await kld.waitForDisplayed({ timeout: 120_000 });
  // The suggested cache (k4v3+qw, TQ 3.6) on every layer of the 270M against its own f16
  // cache, greedy, on this test's conversation (tq3.5 without query weighting measured
  // mean KLD 0.135 and top-1 84.3% here). The bounds fail on a lossless "tested" cache
  // (KLD 0) and on a broken one (several nats).
  const kldValue = Number(await kld.getAttribute("data-value"));
  const top1 = Number(await (await $('[data-testid="top1"]')).getAttribute("data-value"));
  console.log(`compare: mean KLD ${kldValue}, top-1 ${top1}`);
  assert.ok(kldValue > 0.003 && kldValue < 0.5, `mean KLD ${kldValue}`);
  assert.ok(top1 > 0.6 && top1 <= 1, `top-1 ${top1}`);
  const stats = await $$('[data-testid="compare-stats"]');
  assert.equal(stats.length, 2);
  const paneDecode = [];
  for (const st of stats) {
    const m = (await st.getText()).match(/decode (\d+(\.\d+)?) tok\/s/);
    assert.ok(m, "each pane shows its decode rate");
    paneDecode.push(Number(m[1]));
  }
  console.log(`compare: panes decode ${paneDecode.join(" and ")} tok/s; a lone chat ${loneDecode} tok/s (${paneDecode.map((d) => (d / loneDecode).toFixed(2)).join(", ")}×)`);
  assert.match(await stats[0].getText(), /cache f16/);
  assert.match(await stats[1].getText(), /cache k4v3\+qw/);
  // The memory bars are drawn to scale: FP16 is the longest, TQ 3.6 on all layers far shorter.
  const fp16Bar = Number(await (await $('[data-testid="kv-bar-0"]')).getAttribute("data-fraction"));
  const tqBar = Number(await (await $('[data-testid="kv-bar-1"]')).getAttribute("data-fraction"));
  assert.equal(fp16Bar, 1);
  assert.ok(tqBar > 0.1 && tqBar < 0.4, `TQ 3.6 bar fraction ${tqBar}`);
  await shot("compare.png");
  // The sweep: every preset (and the conversation's cache, ringed) scored on the reference's
  // tokens, drawn as KLD against bits.
  const sweepRun = await $('[data-testid="sweep-run"]');
  await sweepRun.click();
  const presets = Number(await (await $('[data-testid="sweep"]')).getAttribute("data-expected"));
  assert.ok(presets >= 4, `${presets} caches to sweep`);
  // Every cache is scored in one lockstep pass with the reference: the button shows how far.
  await app.browser.waitUntil(async () => /^Sweeping… [1-9]\d*%$/.test(await sweepRun.getText()), {
    timeout: 120_000,
    interval: 100,
    timeoutMsg: "the sweep showed no progress",
  });
  await shot("compare-sweeping.png");
  await app.browser.waitUntil(async () => (await $$('[data-testid="sweep-point"]')).length === presets, {
    timeout: 180_000,
    timeoutMsg: "the sweep did not draw every cache",
  });
  const points = [];
  for (const p of await $$('[data-testid="sweep-point"]')) {
    points.push({
      kv: await p.getAttribute("data-kv"),
      bits: Number(await p.getAttribute("data-bits")),
      kld: Number(await p.getAttribute("data-kld")),
      current: (await p.getAttribute("data-current")) === "true",
    });
  }
  console.log(`sweep: ${JSON.stringify(points)}`);
  // The reference against itself loses nothing at 16 bits; every TurboQuant cache loses
  // something with far fewer bits; the chat's own cache is the one ringed.
  const f16 = points.find((p) => p.kv === "f16");
  assert.deepEqual([f16.bits, f16.kld], [16, 0]);
  for (const p of points.filter((p) => p.kv.includes("+qw"))) assert.ok(p.bits < 7 && p.kld > 0 && p.kld < 1, JSON.stringify(p));
  const ringed = points.filter((p) => p.current);
  assert.equal(ringed.length, 1);
  assert.equal(ringed[0].kv, await (await $('[data-testid="cache-current"]')).getAttribute("data-policy"));
  await shot("compare-sweep.png");
  // Both answers held to a JSON schema (constrained decoding): each parses, whatever its cache.
  await (await $('[data-testid="compare-json"]')).click();
  const schema = await $('[data-testid="compare-schema"]');
  await schema.waitForDisplayed({ timeout: 5_000 });
  await schema.setValue('{"type": "object", "properties": {"sea": {"enum": ["blue", "green", "grey"]}, "calm": {"type": "boolean"}}, "required": ["sea", "calm"], "additionalProperties": false}');
  await (await $('[data-testid="compare-run"]')).click();
  await app.browser.waitUntil(async () => (await $$('[data-testid="compare-json-check"]')).length === 2, {
    timeout: 120_000,
    timeoutMsg: "the JSON panes did not finish",
  });
  const answers = [];
  for (const t of await $$('[data-testid="compare-text"]')) answers.push(await t.getText());
  console.log(`compare as JSON: ${JSON.stringify(answers)}`);
  for (const c of await $$('[data-testid="compare-json-check"]')) assert.equal(await c.getAttribute("data-parses"), "true");
  for (const a of answers) assert.ok(["blue", "green", "grey"].includes(JSON.parse(a).sea), a);
  await shot("compare-json.png");
  await (await $('[data-testid="compare-json"]')).click();
  await app.browser.keys("Escape");
  await view.waitForDisplayed({ reverse: true, timeout: 5_000 });
  await setNumber(app.browser, "max-tokens", 24);
});

// A cache fitted to a budget from the cache panel: the comparison opens, probes each layer's
// keys and values alone on this conversation, and charts the fitted cache beside the presets.
test("the cache panel fits a cache to a budget, charted beside the presets", async () => {
  const mib = Number(await (await $('[data-testid="panel-fit-mib"]')).getValue());
  assert.ok(mib > 0, `a default budget: ${mib} MiB`);
  await (await $('[data-testid="panel-fit"]')).click();
  const view = await $('[data-testid="compare-view"]');
  await view.waitForDisplayed({ timeout: 5_000 });
  const fitRun = await $('[data-testid="fit-run"]');
  await app.browser.waitUntil(async () => /^Fitting… [1-9]\d*%$/.test(await fitRun.getText()), {
    timeout: 120_000,
    interval: 100,
    timeoutMsg: "the fit showed no progress",
  });
  await shot("fit-running.png");
  const fitted = await $('[data-testid="fitted"]');
  await fitted.waitForDisplayed({ timeout: 300_000 });
  const spec = await fitted.getAttribute("data-spec");
  const bytes = Number(await fitted.getAttribute("data-bytes"));
  console.log(`fitted to ${mib} MiB: ${spec} (${bytes} bytes)`);
  // Within the budget, and not f16: the budget is a quarter of f16's bytes.
  assert.ok(bytes <= Math.round(mib * 2 ** 20), `${bytes} bytes over ${mib} MiB`);
  assert.match(spec, /\+qw\+sink/);
  // Its point, a diamond beside the presets' dots, once scored.
  await app.browser.waitUntil(async () => (await $$('[data-testid="sweep-point"][data-fitted="true"]')).length === 1, {
    timeout: 120_000,
    timeoutMsg: "the fitted cache was not charted",
  });
  const point = await $('[data-testid="sweep-point"][data-fitted="true"]');
  const bits = Number(await point.getAttribute("data-bits"));
  const kld = Number(await point.getAttribute("data-kld"));
  console.log(`fitted point: ${bits} bits, mean KLD ${kld}`);
  assert.ok(bits > 2 && bits < 8, `${bits} bits`);
  assert.ok(kld > 0 && kld < 1, `mean KLD ${kld}`);
  assert.equal(await point.getAttribute("data-kv"), spec);
  assert.ok((await $$('[data-testid="sweep-point"]')).length > 4, "the presets beside it");
  const use = await $('[data-testid="fit-use"]');
  assert.equal(await use.getText(), "Use it");
  assert.equal(await use.isEnabled(), true);
  await shot("fit.png");
  // Used: the conversation's cache becomes the fitted one, and the card's KV table gains
  // each layer's format, as the engine holds it.
  const before = await (await $('[data-testid="cache-current"]')).getAttribute("data-policy");
  const presetOn = await (await $('[data-testid^="precision-"].on')).getAttribute("data-testid");
  await use.click();
  const current = await $('[data-testid="cache-current"]');
  await app.browser.waitUntil(async () => (await current.getAttribute("data-policy")) === spec, {
    timeout: 60_000,
    timeoutMsg: "the fitted cache was not switched to",
  });
  await app.browser.keys("Escape");
  await view.waitForDisplayed({ reverse: true, timeout: 5_000 });
  const layers = await $('[data-testid="layer-formats"]');
  await layers.waitForExist({ timeout: 10_000 });
  await layers.scrollIntoView();
  await (await layers.$("summary")).click();
  const rows = [];
  for (const r of await $$('[data-testid="layer-row"]')) rows.push({ layer: Number(await r.getAttribute("data-layer")), precision: await r.getAttribute("data-precision") });
  console.log(`fitted layers: ${JSON.stringify(rows)}`);
  assert.equal(rows.length, 18, "every layer of the 270M");
  assert.ok(new Set(rows.map((r) => r.precision)).size > 1, "layers of their own formats");
  for (const r of rows) assert.ok(spec.includes(r.precision), `${r.precision} is in ${spec}`);
  await shot("fit-layers.png");
  // Back to the cache the chat had, for the tests after this one.
  await (await $(`[data-testid="${presetOn}"]`)).click();
  await app.browser.waitUntil(async () => (await current.getAttribute("data-policy")) === before, {
    timeout: 60_000,
    timeoutMsg: "the chat's cache was not switched back",
  });
  assert.equal((await $$('[data-testid="layer-formats"]')).length, 0);
});

test("a dropped text file shows its cost and goes into the prompt; a binary file is refused", async () => {
  const userCount = (await $$('[data-testid="message"][data-role="user"]')).length;
  await drop("blob.bin", [0x7f, 0x45, 0x4c, 0x46, 0, 0, 1, 2]);
  const notice = await $('[data-testid="doc-notice"]');
  await notice.waitForDisplayed({ timeout: 10_000 });
  assert.match(await notice.getText(), /blob\.bin: .*binary/);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);

  await drop("notes.txt", Buffer.from("The secret word is pineapple.\nRemember it.\n"));
  const att = await $('[data-testid="attachment"]');
  await att.waitForDisplayed({ timeout: 10_000 });
  const tokens = Number(await att.getAttribute("data-tokens"));
  assert.ok(tokens > 5 && tokens < 30, `${tokens} tokens`);
  assert.equal(await att.getAttribute("data-fits"), "true");
  const costs = await (await att.$('[data-testid="doc-costs"]')).getText();
  assert.match(costs, /FP16 \d/);
  assert.match(costs, /TQ 3\.6 \d/);
  await shot("document.png");
  assert.equal((await $$('[data-testid="message"][data-role="user"]')).length, userCount, "the chat is untouched");

  const i = await send("What is the secret word?");
  await waitForStats(i);
  const users = await $$('[data-testid="message"][data-role="user"]');
  assert.match(await users[users.length - 1].getText(), /notes\.txt/);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);
});

test("a dropped PDF shows its text's token and KV costs and goes into the prompt; locked or textless PDFs are refused", async () => {
  const userCount = (await $$('[data-testid="message"][data-role="user"]')).length;
  // The paperclip's picker offers PDFs and goes through the same reading as a drop: give it a
  // file as the native dialog would (the dialog itself is outside the page).
  const picker = await $('[data-testid="doc-picker"]');
  assert.match(await picker.getAttribute("accept"), /(^|,)\.pdf(,|$)/);
  assert.equal(await (await $('[data-testid="attach"]')).isEnabled(), true);
  await app.browser.execute(
    (n, b) => {
      const dt = new DataTransfer();
      dt.items.add(new File([new Uint8Array(b)], n, { type: "application/pdf" }));
      const input = document.querySelector('[data-testid="doc-picker"]');
      input.files = dt.files;
      input.dispatchEvent(new Event("change", { bubbles: true }));
    },
    "locked.pdf",
    Array.from(readFileSync(path.join(FIXTURES, "locked.pdf"))),
  );
  const notice = await $('[data-testid="doc-notice"]');
  await notice.waitForDisplayed({ timeout: 10_000 });
  assert.match(await notice.getText(), /locked\.pdf: the PDF is password-protected/);

  await drop("scan.pdf", readFileSync(path.join(FIXTURES, "scan.pdf")));
  await app.browser.waitUntil(async () => /scan\.pdf/.test(await notice.getText()), { timeout: 10_000 });
  assert.match(await notice.getText(), /scan\.pdf: the PDF has no text layer/);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);

  await drop("report.pdf", readFileSync(path.join(FIXTURES, "report.pdf")));
  const att = await $('[data-testid="attachment"]');
  await att.waitForDisplayed({ timeout: 20_000 });
  assert.equal(await att.getAttribute("data-kind"), "pdf");
  const tokens = Number(await att.getAttribute("data-tokens"));
  // Three short sentences and a title: about thirty Gemma tokens.
  assert.ok(tokens > 20 && tokens < 60, `${tokens} tokens`);
  assert.equal(await (await att.$('[data-testid="doc-summary"]')).getText(), `PDF · 2 pages · ${tokens} tokens`);
  assert.equal(await att.getAttribute("data-fits"), "true");
  const costs = await (await att.$('[data-testid="doc-costs"]')).getText();
  assert.match(costs, /FP16 \d/);
  assert.match(costs, /TQ 3\.6 \d/);
  assert.equal(await notice.isExisting(), false, "a good file clears the refusal");
  await shot("document-pdf.png");
  assert.equal((await $$('[data-testid="message"][data-role="user"]')).length, userCount, "the chat is untouched");

  const i = await send("What is the secret word in the report?");
  await waitForStats(i);
  const users = await $$('[data-testid="message"][data-role="user"]');
  assert.match(await users[users.length - 1].getText(), /report\.pdf/);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);
  // The prompt the model got holds the extracted text (the saved turn is what was sent).
  const id = await (await $('[data-testid="session"].active')).getAttribute("data-id");
  let prompt = "";
  await app.browser.waitUntil(
    async () => {
      const saved = await invokeInPage(app.browser, "load_session", { id });
      prompt = saved.ok ? (saved.value.messages.filter((m) => m.role === "user").at(-1)?.content ?? "") : "";
      return prompt.includes("report.pdf");
    },
    { timeout: 10_000, timeoutMsg: "the turn with the PDF was not saved" },
  );
  assert.match(prompt, /File `report\.pdf`:/);
  assert.match(prompt, /The secret word is pineapple\. The cache keeps keys and values for every token\.\n\nSecond page:/);
});

test("the Local API switch serves the loaded model to an OpenAI-style client, then stops", async () => {
  const panel = await $('[data-testid="server-panel"]');
  await panel.scrollIntoView();
  // Port 0: any free port (the URL says which), so the test never collides with a server.
  await setNumber(app.browser, "server-port", 0);
  const toggle = await $('[data-testid="server-toggle"]');
  await toggle.click();
  const urlEl = await $('[data-testid="server-url"]');
  await urlEl.waitForDisplayed({ timeout: 10_000 });
  const url = await urlEl.getText();
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
  const name = await (await $('[data-testid="model-card"] h2 span')).getText();
  const models = await (await fetch(`${url}/models`)).json();
  assert.deepEqual(models.data.map((m) => m.id), [name]);
  const r = await fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: name, messages: [{ role: "user", content: "The sea" }], temperature: 0, max_tokens: 4 }),
  });
  assert.equal(r.status, 200);
  const body = await r.json();
  assert.equal(body.usage.completion_tokens, 4);
  // The app's own cache, as the panel shows it, with its exact bytes.
  const current = await $('[data-testid="cache-current"]');
  assert.equal(body.usage.kv_cache, await current.getAttribute("data-policy"));
  assert.ok(body.usage.kv_bytes > 0);
  await shot("server.png");
  await toggle.click();
  try {
    // The stop answers at once, yet twice the URL was still shown after 5 s (cause not
    // found: a lost click or a stalled webview); a failure now says which state it saw.
    await urlEl.waitForDisplayed({ reverse: true, timeout: 15_000 });
  } catch (e) {
    await shot("server-stop-timeout.png");
    throw new Error(`${e.message}; the toggle says "${await toggle.getText()}"`);
  }
  await assert.rejects(fetch(`${url}/models`));
});

test("a conversation saved with its KV cache: after a relaunch the next answer reads nothing again and equals the unbroken one", async () => {
  // A greedy answer, the last thing before quitting: what the unbroken session gives.
  await setNumber(app.browser, "temperature", 0);
  await setNumber(app.browser, "max-tokens", 24);
  const at = await send("Name three colours.");
  const first = await (await (await waitForStats(at)).$('[data-testid="stats"]')).getText();
  // The unbroken answer is a regenerated one: its last prompt token runs alone, as it will
  // after the relaunch. The first answer's came in the prompt's chunk, whose attention sums
  // the same products in another order, and a greedy answer can follow a near-tie either way.
  await (await $('[data-testid="send"]')).waitForExist({ timeout: 30_000 });
  await regenerateFromCache(Number(first.match(/prompt (\d+)/)[1]), first);
  const unbroken = await (await (await answers()).at(-1).$('[data-testid="answer"]')).getText();
  const count = (await $$('[data-testid="message"]')).length;
  // Saved on demand, as quitting does: WebKitWebDriver's window close never reaches the app
  // (no close or exit event fires), so the quit path itself is not what this test drives.
  await (await $('[data-testid="save-cache"]')).click();
  const saved = await $('[data-testid="cache-notice"]');
  await saved.waitForDisplayed({ timeout: 20_000, timeoutMsg: "the cache was not saved" });
  // In the precision it holds (TurboQuant since the switch test), not re-encoded.
  const spec = (await (await (await answers()).at(-1).$('[data-testid="stats"]')).getText()).match(/cache (\S+)/)[1];
  assert.match(await saved.getText(), new RegExp(`^Saved [\\d,]+ tokens of cache \\([\\d.]+ [KM]iB, ${spec.replace(/[.+]/g, "\\$&")}\\) in [\\d.]+ s$`));
  const sessions = path.join(DATA_DIR, "sessions");
  assert.equal(readdirSync(sessions).filter((f) => f.endsWith(".kvc")).length, 1);
  await app.close();
  app = await launchApp({ env: { KVLAB_DATA_DIR: DATA_DIR } });
  await app.browser.waitUntil(async () => (await $$('[data-testid="message"]')).length === count, {
    timeout: 30_000,
    timeoutMsg: "the saved conversation did not come back",
  });
  assert.equal(await (await (await answers()).at(-1).$('[data-testid="answer"]')).getText(), unbroken);
  assert.equal((await $$('[data-testid="session"]')).length, 1);
  await waitForReady(app.browser);
  // The saved cache came back with it, in the precision it held.
  const notice = await $('[data-testid="cache-notice"]');
  await notice.waitForDisplayed({ timeout: 30_000, timeoutMsg: "no cache was restored" });
  const restored = (await notice.getText()).match(/^Restored ([\d,]+) tokens from cache in [\d.]+ s, instead of re-reading$/);
  assert.ok(restored, await notice.getText());
  const tokens = Number(restored[1].replaceAll(",", ""));
  const badge = await $('[data-testid="session-cache"]');
  assert.equal(Number(await badge.getAttribute("data-tokens")), tokens);
  assert.equal(await badge.getAttribute("data-spec"), spec);
  await shot("cache-restored.png");
  // The same question again: its prompt is already in the restored cache, so only the last
  // prompt token runs (no prefill), and the greedy answer is the unbroken session's.
  // The restored answer's stats render after its text: wait for them, do not race them.
  let before = "";
  await app.browser.waitUntil(
    async () => {
      const stats = await (await answers()).at(-1).$('[data-testid="stats"]');
      before = (await stats.isExisting()) ? await stats.getText() : "";
      return /prompt \d+/.test(before);
    },
    { timeout: 30_000, timeoutMsg: "the restored answer shows no stats" },
  );
  const prompt = Number(before.match(/prompt (\d+)/)[1]);
  await regenerateFromCache(prompt, before);
  assert.ok(tokens >= prompt, `restored ${tokens} tokens, the prompt has ${prompt}`);
  assert.equal(await (await (await answers()).at(-1).$('[data-testid="answer"]')).getText(), unbroken);
  await shot("main-window.png");
});

test("many conversations, one memory: the app's chat keeps its cache across Local API requests, and an idle chat is demoted when KV memory is short", async () => {
  await setNumber(app.browser, "temperature", 0);
  await setNumber(app.browser, "max-tokens", 16);
  const promptOf = async (i) => {
    const text = await (await (await waitForStats(i)).$('[data-testid="stats"]')).getText();
    const [, prompt, cached] = text.match(/prompt (\d+) \((\d+) cached\)/);
    return { prompt: Number(prompt), cached: Number(cached), text };
  };
  // Back to FP16 from TQ 3.6: the next answer reads the history again rather than keep rows
  // decoded from codes, and says so.
  // The relaunched session's last answer may still be leaving the engine: a switch asked
  // while it generates is refused (as it should be).
  await waitForReady(app.browser, 30_000);
  await choosePrecision("f16");
  await waitForPolicy("f16");
  const first = await promptOf(await send("Tell me about the sea."));
  assert.equal(first.cached, 0, first.text);
  assert.match(first.text, /history read again \(its rows had been coded lossily\)/);
  // Clients of the Local API: one names its conversation, one does not.
  const panel = await $('[data-testid="server-panel"]');
  await panel.scrollIntoView();
  await setNumber(app.browser, "server-port", 0);
  const toggle = await $('[data-testid="server-toggle"]');
  await toggle.click();
  const urlEl = await $('[data-testid="server-url"]');
  await urlEl.waitForDisplayed({ timeout: 10_000 });
  const url = await urlEl.getText();
  const ask = async (messages, headers = {}) => {
    const r = await fetch(`${url}/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ messages, temperature: 0, max_tokens: 4 }),
    });
    assert.equal(r.status, 200);
    return r.json();
  };
  const named = await ask([{ role: "user", content: "The sea" }], { "x-conversation": "e2e-client" });
  assert.equal(named.usage.conversation, "e2e-client");
  assert.equal(named.usage.prompt_tokens_details.cached_tokens, 0);
  const next = await ask(
    [
      { role: "user", content: "The sea" },
      { role: "assistant", content: named.choices[0].message.content },
      { role: "user", content: "And the sky?" },
    ],
    { "x-conversation": "e2e-client" },
  );
  assert.ok(next.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(next.usage));
  // A client naming nothing gets a conversation of its own: nothing of the other's is reused.
  const stranger = await ask([{ role: "user", content: "The sea" }]);
  assert.notEqual(stranger.usage.conversation, "e2e-client");
  assert.equal(stranger.usage.prompt_tokens_details.cached_tokens, 0);
  // The API's clients show as their own conversations, named as the API named them (each in
  // its client's namespace).
  await (await $('[data-testid="api-conversation"][data-name="e2e-client"]')).waitForExist({ timeout: 5_000 });
  await toggle.click();
  await urlEl.waitForDisplayed({ reverse: true, timeout: 5_000 });
  // The app's next turn reads only what is new: its history stayed cached through them.
  const second = await promptOf(await send("And the waves?"));
  assert.ok(second.cached >= first.prompt, `the history was read again: ${second.text} after ${first.text}`);
  const chat = await (await $(".session.active")).getAttribute("data-id");
  assert.equal(await (await $(`.session[data-id="${chat}"] [data-testid="session-tier"]`)).getAttribute("data-tier"), "held");

  // Short of KV memory: 8 MiB for every conversation. A new chat needs more than is left
  // beside the idle one, which the engine re-encodes as TQ 3.6 (the demotion preset), and the
  // timeline marks it.
  const budget = await $('[data-testid="kv-budget-select"]');
  await budget.selectByAttribute("value", String(8 << 20));
  // The setting persists in the web view's storage: put it back whatever happens here.
  try {
    await shortOfMemory(chat, second);
  } finally {
    await budget.selectByAttribute("value", "0");
  }
});

/** The second half of the test above, with KV memory set to 8 MiB. */
async function shortOfMemory(chat, second) {
  const promptOf = async (i) => {
    const text = await (await (await waitForStats(i)).$('[data-testid="stats"]')).getText();
    const [, prompt, cached] = text.match(/prompt (\d+) \((\d+) cached\)/);
    return { prompt: Number(prompt), cached: Number(cached), text };
  };
  const idleAnswers = (await answers()).length;
  await (await $('[data-testid="new-chat"]')).click();
  // send() counts the answers shown before it: wait until the new chat's (none) are.
  await app.browser.waitUntil(async () => (await answers()).length === 0, {
    timeout: 5_000,
    timeoutMsg: "the new chat did not open",
  });
  // About 390 tokens with the answer, 6.9 MiB in FP16: room for it alone (8 MiB holds ~450
  // FP16 tokens of this model, 18 KiB each), not beside the idle chat.
  const passage = "The sea was calm that morning, and the boats went out early. ".repeat(27);
  await promptOf(await send(`Continue this:\n\n${passage}`));
  const chart = await $('[data-testid="memory-chart"]');
  await app.browser.waitUntil(async () => /demote/.test((await chart.getAttribute("data-marker-kinds")) ?? ""), {
    timeout: 10_000,
    timeoutMsg: "no demotion was marked",
  });
  // Demoted first; if that did not free enough (its FP16 history was long), spilled too.
  const tier = await $(`.session[data-id="${chat}"] [data-testid="session-tier"]`);
  await app.browser.waitUntil(async () => ["demoted", "on_disk"].includes(await tier.getAttribute("data-tier")), {
    timeout: 5_000,
    timeoutMsg: `the idle chat is ${await tier.getAttribute("data-tier")}`,
  });
  await app.browser.pause(1200);
  await shot("pool-demoted.png");
  // Back to the idle chat: it answers on from its demoted (or restored) cache, not from
  // scratch (making room for it demotes the new chat in turn).
  await (await $(`.session[data-id="${chat}"] .title`)).click();
  // As above: the chat's own answers shown before send() counts them.
  await app.browser.waitUntil(async () => (await answers()).length === idleAnswers, {
    timeout: 10_000,
    timeoutMsg: `the idle chat did not open (${idleAnswers} answers)`,
  });
  const back = await promptOf(await send("One more thing?"));
  assert.ok(back.cached >= second.prompt, `read again on return: ${back.text}`);
  // Its cache came back demoted, or from its file (on opening the chat, or on this turn).
  const notice = (await (await $('[data-testid="cache-notice"]')).isExisting())
    ? await (await $('[data-testid="cache-notice"]')).getText()
    : "";
  assert.ok(/demoted|restored/.test(back.text) || /^Restored /.test(notice), `${back.text} | ${notice}`);
}

// Last: a new conversation opened in TurboQuant holds its first tokens as f16 until it has
// seen the model's calibration rows (512 on the 270M), and the KV figure says so.
test("a new TurboQuant conversation says it holds f16 until it calibrates", async () => {
  await (await $('[data-testid="new-chat"]')).click();
  await app.browser.waitUntil(async () => (await answers()).length === 0, {
    timeout: 5_000,
    timeoutMsg: "the new chat did not open",
  });
  await choosePrecision("k4v3+qw");
  await waitForPolicy("k4v3+qw@all", 30_000);
  await waitForStats(await send("Hello!"));
  const label = await $('[data-testid="kv-label"]');
  const text = () => app.browser.execute(() => document.querySelector('[data-testid="kv-label"]')?.textContent ?? "");
  // Generous: on a cold CI machine the figure follows the turn's stats by a publish or two.
  let seen = "";
  await app.browser.waitUntil(async () => /^KV · f16 until 512$/.test((seen = await text())), {
    timeout: 30_000,
    timeoutMsg: "the KV figure does not say the cache waits as f16",
  }).catch((e) => {
    throw new Error(`${e.message}: it reads "${seen}"`);
  });
  assert.match(await label.getAttribute("title"), /^k4v3\+qw@all holds this conversation's first 512 tokens as f16/);
  // So does its line in the session list.
  const line = () =>
    app.browser.execute(
      () => document.querySelector('.session.active [data-testid="session-tier"]')?.textContent ?? "",
    );
  let said = "";
  await app.browser.waitUntil(async () => / · f16 until 512$/.test((said = await line())), {
    timeout: 30_000,
    timeoutMsg: "the session's line does not say the cache waits as f16",
  }).catch((e) => {
    throw new Error(`${e.message}: it reads "${said}"`);
  });
  await shot("cache-calibrating.png");
});
