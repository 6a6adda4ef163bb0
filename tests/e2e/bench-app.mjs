// A benchmark, not a test (scripts/bench.sh runs it; `npm test` does not): the real built app
// on the offline Gemma 3 270M, driven over WebDriver as the end-to-end tests drive it. It asks
// for greedy answers of BENCH_APP_TOKENS tokens, in a new chat each time, and reads the decode
// and prefill rates off each answer's stats line: what a user sees, measured by the engine
// while the webview renders every streamed token. Prints one JSON line:
//   {"threads": "2" | "default", "decode": [tok/s per round], "prefill": [...], "tokens": [...]}
// BENCH_APP_THREADS sets KVLAB_THREADS for the app (unset: the app's own default).

import { mkdtempSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { launchApp, setNumber, waitForReady } from "./driver.mjs";

const TOKENS = Number(process.env.BENCH_APP_TOKENS ?? 128);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2);
const THREADS = process.env.BENCH_APP_THREADS;
const PROMPT = "Write a long story about a lighthouse keeper and a storm. Do not stop early.";

const env = { KVLAB_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), "kvlab-bench-app-")) };
if (THREADS) env.KVLAB_THREADS = THREADS;
const app = await launchApp({ env });
const $ = (sel) => app.browser.$(sel);
const $$ = (sel) => app.browser.$$(sel);

/** The number before `unit` after `label` in a stats line ("decode 41.3 tok/s"). */
function figure(stats, label) {
  const m = stats.match(new RegExp(`${label} (\\d+(?:\\.\\d+)?)`));
  if (!m) throw new Error(`no "${label}" in the stats line: ${stats}`);
  return Number(m[1]);
}

const out = { threads: THREADS ?? "default", decode: [], prefill: [], tokens: [] };
try {
  await waitForReady(app.browser);
  await setNumber(app.browser, "temperature", 0);
  await setNumber(app.browser, "max-tokens", TOKENS);
  for (let round = 0; round < ROUNDS; round++) {
    await (await $('[data-testid="new-chat"]')).click();
    const box = await $('[data-testid="composer"]');
    await box.click();
    await box.setValue(PROMPT);
    await app.browser.keys("Enter");
    await app.browser.waitUntil(
      async () => {
        const a = (await $$('[data-testid="message"][data-role="model"]'))[0];
        return a && (await a.$('[data-testid="stats"]').isExisting());
      },
      { timeout: 300_000, interval: 200, timeoutMsg: "the answer never finished" },
    );
    const answer = (await $$('[data-testid="message"][data-role="model"]'))[0];
    const stats = await (await answer.$('[data-testid="stats"]')).getText();
    out.decode.push(figure(stats, "decode"));
    out.prefill.push(figure(stats, "prefill"));
    out.tokens.push(figure(stats, "tokens"));
  }
} finally {
  await app.close();
}
console.log(JSON.stringify(out));
