// Hostile input in the real app: a restored session whose messages hold <script>, <img
// onerror>, javascript: and data: links, SVG with script and images pointing off-machine runs
// nothing and loads nothing (a local trap server stands in for "off-machine" and counts every
// request), its links open nothing, and the CSP blocks inline script and remote images even
// when they are put in the page; a corrupt session file beside it is set aside and reported;
// and PDFs that overflow the parser's stack or make it loop come back as their codes while the
// window stays responsive and the conversation stays whole. Each fault prints a HOSTILE line
// for scripts/hostile.sh.

import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { ARTIFACTS, dropFile, invokeInPage, launchApp } from "./driver.mjs";

const FIXTURES = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "documents");
const DATA_DIR = mkdtempSync(path.join(os.tmpdir(), "kvlab-e2e-hostile-"));
const SESSIONS = path.join(DATA_DIR, "sessions");
const TIMEOUT_MS = 3000;

let app;
let trap;
const hits = [];
let T = "";

const row = (fault, outcome) => process.stdout.write(`HOSTILE ${fault} -> ${outcome}\n`);
const $ = (sel) => app.browser.$(sel);
const $$ = (sel) => app.browser.$$(sel);

/** The hostile answers, by what they try. */
function payloads() {
  const pwn = (tag) => `window.__pwned='${tag}';fetch('${T}/ran/${tag}')`;
  return {
    "<script>": `Before<script>${pwn("script")}</script>after`,
    "<img onerror>": `<img src="${T}/img.png" onerror="${pwn("img")}"> and <img src=x onerror="${pwn("img2")}">`,
    "javascript: link": `[click me](javascript:${pwn("jslink")}) and <a href="javascript:${pwn("jsa")}">raw</a>`,
    "data: link": `[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==) and <a href="data:text/html,<script>${pwn("data")}</script>">raw</a>`,
    "SVG with script": `<svg onload="${pwn("svgload")}"><script>${pwn("svg")}</script><image href="${T}/svg.png"/><a href="javascript:${pwn("svga")}"><text>x</text></a></svg>`,
    "markdown image off-machine": `![tracker](${T}/track.png) and ![ref][t]\n\n[t]: ${T}/track2.png`,
    "iframe, style, link, ping": `<iframe src="${T}/frame"></iframe><style>@import url(${T}/css);</style><link rel="prefetch" href="${T}/prefetch"><div style="background:url(${T}/bg)">bg</div><a href="https://example.com/" ping="${T}/ping">pinged</a>`,
    "links to the web": `[a local server](${T}/click) and [the web](https://example.com/path)`,
  };
}

function hostileSession() {
  const messages = [];
  for (const [what, content] of Object.entries(payloads())) {
    messages.push({ id: `u-${messages.length}`, role: "user", content: `<script>${"window.__pwned='user'"}</script> show me ${what}`, thinking: "", streaming: false });
    messages.push({
      id: `m-${messages.length}`,
      role: "model",
      content,
      thinking: `<img src="${T}/think.png" onerror="window.__pwned='thinking'">`,
      streaming: false,
      error: { code: "internal", message: `<img src="${T}/err.png" onerror="window.__pwned='error'">` },
    });
  }
  return {
    id: "hostile",
    title: `<img src="${T}/title.png" onerror="window.__pwned='title'">`,
    created_ms: 1,
    updated_ms: Date.now(),
    model_path: "",
    system: "",
    settings: { temperature: 0.7, top_p: 0.95, max_tokens: 64, thinking: false },
    cache_spec: "f16",
    messages,
    timeline: { samples: [], markers: [] },
  };
}

