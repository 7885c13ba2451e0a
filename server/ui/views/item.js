// One item shown in full: state, deadline, stats, lease, why it failed (each reason it
// keeps, newest first), and its value as text or hex, cut at SHOW_BYTES so a 1 MiB value
// does not freeze the page.

import { bytes, duration, esc, hexdump, num, time, valueBytes } from "../format.js";

const SHOW_BYTES = 4096;

export function itemPanel(item) {
  const box = document.createElement("div");
  box.className = "panel item";
  box.dataset.item = item.id;
  const st = item.stats || {};
  const now = Date.now();
  const rows = [
    ["Id", num(item.id)],
    ["State", esc(item.state)],
    // A gone item has no deadline (null): "null - now" would read as 55 years ago.
    ["Deadline", item.deadline === null || item.deadline === undefined ? "–"
      : `${time(item.deadline)} <span class="muted">(${duration(item.deadline - now)} from now)</span>`],
    ["Enqueued", time(st.enqueue_time)],
    ["Requeued", st.requeue_time ? time(st.requeue_time) : "–"],
    ["Deliveries", num(st.dequeue_count)],
  ];
  if (item.lease_expires) rows.push(["Lease expires", `${time(item.lease_expires)} <span class="muted">(${duration(item.lease_expires - now)})</span>`]);
  if (item.dead_lettered_from) rows.push(["Dead-lettered from", esc(item.dead_lettered_from)]);
  // Dead-lettering and redrive give the item a new id in another queue: link to it.
  if (item.moved_to) {
    const to = item.moved_to;
    rows.push(["Moved to", `<a id="moved-to" href="#/find?queue=${encodeURIComponent(to.queue)}&id=${to.id}">${esc(to.queue)} as item ${num(to.id)}</a>`]);
  }
  rows.push(["Value size", bytes(item.value_size)]);
  box.innerHTML = `<dl class="kv">${rows.map(([k, v]) => `<dt>${k}</dt><dd data-field="${k.toLowerCase()}">${v}</dd>`).join("")}</dl>`;
  if (item.errors && item.errors.length) {
    const list = document.createElement("ol");
    list.className = "reasons";
    list.innerHTML = item.errors.map((r) => `<li data-delivery="${r.delivery}"><span class="muted">${time(r.at)},
      delivery ${num(r.delivery)}:</span> <pre class="reason">${esc(r.error)}</pre></li>`).join("");
    const title = document.createElement("h3");
    title.textContent = "Why it failed";
    box.append(title, list);
  }
  if (item.value === undefined || item.value === null) return box;
  const data = valueBytes(item.value, item.encoding);
  const isText = item.encoding !== "base64";
  const bar = document.createElement("div");
  bar.className = "toolbar";
  bar.innerHTML = `<label><input type="radio" name="fmt-${item.id}" value="text" ${isText ? "checked" : ""}> text</label>
    <label><input type="radio" name="fmt-${item.id}" value="hex" ${isText ? "" : "checked"}> hex</label>
    <span class="muted">${data.length > SHOW_BYTES ? `first ${bytes(SHOW_BYTES)} of ${bytes(data.length)}` : bytes(data.length)}</span>`;
  const pre = document.createElement("pre");
  pre.className = "value";
  const draw = (mode) => {
    const cut = data.subarray(0, SHOW_BYTES);
    pre.textContent = mode === "hex" ? hexdump(cut, SHOW_BYTES)
      : new TextDecoder("utf-8", { fatal: false }).decode(cut) + (data.length > SHOW_BYTES ? "…" : "");
    pre.dataset.mode = mode;
  };
  bar.addEventListener("change", (e) => draw(e.target.value));
  draw(isText ? "text" : "hex");
  box.append(bar, pre);
  return box;
}
