// Depth and rate charts from the server's bounded history (GET /v1/history).

import { get, q } from "../api.js";
import { lineChart } from "../chart.js";

export const WINDOWS = [[900, "15 min"], [3600, "1 hour"]];

export async function historyCharts(queue, seconds) {
  const path = `/v1/history?seconds=${seconds}${queue ? `&queue=${q(queue)}` : ""}`;
  const h = await get(path);
  const box = document.createElement("div");
  box.className = "charts";
  // A server up for less than the window shows its whole history across the chart.
  const now = Date.now();
  const span = { from: Math.max(now - seconds * 1000, h.t.length ? h.t[0] : now), to: now };
  box.append(
    lineChart("Depth by state", h.t, [
      { name: "due", color: "var(--due)", values: h.due },
      { name: "delayed", color: "var(--delayed)", values: h.delayed },
      { name: "leased", color: "var(--leased)", values: h.leased },
    ], { ...span, integers: true }),
    lineChart("Rates (items/s)", h.t, [
      { name: "enqueued", color: "#1f7a3d", values: h.enqueue_per_s },
      { name: "dequeued", color: "#2458c6", values: h.dequeue_per_s },
      { name: "released", color: "#b35c00", values: h.release_per_s },
    ], span),
  );
  if (queue && !h.tracked) {
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = `The server keeps per-queue history for its ${h.max_queues} busiest queues; ` +
      "this one is not among them right now (it still counts in the all-queues chart).";
    box.prepend(note);
  }
  return box;
}
