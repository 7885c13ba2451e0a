// One queue: live figures, pause/resume and purge (each confirmed), and tabs for its
// charts, items, leased items, dead letters, busiest groups and settings.

import { ApiError, del, get, post, q } from "../api.js";
import { confirmAction } from "../dialog.js";
import { bytes, duration, esc, num, rate, time } from "../format.js";
import { groupsTable } from "./groups.js";
import { historyCharts } from "./history.js";
import { browser } from "./items.js";
import { deadLetterQueueOf, rows } from "./model.js";
import { settingsForm } from "./settings.js";

const TABS = [["overview", "Charts"], ["items", "Items"], ["leased", "Leased"], ["dead", "Dead letters"], ["groups", "Groups"], ["settings", "Settings"]];

// the queue has a delivery rule set (docs/delivery.md)
function hasRules(c) {
  return Boolean(c && (c.group_limit || c.leased_limit || c.fair || c.rate_limit));
}

export async function mount(root, { name, tab }, ctx) {
  const href = (t) => `#/queue/${encodeURIComponent(name)}/${t}`;
  root.innerHTML = `
    <h1><a href="#/">Queues</a> / <span id="qname">${esc(name)}</span><span id="badges"></span></h1>
    <div class="toolbar"><button id="pause" class="write"></button><button id="purge" class="danger write">Purge…</button>
      <span class="read-note muted">Signed in with a read-only token: actions are hidden.</span></div>
    <div class="cards" id="cards"></div>
    <nav class="tabs">${TABS.map(([t, label]) => `<a href="${href(t)}" data-tab="${t}" class="${t === tab ? "active" : ""}">${label}</a>`).join("")}</nav>
    <section id="tab"></section>`;
  const tabRoot = root.querySelector("#tab");
  let info = null;
  let row = null;
  let child = null;

  // Whether this queue is some queue's dead-letter queue needs the full list: read it
  // once, in the background (the badge and the Dead letters tab use it); each refresh
  // reads only this queue and its own dead-letter queue, whatever the number of queues.
  let isDlq = name.endsWith(".dlq");
  const dlqCheck = get("/v1/queues").then((list) => {
    isDlq = rows(list.queues).find((r) => r.name === name)?.isDlq ?? isDlq;
    if (row) drawHeader();
  }).catch(() => {});

  async function loadInfo() {
    info = await get(`/v1/queues/${q(name)}`);
    const dlqName = deadLetterQueueOf(info);
    const dlq = dlqName ? await get(`/v1/queues/${q(dlqName)}`).catch((err) => {
      if (err instanceof ApiError && err.status === 404) return null; // not created yet
      throw err;
    }) : null;
    row = { ...rows(dlq ? [info, dlq] : [info])[0] };
    drawHeader();
  }

  function drawHeader() {
    row.isDlq = row.isDlq || isDlq;
    // "paused since": the server keeps the time of the pause with it (state.json)
    const since = row.paused && row.pausedSince
      ? ` <span id="paused-since" class="muted">since ${time(row.pausedSince)} (${duration(Date.now() - row.pausedSince)} ago)</span>`
      : "";
    root.querySelector("#badges").innerHTML = (row.paused ? `<span class="badge paused">paused</span>${since}` : "") +
      (row.isDlq ? `<span class="badge dlq">DLQ</span>` : "");
    const pause = root.querySelector("#pause");
    pause.textContent = row.paused ? "Resume…" : "Pause…";
    pause.dataset.action = row.paused ? "resume" : "pause";
    root.querySelector("#cards").innerHTML = [
      ["Due", num(row.due)], ["Delayed", num(row.delayed)], ["Leased", num(row.leased)],
      ...(row.held > 0 || hasRules(info.config) ? [["Held back", num(row.held), row.held > 0]] : []),
      ["Dead letters", row.dlq ? num(row.dead) : "–", row.dead > 0], ["Oldest due", duration(row.oldest)],
      ["Enqueued/s", rate(row.enq)], ["Dequeued/s", rate(row.deq)], ["Released/s", rate(row.rel)],
      ["Segments", num(row.segments)], ["On disk", bytes(row.bytes)],
    ].map(([l, v, alert]) => `<div class="card${alert ? " alert" : ""}" data-stat="${l.toLowerCase()}"><div class="label">${l}</div><div class="value">${v}</div></div>`).join("");
  }

  async function mountTab() {
    if (tab === "overview") {
      const draw = async () => tabRoot.replaceChildren(await historyCharts(name, 3600));
      await draw();
      return { refresh: draw };
    }
    if (tab === "items" || tab === "leased") return browser(tabRoot, name, { mode: tab, info, ctx });
    if (tab === "groups") return groupsTable(tabRoot, name);
    if (tab === "dead") {
      await dlqCheck;
      drawHeader();
      if (row.isDlq) return browser(tabRoot, name, { mode: "dead", info, ctx });
      tabRoot.innerHTML = row.dlq
        ? `<p>Items delivered ${num(info.config.max_deliveries)} times without a release move to
           <a href="#/queue/${encodeURIComponent(row.dlq)}/dead">${esc(row.dlq)}</a> (${num(row.dead ?? 0)} there now).</p>`
        : `<p class="muted">This queue has no dead-letter queue (set max deliveries in Settings).</p>`;
      return null;
    }
    return settingsForm(tabRoot, name, info, ctx, loadInfo);
  }

  root.querySelector("#pause").addEventListener("click", async (e) => {
    const action = e.target.dataset.action;
    const ok = await confirmAction({
      title: `${action === "pause" ? "Pause" : "Resume"} ${name}?`,
      message: action === "pause"
        ? `Consumers of ${name} get nothing until it is resumed; producers can still enqueue.`
        : `Consumers of ${name} get due items again.`,
      ok: action === "pause" ? "Pause" : "Resume",
    });
    if (!ok) return;
    try {
      await post(`/v1/queues/${q(name)}/${action}`);
      ctx.status(`${name} ${action === "pause" ? "paused" : "resumed"}`);
      await loadInfo();
    } catch (err) { ctx.report(err); }
  });

  root.querySelector("#purge").addEventListener("click", async () => {
    const ok = await confirmAction({
      title: `Purge ${name}?`,
      message: `Every item in ${name} is removed, leased ones too. This cannot be undone.`,
      ok: "Purge",
      typed: name,
    });
    if (!ok) return;
    try {
      const answer = await del(`/v1/queues/${q(name)}/items`);
      ctx.status(`purged ${num(answer.purged)} item${answer.purged === 1 ? "" : "s"} from ${name}`);
      await loadInfo();
      await child?.refresh?.();
    } catch (err) { ctx.report(err); }
  });

  await loadInfo();
  child = await mountTab();
  return {
    async refresh() {
      await loadInfo();
      if (child?.refresh && !document.getElementById("confirm").open) await child.refresh();
    },
  };
}
