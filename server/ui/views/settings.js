// A queue's settings: default lease, max deliveries, dead-letter queue, dedup window,
// and the delivery rules (group limit, leased limit, fair, rate limit: docs/delivery.md).
// Saved with PUT /v1/queues/{queue}; an empty field means "none" / "the default".

import { ApiError, put, q } from "../api.js";
import { esc } from "../format.js";

export function settingsForm(root, name, info, ctx, reload) {
  const c = info.config || {};
  const hasDedup = "dedup_window_ms" in c;
  // a server older than the delivery rules neither shows nor takes them
  const hasRules = "group_limit" in c;
  const rate = c.rate_limit || {};
  root.innerHTML = `
    <form class="settings panel" id="settings" novalidate>
      <label for="s-lease">Default lease (ms)</label>
      <input id="s-lease" name="default_lease_ms" type="number" min="1" required value="${esc(c.default_lease_ms)}">
      <label for="s-max">Max deliveries</label>
      <input id="s-max" name="max_deliveries" type="number" min="1" placeholder="unlimited" value="${esc(c.max_deliveries ?? "")}">
      <label for="s-dlq">Dead-letter queue</label>
      <input id="s-dlq" name="dead_letter_queue" placeholder="${esc(name)}.dlq" value="${esc(c.dead_letter_queue ?? "")}">
      ${hasDedup ? `<label for="s-dedup">Dedup window (ms)</label>
      <input id="s-dedup" name="dedup_window_ms" type="number" min="0" value="${esc(c.dedup_window_ms)}">` : ""}
      ${hasRules ? `<label for="s-group-limit">Group limit</label>
      <input id="s-group-limit" name="group_limit" type="number" min="1" placeholder="none (1: each group in order)" value="${esc(c.group_limit ?? "")}">
      <label for="s-leased-limit">Leased limit</label>
      <input id="s-leased-limit" name="leased_limit" type="number" min="1" placeholder="none" value="${esc(c.leased_limit ?? "")}">
      <label for="s-fair">Fair</label>
      <span><input id="s-fair" name="fair" type="checkbox" ${c.fair ? "checked" : ""}> <span class="muted">serve the groups with due items in turn</span></span>
      <label for="s-rate">Rate limit (per second)</label>
      <input id="s-rate" name="per_second" type="number" min="0" step="any" placeholder="none" value="${esc(rate.per_second ?? "")}">
      <label for="s-burst">Burst</label>
      <input id="s-burst" name="burst" type="number" min="1" placeholder="a second's worth" value="${esc(rate.burst ?? "")}">
      <label for="s-per-group">Rate per group</label>
      <span><input id="s-per-group" name="per_group" type="checkbox" ${rate.per_group ? "checked" : ""}> <span class="muted">a bucket for each group</span></span>` : ""}
      <span></span><span><button class="primary write" type="submit">Save</button> <span id="saved" class="muted"></span>
        <span class="read-note muted">read-only token: settings cannot be changed</span></span>
    </form>`;
  const form = root.querySelector("form");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const body = {
      default_lease_ms: Number(f.get("default_lease_ms")),
      max_deliveries: f.get("max_deliveries") ? Number(f.get("max_deliveries")) : null,
      dead_letter_queue: f.get("dead_letter_queue") || null,
    };
    if (hasDedup) body.dedup_window_ms = Number(f.get("dedup_window_ms"));
    // the form does not edit the retry policy: a save keeps it (docs/retries.md)
    if (c.retry) body.retry = c.retry;
    if (hasRules) {
      const limit = (field) => (f.get(field) ? Number(f.get(field)) : null);
      body.group_limit = limit("group_limit");
      body.leased_limit = limit("leased_limit");
      body.fair = f.get("fair") === "on";
      const perSecond = f.get("per_second");
      body.rate_limit = perSecond === "" ? null : {
        per_second: Number(perSecond),
        burst: f.get("burst") ? Number(f.get("burst")) : Math.max(1, Math.ceil(Number(perSecond))),
        per_group: f.get("per_group") === "on",
      };
    }
    // The note beside Save answers this save only: a refused save must not leave the
    // "saved" of an earlier one, and says why next to the form (the status line moves on).
    const saved = root.querySelector("#saved");
    saved.textContent = "";
    saved.className = "muted";
    try {
      await put(`/v1/queues/${q(name)}`, body);
    } catch (err) {
      if (err instanceof ApiError) {
        saved.textContent = `not saved: ${err.message}`;
        saved.className = "error";
      }
      ctx.report(err);
      return;
    }
    saved.textContent = "saved";
    ctx.status(`settings of ${name} saved`);
    await reload().catch(ctx.report);
  });
  // No refresh: a form being edited must not be redrawn under the user.
  return null;
}
