// Find an item by queue and id, and show it in full (peek: nothing is leased).

import { ApiError, get, q } from "../api.js";
import { esc } from "../format.js";
import { itemPanel } from "./item.js";

export async function mount(root, args, ctx) {
  const list = await get("/v1/queues");
  root.innerHTML = `<h1>Find an item</h1>
    <form id="find" class="toolbar">
      <label>Queue <input id="find-queue" list="queue-names" required value="${esc(args.queue || "")}"></label>
      <datalist id="queue-names">${list.queues.map((qi) => `<option value="${esc(qi.name)}">`).join("")}</datalist>
      <label>Id <input id="find-id" type="number" min="0" required value="${esc(args.id || "")}"></label>
      <button class="primary" type="submit">Find</button>
    </form>
    <div id="result"></div>`;
  const result = root.querySelector("#result");
  async function lookup() {
    const queue = root.querySelector("#find-queue").value.trim();
    const id = root.querySelector("#find-id").value.trim();
    try {
      const item = await get(`/v1/queues/${q(queue)}/items/${id}?values=true`);
      result.replaceChildren(itemPanel(item));
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        result.innerHTML = `<p class="error" id="not-found">${esc(err.message)}</p>`;
      } else throw err;
    }
  }
  root.querySelector("#find").addEventListener("submit", (e) => {
    e.preventDefault();
    history.replaceState(null, "", `#/find?queue=${q(root.querySelector("#find-queue").value.trim())}&id=${q(root.querySelector("#find-id").value.trim())}`);
    lookup().catch(ctx.report);
  });
  if (args.queue && args.id) await lookup();
  return null;
}
