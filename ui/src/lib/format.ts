// Human-readable numbers for the UI: bytes in binary units, rates, durations.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** Formats a byte count with binary units and three significant digits ("1.50 GiB"). */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return "–";
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${value} B`;
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/** Formats a rate such as tokens per second ("41.3 tok/s"). */
export function formatRate(perSecond: number, unit = "tok/s"): string {
  if (!Number.isFinite(perSecond) || perSecond < 0) return "–";
  const digits = perSecond >= 100 ? 0 : 1;
  return `${perSecond.toFixed(digits)} ${unit}`;
}