before(async () => {
  trap = http.createServer((req, res) => {
    hits.push(req.url);
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("trap");
  });
  await new Promise((r) => trap.listen(0, "127.0.0.1", r));
  T = `http://127.0.0.1:${trap.address().port}`;
  mkdirSync(SESSIONS, { recursive: true });
  writeFileSync(path.join(SESSIONS, "hostile.json"), JSON.stringify(hostileSession(), null, 2));
  const whole = JSON.stringify({ id: "broken", title: "Broken", updated_ms: 5, messages: [] });
  writeFileSync(path.join(SESSIONS, "broken.json"), whole.slice(0, whole.length / 2));
  // No default model: nothing here needs one, and the window must work without it.
  app = await launchApp({
    env: { KVLAB_DATA_DIR: DATA_DIR, KVLAB_DEFAULT_MODEL: "", KVLAB_DOCUMENT_TIMEOUT_MS: String(TIMEOUT_MS) },
  });
  const count = hostileSession().messages.length;
  await app.browser.waitUntil(async () => (await $$('[data-testid="message"]')).length === count, {
    timeout: 30_000,
    timeoutMsg: "the hostile session was not restored",
  });
  // Give anything that could load or run the time to do it.
  await app.browser.pause(1500);
});

after(async () => {
  await app?.close();
  trap?.close();
});

async function pageState() {
  return app.browser.execute(() => ({
    pwned: window.__pwned ?? null,
    href: location.href,
    origin: location.origin,
    resources: performance.getEntriesByType("resource").map((e) => e.name),
  }));
}

