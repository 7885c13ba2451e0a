// The dashboard's shell: sign-in, hash routing, and the live refresh loop.
// Each view module exports `mount(root, params, ctx)` and returns `{refresh, stop}`;
// the shell calls `refresh()` every few seconds while the view is shown.

import { ApiError, Unauthorized, api, get, token } from "./api.js";
import * as overview from "./views/overview.js";
import * as queue from "./views/queue.js";
import * as charts from "./views/charts.js";
import * as dead from "./views/dead.js";
import * as find from "./views/find.js";
import * as server from "./views/server.js";
import * as schedules from "./views/schedules.js";

const VIEWS = { overview, queue, charts, dead, schedules, find, server };
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, Number(params.get("refresh")) || 3000);
// A cheap guarded read: does the server let us in (with the stored token, if any), and
// may that token write? A read-only token's page hides every action (class "write").
const PROBE = "/v1/session";

function setRole(session) {
  document.body.dataset.role = session?.role ?? "admin";
}

const main = document.getElementById("view");
const loginForm = document.getElementById("login");
const nav = document.getElementById("nav");
const statusLine = document.getElementById("status");
let current = null;
let timer = null;
let generation = 0;

function status(text, error = false) {
  statusLine.textContent = text;
  statusLine.classList.toggle("error", error);
}

// What the user's last action got back, if the server refused it. It stays in the status
// line until the next action or view: the refresh that follows within seconds must not
// wipe out the only sign that a pause, purge, redrive or delete did not happen.
let refused = null;

function updated() {
  const at = new Date().toLocaleTimeString();
  if (refused) status(`${refused} (figures updated ${at})`, true);
  else status(`updated ${at}`);
}

function describe(err) {
  return err instanceof ApiError ? `${err.code ?? err.status}: ${err.message}` : String(err);
}

// A refresh that failed: shown until the next one succeeds.
function report(err) {
  if (err instanceof Unauthorized) { showLogin(); return; }
  status(describe(err), true);
}

// An action that failed (the views' ctx.report): shown until the next action or view.
function reportAction(err) {
  if (err instanceof Unauthorized) { showLogin(); return; }
  refused = describe(err);
  status(refused, true);
}

// An action that succeeded (the views' ctx.status).
function actionDone(text) {
  refused = null;
  status(text);
}

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const args = Object.fromEntries(new URLSearchParams(query));
  if (parts[0] === "queue" && parts[1]) return ["queue", { name: parts[1], tab: parts[2] || "overview", ...args }];
  if (parts[0] in VIEWS && parts[0] !== "queue") return [parts[0], args];
  return ["overview", args];
}

async function show() {
  const mine = ++generation;
  stopCurrent();
  const [name, args] = route();
  for (const a of nav.querySelectorAll("a[data-view]")) {
    a.classList.toggle("active", a.dataset.view === name);
  }
  main.replaceChildren();
  refused = null;
  const ctx = {
    status: actionDone, report: reportAction, refreshMs: REFRESH_MS, isCurrent: () => mine === generation,
  };
  try {
    const view = await VIEWS[name].mount(main, args, ctx);
    if (mine !== generation) { view?.stop?.(); return; }
    current = view;
    updated();
    schedule(mine);
  } catch (err) {
    report(err);
  }
}

// The next refresh waits at least REFRESH_MS, and longer when the last one was slow
// (a server with thousands of queues): the page never spends most of its time refreshing.
let lastRefreshMs = 0;

function schedule(mine) {
  timer = setTimeout(async () => {
    if (mine !== generation || !current?.refresh) return;
    const started = performance.now();
    try {
      await current.refresh();
      lastRefreshMs = performance.now() - started;
      if (mine === generation) updated();
    } catch (err) {
      report(err);
      if (err instanceof Unauthorized) return;
    }
    if (mine === generation) schedule(mine);
  }, Math.max(REFRESH_MS, 5 * lastRefreshMs));
}

function stopCurrent() {
  clearTimeout(timer);
  current?.stop?.();
  current = null;
}

function showLogin(message = "") {
  generation += 1;
  stopCurrent();
  main.replaceChildren();
  nav.hidden = true;
  loginForm.hidden = false;
  document.getElementById("login-error").textContent = message;
  document.getElementById("token").focus();
}

function showApp(signedIn) {
  loginForm.hidden = true;
  nav.hidden = false;
  document.getElementById("logout").hidden = !signedIn;
  show();
}

loginForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const candidate = document.getElementById("token").value.trim();
  try {
    setRole(await api("GET", PROBE, undefined, candidate));
  } catch (err) {
    if (err instanceof Unauthorized) { showLogin("That token was refused."); return; }
  }
  token.set(candidate);
  document.getElementById("token").value = "";
  showApp(true);
});

document.getElementById("logout").addEventListener("click", () => {
  token.clear();
  showLogin();
});

window.addEventListener("hashchange", () => { if (loginForm.hidden) show(); });

// Start: ask the server whether we may read (with the stored token, if any).
(async () => {
  try {
    setRole(await get(PROBE));
    showApp(Boolean(token.get()));
  } catch (err) {
    if (err instanceof Unauthorized) showLogin(token.get() ? "The stored token was refused." : "");
    else { showApp(Boolean(token.get())); report(err); }
  }
})();
