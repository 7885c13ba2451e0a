// A queue's busiest groups (docs/delivery.md): those with the most leased and held items
// now, from GET /v1/queues/{queue}/groups. "Due" are the items dequeue passed that the
// group has not handed out; "held back" those of them it may not hand out now (its
// group limit, its rate limit, or an earlier item of it still leased).

import { get, q } from "../api.js";
import { esc, num } from "../format.js";

export async function groupsTable(root, name) {
  root.innerHTML = `
    <p class="muted">Groups with a leased or a held item, busiest first.</p>
    <table id="groups"><thead><tr><th class="text">Group</th><th>Due</th><th>Leased</th><th>Held back</th></tr></thead><tbody></tbody></table>`;
  const tbody = root.querySelector("tbody");
  async function refresh() {
    const { groups } = await get(`/v1/queues/${q(name)}/groups?limit=20`);
    tbody.innerHTML = groups.map((g) => `<tr data-group="${esc(g.group ?? "")}">
      <td class="text">${g.group === null ? `<span class="muted">(no group)</span>` : esc(g.group)}</td>
      <td data-col="due">${num(g.due)}</td><td data-col="leased">${num(g.leased)}</td>
      <td data-col="held">${g.held ? `<span class="alert">${num(g.held)}</span>` : "0"}</td></tr>`).join("") ||
      `<tr><td colspan="4" class="muted">No group has a leased or a held item now.</td></tr>`;
  }
  await refresh();
  return { refresh };
}
