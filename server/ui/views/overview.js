// Queues overview: every queue's counts by state, oldest due age, rates and paused badge.
// One GET /v1/queues per refresh (never one request per queue); sorting and filtering
// happen here, and only one page of rows is in the DOM, so 1,000 queues stay cheap.

import { get } from "../api.js";
import { duration, esc, num, rate } from "../format.js";
import { rows, sortRows } from "./model.js";

const PAGE = 100;
const COLUMNS = [
  ["name", "Queue", "text"],
  ["due", "Due"],
  ["delayed", "Delayed"],
  ["leased", "Leased"],
  ["dead", "Dead letters"],
  ["oldest", "Oldest due"],
  ["enq", "Enqueued/s"],
  ["deq", "Dequeued/s"],
  ["rel", "Released/s"],
];

function cell(r, key) {
  switch (key) {
    case "name": {
      const href = `#/queue/${encodeURIComponent(r.name)}`;
      const badges = (r.paused ? `<span class="badge paused">paused</span>` : "") +
        (r.isDlq ? `<span class="badge dlq">DLQ</span>` : "");
      return `<a href="${esc(href)}">${esc(r.name)}</a>${badges}`;
    }
    case "dead": return r.dead ? `<span class="alert">${num(r.dead)}</span>` : num(r.dead);
    case "oldest": return duration(r.oldest);
    case "enq": case "deq": case "rel": return rate(r[key]);
    default: return num(r[key]);
  }
}

export async function mount(root, args) {
  const state = { key: args.sort || "name", asc: args.order !== "desc", page: 0, filter: "" };
  root.innerHTML = `
    <h1>Queues</h1>
    <div class="cards" id="totals"></div>
    <div class="toolbar">
      <input id="filter" type="search" placeholder="Filter by name" aria-label="Filter queues">
      <span class="spacer"></span>
      <span class="pager"><button id="prev">‹ Prev</button><span id="page"></span><button id="next">Next ›</button></span>
    </div>
    <table id="queues"><thead><tr>${COLUMNS.map(([k, label, cls]) =>
      `<th class="sortable ${cls || ""}" data-key="${k}">${label}</th>`).join("")}</tr></thead>
      <tbody></tbody></table>`;
  const tbody = root.querySelector("tbody");
  let data = [];

  function draw() {
    const f = state.filter.toLowerCase();
    const shown = sortRows(f ? data.filter((r) => r.name.toLowerCase().includes(f)) : data.slice(),
      state.key, state.asc);
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = shown.slice(state.page * PAGE, (state.page + 1) * PAGE);
    tbody.innerHTML = slice.map((r) => `<tr data-queue="${esc(r.name)}">${COLUMNS.map(([k, , cls]) =>
      `<td data-col="${k}" class="${cls || ""}">${cell(r, k)}</td>`).join("")}</tr>`).join("") ||
      `<tr><td colspan="${COLUMNS.length}" class="muted">No queues${f ? " match" : " yet"}.</td></tr>`;
    root.querySelector("#page").textContent =
      `${shown.length ? state.page * PAGE + 1 : 0}–${state.page * PAGE + slice.length} of ${shown.length}`;
    root.querySelector("#prev").disabled = state.page === 0;
    root.querySelector("#next").disabled = state.page >= pages - 1;
    for (const th of root.querySelectorAll("th[data-key]")) {
      th.classList.toggle("sorted", th.dataset.key === state.key);
      th.classList.toggle("asc", state.asc);
    }
    const sum = (k, list = data) => list.reduce((a, r) => a + (r[k] ?? 0), 0);
    const paused = data.filter((r) => r.paused).length;
    // Dead letters: every item waiting in a dead-letter queue. It stands out (and links
    // to the Dead letters view) as soon as there is one: each is work that failed.
    const dead = sum("pending", data.filter((r) => r.isDlq));
    const deadCard = `<a class="card${dead ? " alert" : ""}" data-total="dead letters" href="#/dead">
      <div class="label">Dead letters</div><div class="value">${num(dead)}</div></a>`;
    root.querySelector("#totals").innerHTML = [
      ["Queues", num(data.length)], ["Due", num(sum("due"))], ["Delayed", num(sum("delayed"))],
      ["Leased", num(sum("leased"))], ["Paused", num(paused)],
    ].map(([label, value]) => `<div class="card" data-total="${label.toLowerCase()}"><div class="label">${label}</div><div class="value">${value}</div></div>`).join("") + deadCard;
  }

  async function refresh() {
    const answer = await get("/v1/queues");
    data = rows(answer.queues);
    draw();
  }

  root.querySelector("thead").addEventListener("click", (e) => {
    const th = e.target.closest("th[data-key]");
    if (!th) return;
    if (state.key === th.dataset.key) state.asc = !state.asc;
    else { state.key = th.dataset.key; state.asc = th.dataset.key === "name"; }
    draw();
  });
  root.querySelector("#filter").addEventListener("input", (e) => {
    state.filter = e.target.value; state.page = 0; draw();
  });
  root.querySelector("#prev").addEventListener("click", () => { state.page -= 1; draw(); });
  root.querySelector("#next").addEventListener("click", () => { state.page += 1; draw(); });
  await refresh();
  return { refresh };
}
