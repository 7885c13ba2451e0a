// A small SVG line chart: time on x, one or more series on y, gaps where a value is null.
// Drawn from scratch on every refresh (a few hundred points): no library, no build step.

const NS = "http://www.w3.org/2000/svg";
const W = 600, H = 200, L = 48, R = 8, T = 8, B = 22;

function el(name, attrs, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// The y axis's ticks, from 0 to at least `max`: a step of 1, 2 or 5 times a power of ten,
// about four steps, so every label is a round number (0, 2, 4, 6; 0, 0.1, 0.2, 0.3), never
// a quarter of the top (0.13, 0.38, 1.25, 3.75). Counts (`integers`) step by 1 at least.
export function ticks(max, integers = false) {
  if (!(max > 0)) max = 1;
  const raw = max / 4;
  const p = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw * (1 - 1e-9));
  if (integers) step = Math.max(1, Math.round(step));
  const n = Math.max(1, Math.ceil(max / step - 1e-9));
  return Array.from({ length: n + 1 }, (_, i) => +(i * step).toPrecision(12));
}

function shortNum(v) {
  if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
  return `${+v.toFixed(2)}`;
}

function clock(ms, withSeconds) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}${withSeconds ? `:${pad(d.getSeconds())}` : ""}`;
}

// series: [{name, color, values}], t: sample times (ms); all arrays the same length.
// `integers`: the series are counts (the y axis steps by whole numbers).
export function lineChart(title, t, series, { from, to, integers = false } = {}) {
  const box = document.createElement("div");
  box.className = "chart";
  box.innerHTML = `<h3></h3><div class="legend"></div>`;
  box.querySelector("h3").textContent = title;
  const legend = box.querySelector(".legend");
  for (const s of series) {
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${s.color}"></i>`;
    item.append(s.name);
    legend.append(item);
  }
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  box.append(svg);
  const t0 = from ?? (t.length ? t[0] : 0);
  const t1 = Math.max(to ?? (t.length ? t[t.length - 1] : 1), t0 + 1);
  let top = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > top) top = v;
  const marks = ticks(top, integers);
  top = marks[marks.length - 1];
  const x = (ms) => L + ((ms - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (const v of marks) {
    svg.append(el("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.append(el("text", { class: "axis y", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, shortNum(v)));
  }
  for (let i = 0; i <= 4; i += 1) {
    const ms = t0 + ((t1 - t0) * i) / 4;
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    svg.append(el("text", { class: "axis", x: x(ms), y: H - 6, "text-anchor": anchor }, clock(ms, t1 - t0 < 600_000)));
  }
  if (!t.length) {
    svg.append(el("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no samples yet"));
    return box;
  }
  for (const s of series) {
    let d = "";
    let pen = "M";
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = "M"; return; }
      d += `${pen}${x(t[i]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = "L";
    });
    if (d) {
      svg.append(el("path", { d, fill: "none", style: `stroke:${s.color}`, "stroke-width": 1.6,
        "vector-effect": "non-scaling-stroke", "data-series": s.name }));
    }
  }
  return box;
}
