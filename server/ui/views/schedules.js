// Schedules: every queue's schedules with their next runs, the last tick fired, how many
// and how late; pause, resume and run now (each confirmed). A page at a time from
// GET /v1/schedules, so a server with 100,000 schedules costs one page per refresh.

import { get, post, q } from "../api.js";
import { confirmAction } from "../dialog.js";
import { duration, esc, num, time } from "../format.js";

const PAGE = 100;

function when(s) {
  const zone = s.timezone === "UTC" ? "UTC" : esc(s.timezone);
  if (s.cron) return `<code>${esc(s.cron)}</code> <span class="muted">${zone}</span>`;
  if (s.every_ms) return `every ${duration(s.every_ms)}`;
  return `once, ${time(s.at)}`;
}

function nextRuns(s, now) {
  if (s.paused) return `<span class="muted">paused</span>`;
  if (!s.next.length) return `<span class="muted">none: it has fired its last</span>`;
  const all = s.next.map(time).join("\n");
  const first = s.next[0];
  return `<span title="${esc(all)}">${time(first)} <span class="muted">(in ${duration(first - now)})</span></span>`;
}

function row(s, now) {
  const key = `${s.queue}/${s.name}`;
  const badge = s.paused ? `<span class="badge paused">paused</span>` : "";
  const toggle = s.paused ? "resume" : "pause";
  return `<tr data-schedule="${esc(key)}">
    <td class="text"><a href="#/queue/${encodeURIComponent(s.queue)}/items">${esc(s.queue)}</a></td>
    <td class="text">${esc(s.name)}${badge}</td>
    <td class="text">${when(s)}</td>
    <td class="text" data-col="next">${nextRuns(s, now)}</td>
    <td class="text" data-col="last">${s.last_tick === null ? "–" : time(s.last_tick)}</td>
    <td data-col="fired">${num(s.fired)}</td>
    <td data-col="lateness">${duration(s.lateness_ms)}</td>
    <td class="text write"><button data-action="${toggle}">${toggle === "pause" ? "Pause…" : "Resume…"}</button>
      <button data-action="run">Run now…</button></td></tr>`;
}

export async function mount(root, args, ctx) {
  root.innerHTML = `<h1>Schedules</h1>
    <div class="toolbar"><span class="muted">Each tick enqueues one item into its queue, its deadline the tick.</span>
      <span class="spacer"></span>
      <span class="pager"><button id="prev">‹ Prev</button><span id="page"></span><button id="next">Next ›</button></span></div>
    <table id="schedules"><thead><tr><th class="text">Queue</th><th class="text">Schedule</th>
      <th class="text">When</th><th class="text">Next run</th><th class="text">Last fired</th>
      <th>Fired</th><th>Lateness</th><th class="text write">Actions</th></tr></thead><tbody></tbody></table>`;
  const tbody = root.querySelector("tbody");
  // the cursor of each page seen so far: "Prev" goes back to the one before
  const cursors = [null];
  let page = 0;
  let more = null;

  async function refresh() {
    const after = cursors[page];
    const data = await get(`/v1/schedules?limit=${PAGE}${after ? `&after=${q(after)}` : ""}`);
    more = data.next;
    const now = Date.now();
    tbody.innerHTML = data.schedules.map((s) => row(s, now)).join("") ||
      `<tr><td colspan="8" class="muted">No schedules. Make one with PUT /v1/queues/{queue}/schedules/{name} or dq schedule put.</td></tr>`;
    root.querySelector("#page").textContent = ` page ${page + 1} `;
    root.querySelector("#prev").disabled = page === 0;
    root.querySelector("#next").disabled = !more;
  }

  root.querySelector("#prev").addEventListener("click", async () => {
    if (page > 0) { page -= 1; await refresh().catch(ctx.report); }
  });
  root.querySelector("#next").addEventListener("click", async () => {
    if (!more) return;
    cursors[page + 1] = more;
    page += 1;
    await refresh().catch(ctx.report);
  });

  tbody.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const [queue, ...rest] = button.closest("tr").dataset.schedule.split("/");
    const name = rest.join("/");
    const action = button.dataset.action;
    const words = {
      pause: ["Pause schedule", `Schedule ${name} of queue ${queue} fires nothing until resumed.`, "Pause"],
      resume: ["Resume schedule", `Schedule ${name} fires again from its next tick (the ticks that passed while paused do not fire).`, "Resume"],
      run: ["Run now", `Enqueue one item of schedule ${name} into queue ${queue} now, outside its ticks.`, "Run"],
    }[action];
    if (!(await confirmAction({ title: words[0], message: words[1], ok: words[2] }))) return;
    try {
      const answer = await post(`/v1/queues/${q(queue)}/schedules/${q(name)}/${action}`);
      ctx.status(action === "run"
        ? `schedule ${name}: item ${answer.id} enqueued into ${queue}`
        : `schedule ${name} ${action === "pause" ? "paused" : "resumed"}`);
      await refresh();
    } catch (err) {
      ctx.report(err);
    }
  });

  await refresh();
  return { refresh };
}
