// The server: version, data directory, fsync mode, disk use, segment counts and disk use
// per queue (largest first, one page), the shared-memory clients, and the history bounds.

import { get } from "../api.js";
import { bytes, duration, esc, num } from "../format.js";

const PAGE = 50;

export async function mount(root) {
  root.innerHTML = `<h1>Server</h1><div id="server-info"></div>
    <h2>Queues on disk</h2><p class="muted" id="disk-note"></p>
    <table id="disk"><thead><tr><th class="text">Queue</th><th>Segments</th><th>Frozen logs</th><th>On disk</th></tr></thead><tbody></tbody></table>
    <h2>Shared-memory clients</h2><div id="shm"></div>`;
  async function refresh() {
    const s = await get("/v1/server");
    const d = s.disk || {};
    const kv = [
      ["Version", esc(s.version)], ["Data directory", `<code>${esc(s.data_dir)}</code>`],
      ["Fsync", esc(s.fsync) + (s.fsync === "interval" ? ` (every ${num(s.fsync_interval_ms)} ms)` : "")],
      ["Up for", duration(s.uptime_ms)], ["Queues", num(s.queue_count)],
      ["Queue data", bytes(s.data_bytes)],
      ["Volume", `${bytes(d.used)} used of ${bytes(d.total)}, ${bytes(d.free)} free`],
      ["History", `every ${num(s.history?.interval_ms / 1000)} s for ${duration(s.history?.retention_ms)}, ` +
        `${num(s.history?.tracked_queues)} of at most ${num(s.history?.max_queues)} queues tracked one by one`],
    ];
    root.querySelector("#server-info").innerHTML =
      `<dl class="kv">${kv.map(([k, v]) => `<dt>${k}</dt><dd data-field="${k.toLowerCase()}">${v}</dd>`).join("")}</dl>`;
    const qs = s.queues.slice(0, PAGE);
    root.querySelector("#disk-note").textContent = s.queues.length > PAGE
      ? `The ${PAGE} largest of ${num(s.queues.length)} queues.` : "";
    root.querySelector("#disk tbody").innerHTML = qs.map((x) => `<tr data-queue="${esc(x.name)}">
      <td class="text">${esc(x.name)}</td><td>${num(x.segments)}</td><td>${num(x.frozen)}</td><td>${bytes(x.bytes_on_disk)}</td></tr>`).join("") ||
      `<tr><td colspan="4" class="muted">No queues.</td></tr>`;
    const shm = s.shm || {};
    root.querySelector("#shm").innerHTML = !shm.enabled
      ? `<p class="muted">The shared-memory fast path is off (DQ_SHM).</p>`
      : `<table id="shm-clients"><thead><tr><th class="text">Client</th><th>Pid</th><th class="text">Ring</th><th>Slots</th><th class="text">Queue</th></tr></thead><tbody>
        ${shm.clients.map((c) => `<tr><td class="text">#${num(c.number)}</td><td>${esc(c.pid ?? "–")}</td><td class="text"><code>${esc(c.shm)}</code></td><td>${num(c.capacity)}</td><td class="text">${esc(c.queue ?? "any")}</td></tr>`).join("") ||
        `<tr><td colspan="5" class="muted">No clients attached.</td></tr>`}</tbody></table>`;
  }
  await refresh();
  return { refresh };
}
