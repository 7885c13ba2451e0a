// Formatting helpers: numbers, durations, times, bytes, and values as text or hex.

export const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

export function rate(r) {
  if (r === null || r === undefined) return "–";
  if (r === 0) return "0";
  return r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(r >= 10 ? 1 : 2);
}

export function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  const sign = ms < 0 ? "-" : "";
  ms = Math.abs(ms);
  if (ms < 1000) return `${sign}${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${sign}${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = s / 60;
  if (m < 60) return `${sign}${m.toFixed(m < 10 ? 1 : 0)} min`;
  const h = m / 60;
  if (h < 48) return `${sign}${h.toFixed(1)} h`;
  return `${sign}${(h / 24).toFixed(1)} d`;
}

export function time(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// The raw bytes of an item value as the API sent it (text or base64).
export function valueBytes(value, encoding) {
  if (encoding === "base64") return Uint8Array.from(atob(value), (c) => c.charCodeAt(0));
  return new TextEncoder().encode(value);
}

export function hexdump(data, limit) {
  const lines = [];
  const n = Math.min(data.length, limit);
  for (let off = 0; off < n; off += 16) {
    const row = data.subarray(off, Math.min(off + 16, n));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${off.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n");
}

// Escape text for innerHTML templates.
export function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