test("a restored session's hostile messages run nothing and load nothing", async () => {
  const state = await pageState();
  assert.equal(state.pwned, null, "a payload ran");
  assert.deepEqual(hits, [], "a request reached the trap server");
  const foreign = state.resources.filter((u) => !u.startsWith(state.origin) && !u.startsWith("ipc:") && !u.startsWith("http://ipc.localhost"));
  assert.deepEqual(foreign, [], "resources from outside the app");
  const found = await app.browser.execute(() => {
    const answers = [...document.querySelectorAll('[data-testid="answer"]')];
    const bad = answers.flatMap((a) => [...a.querySelectorAll("script, img, svg, iframe, style, link, object, embed, [onerror], [onload], [style], [ping]")]);
    const hrefs = answers.flatMap((a) => [...a.querySelectorAll("a")].map((l) => l.getAttribute("href")));
    const users = [...document.querySelectorAll('[data-testid="message"][data-role="user"]')].map((u) => u.textContent);
    return { bad: bad.map((e) => e.outerHTML), hrefs, users, texts: answers.map((a) => a.textContent) };
  });
  assert.deepEqual(found.bad, []);
  for (const h of found.hrefs) assert.ok(h === null || /^(https?:|mailto:|#)/.test(h), `link kept: ${h}`);
  // What the links say is still there, as text; the user's own words show as typed.
  assert.ok(found.texts.some((t) => t.includes("Beforeafter")), JSON.stringify(found.texts));
  assert.ok(found.users.every((u) => u.includes("<script>")), "a user message is shown as text");
  const title = await app.browser.execute(() => document.querySelector('[data-testid="session"][data-id="hostile"] .title')?.textContent);
  assert.equal(title, hostileSession().title, "the title is shown as text");
  await app.browser.saveScreenshot(path.join(ARTIFACTS, "hostile-session.png"));
  for (const what of Object.keys(payloads())) row(`webview message with ${what}`, "not_run");
});

test("links in an answer open nothing: the window stays on the app and no request leaves", async () => {
  const before = await pageState();
  const links = await $$('[data-testid="answer"] a');
  assert.ok(links.length >= 3, `${links.length} links survived to be clicked`);
  for (const link of links) {
    await link.scrollIntoView();
    await link.click();
  }
  await app.browser.pause(1000);
  const after = await pageState();
  assert.equal(after.href, before.href, "the web view navigated");
  assert.equal((await app.browser.getWindowHandles()).length, 1, "a window opened");
  assert.equal(after.pwned, null);
  assert.deepEqual(hits, []);
  row(`webview link clicks x${links.length}`, "not_followed");
});

test("the CSP blocks inline script and remote images put into the page", async () => {
  await app.browser.execute((t) => {
    const s = document.createElement("script");
    s.textContent = "window.__pwned = 'inline'";
    document.body.append(s);
    const img = document.createElement("img");
    img.src = `${t}/csp.png`;
    document.body.append(img);
  }, T);
  await app.browser.pause(1000);
  assert.equal((await pageState()).pwned, null, "an inline script ran");
  assert.deepEqual(hits, [], "a remote image loaded");
  row("webview inline <script> and remote <img> injected into the DOM", "blocked_by_csp");
});

test("a corrupt session file is set aside and reported; the other session loads", async () => {
  const notice = await $('[data-testid="session-unreadable"]');
  await notice.waitForDisplayed({ timeout: 10_000 });
  assert.match(await notice.getText(), /broken\.json is corrupt \(truncated: .*\); it was set aside as broken\.json\.corrupt-\d+/);
  const files = readdirSync(SESSIONS);
  assert.ok(!files.includes("broken.json"));
  const aside = files.find((f) => f.startsWith("broken.json.corrupt-"));
  assert.ok(aside, files.join(", "));
  assert.ok(existsSync(path.join(SESSIONS, "hostile.json")));
  assert.equal((await $$('[data-testid="session"]')).length, 1);
  row("session file truncated, found at start", "session_corrupt");
});

/** Drops a file named `name` holding `bytes` on the window (see the driver's dropFile). */
const drop = (name, bytes) => dropFile(app.browser, name, bytes);

async function conversation() {
  return app.browser.execute(() => [...document.querySelectorAll('[data-testid="message"]')].map((m) => m.textContent));
}

test("a PDF that overflows the parser's stack is refused as document_crashed; the conversation is intact", async () => {
  const before = await conversation();
  await drop("deep-recursion.pdf", readFileSync(path.join(FIXTURES, "deep-recursion.pdf")));
  const notice = await $('[data-testid="doc-notice"]');
  await notice.waitForDisplayed({ timeout: 15_000 });
  assert.match(await notice.getText(), /^deep-recursion\.pdf: the document reader crashed on it \(a stack overflow/);
  assert.deepEqual(await conversation(), before);
  assert.equal((await $$('[data-testid="attachment"]')).length, 0);
  // The app is whole: a command round-trips, and the status bar still reads.
  const info = await invokeInPage(app.browser, "system_info");
  assert.equal(info.ok, true, JSON.stringify(info.error));
  row("document deep-recursion.pdf dropped on the window", "document_crashed");
});

test("a PDF that makes the parser loop stops at the time limit while the window stays responsive", async () => {
  const before = await conversation();
  const started = Date.now();
  await drop("endless-loop.pdf", readFileSync(path.join(FIXTURES, "endless-loop.pdf")));
  // While the reader spins: a command answers at once and a text box takes typing.
  const t0 = Date.now();
  const info = await invokeInPage(app.browser, "system_info");
  const roundTrip = Date.now() - t0;
  assert.equal(info.ok, true);
  assert.ok(roundTrip < 1000, `system_info took ${roundTrip} ms while a document was read`);
  const box = await $('[data-testid="system-prompt"]');
  await box.setValue("still here");
  assert.equal(await box.getValue(), "still here");
  const notice = await $('[data-testid="doc-notice"]');
  await app.browser.waitUntil(async () => /endless-loop\.pdf/.test(await notice.getText()), {
    timeout: TIMEOUT_MS + 10_000,
    timeoutMsg: "no refusal for the looping PDF",
  });
  const took = Date.now() - started;
  assert.match(await notice.getText(), /^endless-loop\.pdf: reading it took longer than 3\.0 s/);
  assert.ok(took >= TIMEOUT_MS && took < TIMEOUT_MS + 5000, `refused after ${took} ms`);
  assert.ok(Date.now() - t0 > roundTrip, "the check ran while the reader was busy");
  assert.deepEqual(await conversation(), before);
  await box.clearValue();
  row(`document endless-loop.pdf dropped on the window (${(took / 1000).toFixed(1)} s)`, "document_timeout");
});
