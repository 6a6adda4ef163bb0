// Starts tauri-driver (which starts WebKitWebDriver) and opens a WebDriver session on the
// real built app. Shared by every end-to-end test file.

import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, readdirSync, readlinkSync, realpathSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { remote } from "webdriverio";

const here = path.dirname(fileURLToPath(import.meta.url));
export const ARTIFACTS = process.env.KVLAB_E2E_ARTIFACTS ?? path.join(here, "artifacts");

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the end-to-end tests through scripts/test.sh`);
  return value;
}

function listening(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1", () => {
      socket.end();
      resolve(true);
    });
    socket.on("error", () => resolve(false));
  });
}

async function waitForPort(port, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await listening(port)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`tauri-driver did not listen on port ${port} within ${timeoutMs} ms`);
}

/**
 * The app's default model: `KVLAB_DEFAULT_MODEL` when set, else the offline Gemma 3 270M as
 * `kvlab-assets` locates it (the app itself links no asset code).
 */
function defaultModel() {
  if (process.env.KVLAB_DEFAULT_MODEL) return process.env.KVLAB_DEFAULT_MODEL;
  const root = path.join(here, "..", "..");
  return execFileSync("cargo", ["run", "--quiet", "-p", "kvlab-assets", "--", "path", "gemma3-270m"], {
    cwd: root,
    encoding: "utf8",
  }).trim();
}

/** Waits for a port to be free again (WebKitWebDriver can outlive tauri-driver briefly). */
async function waitForPortFree(port, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!(await listening(port))) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`port ${port} is still taken ${timeoutMs} ms after the driver stopped`);
}

/** PIDs of the running processes whose executable is `exe` (Linux's /proc; none elsewhere). */
function pidsOf(exe) {
  let real;
  try {
    real = realpathSync(exe);
  } catch {
    return [];
  }
  const pids = [];
  let entries = [];
  try {
    entries = readdirSync("/proc");
  } catch {
    return [];
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readlinkSync(`/proc/${entry}/exe`).replace(/ \(deleted\)$/, "") === real) pids.push(Number(entry));
    } catch {
      // Gone, or not ours to read.
    }
  }
  return pids;
}

/**
 * Waits up to `timeoutMs` for the app processes this launch started to exit, then kills the
 * rest. An app left behind (a failed deleteSession, a driver killed mid-close) keeps the
 * test runner's output pipe open, and `node --test` then never exits.
 */
async function reapApp(application, before, timeoutMs) {
  const ours = () => pidsOf(application).filter((p) => !before.has(p));
  const deadline = Date.now() + timeoutMs;
  while (ours().length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  for (const pid of ours()) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // Exited meanwhile.
    }
  }
}

/** Launches the app under WebDriver; returns the browser and a close function. */
export async function launchApp({ port = Number(process.env.KVLAB_E2E_PORT ?? 4444), env = {} } = {}) {
  const application = required("KVLAB_APP_BIN");
  const driverBin = process.env.TAURI_DRIVER ?? "tauri-driver";
  mkdirSync(ARTIFACTS, { recursive: true });
  const before = new Set(pidsOf(application));
  // A relaunch must not race the last launch's native driver (WebKitWebDriver) for its port.
  await waitForPortFree(port + 1, 20_000);
  const driver = spawn(driverBin, ["--port", String(port), "--native-port", String(port + 1)], {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, KVLAB_DEFAULT_MODEL: defaultModel(), ...env },
  });
  const exited = new Promise((resolve) => driver.on("exit", resolve));
  await waitForPort(port, 20_000);
  const browser = await remote({
    hostname: "127.0.0.1",
    port,
    logLevel: "error",
    capabilities: { "tauri:options": { application }, "wdio:enforceWebDriverClassic": true },
  });
  return {
    browser,
    async close() {
      await browser.deleteSession().catch(() => {});
      driver.kill();
      const stuck = setTimeout(() => driver.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(stuck);
      await reapApp(application, before, 5_000);
      await waitForPortFree(port + 1, 20_000);
    },
  };
}

/** Waits until the engine reports `ready`: the default model has loaded. */
export async function waitForReady(browser, timeout = 180_000) {
  const status = await browser.$('[data-testid="engine-status"]');
  await browser.waitUntil(async () => (await status.getAttribute("data-state")) === "ready", {
    timeout,
    timeoutMsg: "the default model did not load",
  });
}

/** Sets the number field `testid` as a user edit would: Svelte's bind:value listens to `input`. */
export async function setNumber(browser, testid, value) {
  await browser.execute(
    (id, v) => {
      const el = document.querySelector(`[data-testid="${id}"]`);
      el.value = String(v);
      el.dispatchEvent(new Event("input", { bubbles: true }));
    },
    testid,
    value,
  );
}

/** Calls a Tauri command from inside the page, as the UI would: `{ok, value}` or `{ok, error}`. */
export async function invokeInPage(browser, command, args = {}) {
  // WebDriver's execute awaits a returned promise; errors cross as plain JSON.
  return browser.execute(
    async (cmd, a) => {
      try {
        return { ok: true, value: await window.__TAURI_INTERNALS__.invoke(cmd, a) };
      } catch (error) {
        return { ok: false, error: JSON.parse(JSON.stringify(error ?? null)) };
      }
    },
    command,
    args,
  );
}

/** Drops a file named `name` holding `bytes` on the window, through the DOM drop path. */
export function dropFile(browser, name, bytes) {
  return browser.execute(
    (n, b) => {
      const dt = new DataTransfer();
      dt.items.add(new File([new Uint8Array(b)], n));
      document.querySelector(".app").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
    },
    name,
    Array.from(bytes),
  );
}
