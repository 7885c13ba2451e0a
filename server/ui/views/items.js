// Browsing a queue's items by state with the server's cursor (50 a page, values left out
// until one item is opened), used by the Items, Leased and Dead letters tabs.
// Leased rows count down and turn amber when their lease is about to run out; dead
// letters show when they died, why (their last error, REASON_CHARS of it; the item's
// panel shows all its reasons) and a preview of their value (the server sends only the
// first PREVIEW_BYTES of each), and can be selected and redriven or deleted.

import { del, get, post, q } from "../api.js";
import { confirmAction } from "../dialog.js";
import { bytes, duration, esc, num, time, valueBytes } from "../format.js";
import { itemPanel } from "./item.js";

const PAGE = 50;
const SOON_MS = 10_000;
const PREVIEW_BYTES = 120;
const REASON_CHARS = 120;

// Why a dead letter died, on one line: its last error (a fail's, or "lease expired").
function reason(it) {
  const text = it.last_error;
  if (!text) return "–";
  const line = text.replace(/\s+/g, " ");
  return line.length > REASON_CHARS ? line.slice(0, REASON_CHARS) + "…" : line;
}

// A value's first bytes as one line: text as text, anything else as hex.
function preview(it) {
  if (it.value === undefined || it.value === null) return "–";
  const data = valueBytes(it.value, it.encoding);
  const more = it.value_size > data.length ? "…" : "";
  if (it.encoding === "base64") {
    return Array.from(data.subarray(0, 24), (b) => b.toString(16).padStart(2, "0")).join(" ") + (data.length > 24 ? " …" : more);
  }
  return it.value.replace(/\s+/g, " ") + more;
}

// When a dead letter died: the move to the dead-letter queue sets its requeue time
// (docs/http.md, "Dead letters"); an item enqueued there directly never died.
function died(it, now) {
  const at = it.dead_lettered_from ? it.stats?.requeue_time : null;
  return at ? `${time(at)} <span class="muted">(${duration(now - at)} ago)</span>` : "–";
}

export function expiringSoon(item, leaseMs, now) {
  if (!item.lease_expires) return false;
  return item.lease_expires - now <= Math.max(SOON_MS, 0.2 * leaseMs);
}

