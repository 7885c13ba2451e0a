// Depth and rates over time for all queues together, or for one picked queue.

import { get } from "../api.js";
import { esc } from "../format.js";
import { WINDOWS, historyCharts } from "./history.js";

export async function mount(root, args) {
  const state = { queue: args.queue || "", seconds: Number(args.seconds) || 3600 };
  const list = await get("/v1/queues");
  root.innerHTML = `
    <h1>Depth and rates over time</h1>
    <div class="toolbar">
      <label>Queue <select id="pick"><option value="">all queues</option>
        ${list.queues.map((qi) => `<option ${qi.name === state.queue ? "selected" : ""}>${esc(qi.name)}</option>`).join("")}
      </select></label>
      <label>Window <select id="window">${WINDOWS.map(([s, label]) =>
        `<option value="${s}" ${s === state.seconds ? "selected" : ""}>${label}</option>`).join("")}</select></label>
    </div>
    <div id="plots"></div>`;
  const plots = root.querySelector("#plots");
  const draw = async () => plots.replaceChildren(await historyCharts(state.queue || null, state.seconds));
  root.querySelector("#pick").addEventListener("change", (e) => { state.queue = e.target.value; draw(); });
  root.querySelector("#window").addEventListener("change", (e) => { state.seconds = Number(e.target.value); draw(); });
  await draw();
  return { refresh: draw };
}
