// Find an item by queue and id, or by its key, and show it in full (peek: nothing is
// leased). Found by key and still waiting, it can be rescheduled or cancelled by that
// key (a leased one answers item_leased, which is shown).

import { ApiError, api, del, get, q } from "../api.js";
import { confirmAction } from "../dialog.js";
import { esc } from "../format.js";
import { itemPanel } from "./item.js";

export async function mount(root, args, ctx) {
  const list = await get("/v1/queues");
  root.innerHTML = `<h1>Find an item</h1>
    <form id="find" class="toolbar">
      <label>Queue <input id="find-queue" list="queue-names" required value="${esc(args.queue || "")}"></label>
      <datalist id="queue-names">${list.queues.map((qi) => `<option value="${esc(qi.name)}">`).join("")}</datalist>
      <label>Id <input id="find-id" type="number" min="0" value="${esc(args.id || "")}"></label>
      <label>or key <input id="find-key" value="${esc(args.key || "")}"></label>
      <button class="primary" type="submit">Find</button>
    </form>
    <div id="result"></div>`;
  const result = root.querySelector("#result");
  const field = (id) => root.querySelector(id).value.trim();

  // By key, a waiting item can be rescheduled or cancelled through that key.
  function keyActions(queue, key, item) {
    const bar = document.createElement("div");
    bar.className = "toolbar";
    bar.id = "key-actions";
    bar.innerHTML = `<label>Due in <input id="reschedule-s" type="number" min="0" value="60"> s</label>
      <button id="reschedule" class="write">Reschedule</button>
      <button id="cancel-key" class="write">Cancel…</button>
      <span id="key-note" class="muted"></span>`;
    const path = `/v1/queues/${q(queue)}/keys/${q(key)}`;
    const note = bar.querySelector("#key-note");
    const run = (action) => action().then(lookup).catch((err) => {
      if (err instanceof ApiError) note.textContent = `not done: ${err.message}`;
      else ctx.report(err);
    });
    bar.querySelector("#reschedule").addEventListener("click", () => run(() =>
      api("PATCH", path, { delay_ms: Math.round(Number(field("#reschedule-s")) * 1000) })));
    bar.querySelector("#cancel-key").addEventListener("click", () => run(async () => {
      const sure = await confirmAction({
        title: "Cancel this item?",
        message: `Item ${item.id} of ${queue} (key ${key}) is removed and will not be delivered.`,
        ok: "Cancel the item",
      });
      if (sure) await del(path);
    }));
    return bar;
  }

  async function lookup() {
    const queue = field("#find-queue");
    const id = field("#find-id");
    const key = field("#find-key");
    if (!key && !id) {
      result.innerHTML = `<p class="error" id="not-found">Give the item's id or its key.</p>`;
      return;
    }
    try {
      const item = key
        ? await get(`/v1/queues/${q(queue)}/keys/${q(key)}?values=true`)
        : await get(`/v1/queues/${q(queue)}/items/${id}?values=true`);
      const panel = itemPanel(item);
      if (key && (item.state === "due" || item.state === "delayed")) {
        result.replaceChildren(keyActions(queue, key, item), panel);
      } else result.replaceChildren(panel);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        result.innerHTML = `<p class="error" id="not-found">${esc(err.message)}</p>`;
      } else throw err;
    }
  }
  root.querySelector("#find").addEventListener("submit", (e) => {
    e.preventDefault();
    const by = field("#find-key") ? `key=${q(field("#find-key"))}` : `id=${q(field("#find-id"))}`;
    history.replaceState(null, "", `#/find?queue=${q(field("#find-queue"))}&${by}`);
    lookup().catch(ctx.report);
  });
  if (args.queue && (args.id || args.key)) await lookup();
  return null;
}
