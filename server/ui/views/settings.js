// A queue's settings: default lease, max deliveries, dead-letter queue, dedup window.
// Saved with PUT /v1/queues/{queue}; an empty field means "none" / "the default".

import { ApiError, put, q } from "../api.js";
import { esc } from "../format.js";

export function settingsForm(root, name, info, ctx, reload) {
  const c = info.config || {};
  const hasDedup = "dedup_window_ms" in c;
  root.innerHTML = `
    <form class="settings panel" id="settings">
      <label for="s-lease">Default lease (ms)</label>
      <input id="s-lease" name="default_lease_ms" type="number" min="1" required value="${esc(c.default_lease_ms)}">
      <label for="s-max">Max deliveries</label>
      <input id="s-max" name="max_deliveries" type="number" min="1" placeholder="unlimited" value="${esc(c.max_deliveries ?? "")}">
      <label for="s-dlq">Dead-letter queue</label>
      <input id="s-dlq" name="dead_letter_queue" placeholder="${esc(name)}.dlq" value="${esc(c.dead_letter_queue ?? "")}">
      ${hasDedup ? `<label for="s-dedup">Dedup window (ms)</label>
      <input id="s-dedup" name="dedup_window_ms" type="number" min="0" value="${esc(c.dedup_window_ms)}">` : ""}
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
