// What the Download section shows: repository ids it accepts, and progress as percentage,
// speed and time left. Pure functions, so they are unit-tested; the panel only renders them.

import type { DownloadUpdate } from "./api";
import { formatBytes } from "./format";

const PART = /^(?!\.)[A-Za-z0-9._-]+$/;

/**
 * `owner/name[:QUANT][@revision]`, as the engine accepts it (its `source::hub_id`; the tests
 * check this against examples generated from it).
 */
export function isRepoId(s: string): boolean {
  const [head, revision, ...rest] = s.trim().split("@");
  if (rest.length || revision === "") return false;
  const [repo, quant, ...more] = head.split(":");
  if (more.length || quant === "") return false;
  const parts = repo.split("/");
  return parts.length === 2 && parts.every((p) => PART.test(p));
}

/** Percent done with one decimal, clamped to 0–100; 0 while the total is unknown. */
export function percent(done: number, total: number): number {
  if (!(total > 0) || !(done > 0)) return 0;
  return Math.min(100, Math.floor((done / total) * 1000) / 10);
}

/** "1.50 MiB/s", or "–" before the speed is known. */
export function formatSpeed(bytesPerSec: number | null): string {
  if (bytesPerSec === null || !Number.isFinite(bytesPerSec) || bytesPerSec < 0) return "–";
  return `${formatBytes(Math.round(bytesPerSec))}/s`;
}

/** Time left: "45 s", "3 min 05 s", "2 h 07 min", or "–" when unknown. */
export function formatEta(secs: number | null): string {
  if (secs === null || !Number.isFinite(secs) || secs < 0) return "–";
  const s = Math.ceil(secs);
  if (s < 60) return `${s} s`;
  const pad = (n: number) => String(n).padStart(2, "0");
  if (s < 3600) return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} min`;
}

/** The line under the progress bar. */
export function progressLine(u: DownloadUpdate): string {
  const pct = percent(u.done, u.total).toFixed(1);
  return `${pct} % · ${formatBytes(u.done)} of ${formatBytes(u.total)} · ${formatSpeed(u.bytes_per_sec)} · ${formatEta(u.eta_secs)} left`;
}

/** The file line: which file and how far it is. */
export function fileLine(u: DownloadUpdate): string {
  return `${u.file} (${formatBytes(u.file_done)} of ${formatBytes(u.file_total)})`;
}

/** Whether a failed download should offer the offline model: the Hub could not be reached. */
export function offerOffline(code: string | undefined): boolean {
  return code === "network";
}
