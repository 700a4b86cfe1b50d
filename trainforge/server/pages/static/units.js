// The pages' copy of trainforge/_internal/amounts.py's rule for bytes (the CLI and the server-rendered
// pages use that one; a browser test checks that the two agree): 512 B, 10.2 KiB, 21.5 GiB. Rounded
// half up by the same arithmetic as there.
const BYTE_UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB"];

export function fmtBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  if (Math.floor(n + 0.5) < 1024) return `${Math.floor(n + 0.5)} B`;
  let value = n;
  let shown = value;
  let unit = BYTE_UNITS[0];
  for (unit of BYTE_UNITS) {
    value /= 1024;
    shown = Math.floor(value * 10 + 0.5) / 10;
    if (shown < 1024) break;
  }
  return `${shown.toFixed(1)} ${unit}`;
}