export async function browser(root, queue, { mode, info, ctx }) {
  const leaseMs = info.config?.default_lease_ms ?? 30_000;
  const state = { filter: mode === "leased" ? "leased" : "all", cursors: [null], page: 0, next: null };
  const selected = new Set();
  let items = [];
  const dead = mode === "dead";
  root.innerHTML = `
    <div class="toolbar">
      ${mode === "items" ? `<label>State <select id="state">
        ${["all", "due", "delayed", "leased"].map((s) => `<option>${s}</option>`).join("")}</select></label>` : ""}
      ${dead ? `<button id="redrive-selected" class="write" disabled>Redrive selected</button>
        <button id="redrive-all" class="primary write">Redrive all</button>
        <button id="delete-selected" class="write" disabled>Delete selected</button>` : ""}
      <span class="spacer"></span>
      <span class="pager"><button id="prev">‹ Prev</button><span id="page"></span><button id="next">Next ›</button></span>
    </div>
    <table class="items"><thead></thead><tbody></tbody></table>
    <div id="detail"></div>`;
  const head = dead ? ["", "Id", "From", "Died", "Reason", "Value", "Deliveries", "Size", ""]
    : mode === "leased" ? ["Id", "Lease expires", "Time left", "Deliveries", "Deadline", "Size"]
      : ["Id", "State", "Deadline", "Deliveries", "Size"];
  root.querySelector("thead").innerHTML = `<tr>${head.map((h, i) => `<th class="${i === 0 ? "text" : ""}">${h}</th>`).join("")}</tr>`;
  const tbody = root.querySelector("tbody");

  function row(it, now) {
    const st = it.stats || {};
    const open = `<a href="#" data-open="${it.id}">${num(it.id)}</a>`;
    if (dead) {
      return `<tr data-id="${it.id}" class="${selected.has(it.id) ? "selected" : ""}">
        <td><input type="checkbox" class="write" data-select="${it.id}" ${selected.has(it.id) ? "checked" : ""} aria-label="select ${it.id}"></td>
        <td>${open}</td><td class="text">${esc(it.dead_lettered_from ?? "–")}</td><td data-col="died">${died(it, now)}</td>
        <td class="text reason" data-col="reason" title="${esc(it.last_error ?? "")}">${esc(reason(it))}</td>
        <td class="text preview" data-col="value">${esc(preview(it))}</td>
        <td>${num(st.dequeue_count)}</td><td>${bytes(it.value_size)}</td>
        <td><button class="write" data-redrive="${it.id}">Redrive</button> <button class="write" data-delete="${it.id}">Delete</button></td></tr>`;
    }
    if (mode === "leased") {
      const soon = expiringSoon(it, leaseMs, now);
      return `<tr data-id="${it.id}" class="${soon ? "expiring" : ""}"><td>${open}</td>
        <td>${time(it.lease_expires)}</td><td class="left">${duration(it.lease_expires - now)}</td>
        <td>${num(st.dequeue_count)}</td><td>${time(it.deadline)}</td><td>${bytes(it.value_size)}</td></tr>`;
    }
    return `<tr data-id="${it.id}"><td>${open}</td><td>${esc(it.state)}</td><td>${time(it.deadline)}</td>
      <td>${num(st.dequeue_count)}</td><td>${bytes(it.value_size)}</td></tr>`;
  }

  function draw() {
    const now = Date.now();
    tbody.innerHTML = items.map((it) => row(it, now)).join("") ||
      `<tr><td colspan="${head.length}" class="muted">No ${dead ? "dead letters" : mode === "leased" ? "leased items" : "items"}.</td></tr>`;
    const first = state.page * PAGE;
    root.querySelector("#page").textContent = items.length ? `${first + 1}–${first + items.length}` : "";
    root.querySelector("#prev").disabled = state.page === 0;
    root.querySelector("#next").disabled = !state.next;
    if (dead) {
      root.querySelector("#redrive-selected").disabled = selected.size === 0;
      root.querySelector("#delete-selected").disabled = selected.size === 0;
    }
  }

  async function load() {
    const after = state.cursors[state.page];
    const path = `/v1/queues/${q(queue)}/items?state=${state.filter}&limit=${PAGE}` +
      (dead ? `&values=true&value_bytes=${PREVIEW_BYTES}` : "") + (after ? `&after=${q(after)}` : "");
    const page = await get(path);
    items = page.items;
    state.next = page.next;
    state.cursors[state.page + 1] = page.next;
    draw();
  }

  async function open(id) {
    const item = await get(`/v1/queues/${q(queue)}/items/${id}?values=true`);
    root.querySelector("#detail").replaceChildren(itemPanel(item));
  }

  async function redrive(ids, what) {
    const ok = await confirmAction({
      title: `Redrive ${what}?`,
      message: `Move ${what} from ${queue} back to the queue${ids ? "s" : "s"} they came from.`,
      ok: "Redrive",
    });
    if (!ok) return;
    const result = await post(`/v1/queues/${q(queue)}/redrive`, ids ? { ids } : {});
    const failed = result.failed?.length ? `, ${result.failed.length} failed` : "";
    ctx.status(`redrove ${result.moved} item${result.moved === 1 ? "" : "s"}${failed}`);
    selected.clear();
    await load();
  }

  async function remove(ids) {
    const ok = await confirmAction({
      title: `Delete ${ids.length} item${ids.length === 1 ? "" : "s"}?`,
      message: `Delete item${ids.length === 1 ? "" : "s"} ${ids.join(", ")} from ${queue}. This cannot be undone.`,
      ok: "Delete",
    });
    if (!ok) return;
    for (const id of ids) await del(`/v1/queues/${q(queue)}/items/${id}`);
    ctx.status(`deleted ${ids.length} item${ids.length === 1 ? "" : "s"}`);
    selected.clear();
    await load();
  }

  root.addEventListener("click", (e) => {
    const t = e.target;
    const act = (fn) => { e.preventDefault(); fn().catch(ctx.report); };
    if (t.dataset.open) act(() => open(t.dataset.open));
    else if (t.dataset.redrive) act(() => redrive([Number(t.dataset.redrive)], `item ${t.dataset.redrive}`));
    else if (t.dataset.delete) act(() => remove([Number(t.dataset.delete)]));
    else if (t.id === "redrive-all") act(() => redrive(null, "all dead letters"));
    else if (t.id === "redrive-selected") act(() => redrive([...selected], `${selected.size} selected items`));
    else if (t.id === "delete-selected") act(() => remove([...selected]));
    else if (t.id === "prev") act(async () => { state.page -= 1; await load(); });
    else if (t.id === "next") act(async () => { state.page += 1; await load(); });
  });
  root.addEventListener("change", (e) => {
    const t = e.target;
    if (t.dataset.select) {
      const id = Number(t.dataset.select);
      if (t.checked) selected.add(id); else selected.delete(id);
      draw();
    } else if (t.id === "state") {
      state.filter = t.value; state.page = 0; state.cursors = [null];
      load().catch(ctx.report);
    }
  });
  await load();
  return { refresh: load };
}
