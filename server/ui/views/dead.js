// Dead-letter queues: every queue some queue dead-letters into (or named *.dlq), with
// how many items wait there and where they come from; open one to browse and redrive.

import { get } from "../api.js";
import { esc, num } from "../format.js";
import { deadLetterQueueOf, rows } from "./model.js";

export async function mount(root) {
  root.innerHTML = `<h1>Dead letters</h1>
    <table id="dlqs"><thead><tr><th class="text">Dead-letter queue</th><th class="text">Fed by</th><th>Items</th></tr></thead><tbody></tbody></table>`;
  const tbody = root.querySelector("tbody");
  async function refresh() {
    const list = (await get("/v1/queues")).queues;
    const feeders = new Map();
    for (const qi of list) {
      const dlq = deadLetterQueueOf(qi);
      if (dlq) feeders.set(dlq, [...(feeders.get(dlq) || []), qi.name]);
    }
    const dlqs = rows(list).filter((r) => r.isDlq);
    tbody.innerHTML = dlqs.map((r) => `<tr data-queue="${esc(r.name)}">
      <td class="text"><a href="#/queue/${encodeURIComponent(r.name)}/dead">${esc(r.name)}</a></td>
      <td class="text">${esc((feeders.get(r.name) || []).join(", ") || "–")}</td>
      <td data-col="pending">${r.pending ? `<span class="alert">${num(r.pending)}</span>` : "0"}</td></tr>`).join("") ||
      `<tr><td colspan="3" class="muted">No dead-letter queues. A queue gets one when its max deliveries is set.</td></tr>`;
  }
  await refresh();
  return { refresh };
}
