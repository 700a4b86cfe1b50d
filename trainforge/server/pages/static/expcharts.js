// The experiment page's charts besides the parallel coordinates: colour scales and their legend, the
// curves of one metric over all trials (a canvas: a line per trial, a pruned one ending at its rung
// with a cross), the best value so far (uPlot), the scheduler's decisions over time (SVG) and the
// parameter-importance bars. No framework; styles only through the CSSOM (the CSP has no inline styles).
import { short } from "./parcoords.js";

const SVGNS = "http://www.w3.org/2000/svg";
export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04",
  "#db2777", "#65a30d"];
// Viridis, 9 stops: low values dark purple, high values yellow.
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
export const KIND_COLORS = { pruned: "#dc2626", max_t: "#16a34a", exploit: "#9333ea", stopper: "#0891b2",
  budget: "#ca8a04", interrupted: "#6b7280", error: "#991b1b" };

function mix(a, b, f) {
  const p = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
  const [x, y] = [p(a), p(b)];
  return `rgb(${x.map((v, i) => Math.round(v + (y[i] - v) * f)).join(",")})`;
}

export function viridis(f) {
  const t = Math.min(1, Math.max(0, Number.isFinite(f) ? f : 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(t));
  return mix(VIRIDIS[i], VIRIDIS[i + 1], t - i);
}

// A colour for each value of `values`: a continuous scale (log when `log`) for numbers with more than
// 8 distinct values (or any, with `continuous`), else one palette colour per value; {color(v), legend(el)}.
export function colorScale(values, { log = false, continuous = false } = {}) {
  const present = values.filter((v) => v !== null && v !== undefined);
  const distinct = [...new Set(present.map((v) => JSON.stringify(v)))].map((s) => JSON.parse(s));
  const numeric = distinct.length > 0 && distinct.every((v) => typeof v === "number" && Number.isFinite(v));
  if (numeric && (distinct.length > 8 || continuous)) {
    const useLog = log && distinct.every((v) => v > 0);
    const f = useLog ? Math.log10 : (x) => x;
    const lo = Math.min(...distinct.map(f));
    const hi = Math.max(...distinct.map(f));
    const color = (v) => (typeof v === "number" && Number.isFinite(v) ? viridis(hi > lo ? (f(v) - lo) / (hi - lo) : 0.5) : "#9ca3af");
    const legend = (box) => {
      box.replaceChildren();
      const bar = document.createElement("div");
      bar.className = "gradient";
      bar.style.background = `linear-gradient(to right, ${VIRIDIS.join(", ")})`;
      const labels = document.createElement("div");
      labels.className = "gradient-labels";
      const inv = useLog ? (x) => 10 ** x : (x) => x;
      for (const p of [0, 0.5, 1]) {
        const s = document.createElement("span");
        s.textContent = short(inv(lo + p * (hi - lo)));
        labels.appendChild(s);
      }
      box.append(bar, labels);
      box.dataset.kind = "continuous";
    };
    return { color, legend, continuous: true };
  }
  const sorted = distinct.sort((a, b) => (typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b))));
  const keyOf = (v) => JSON.stringify(v);
  const index = new Map(sorted.map((v, i) => [keyOf(v), i]));
  const color = (v) => (index.has(keyOf(v)) ? PALETTE[index.get(keyOf(v)) % PALETTE.length] : "#9ca3af");
  const legend = (box) => {
    box.replaceChildren();
    for (const v of sorted) {
      const item = document.createElement("span");
      item.className = "swatch";
      const dot = document.createElement("i");
      dot.style.background = color(v);
      item.append(dot, document.createTextNode(typeof v === "number" ? short(v) : String(v)));
      box.appendChild(item);
    }
    box.dataset.kind = "categorical";
  };
  return { color, legend, continuous: false };
}

function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) return [lo];
  const step = 10 ** Math.floor(Math.log10((hi - lo) / n));
  const m = [1, 2, 5, 10].find((k) => (hi - lo) / (k * step) <= n) * step;
  const out = [];
  for (let v = Math.ceil(lo / m) * m; v <= hi + 1e-12; v += m) out.push(Number(v.toPrecision(12)));
  return out;
}

// The curves: trials {id: {x: [], y: [], cut, state}}, color(id). Writes what it drew on the canvas's
// dataset: `drawn` (lines), `ends` ({id: last x}) for the tests and the bench.
export function drawCurves(canvas, trials, color, { xLabel = "iteration", log = false } = {}) {
  const width = Math.max(360, canvas.parentElement.clientWidth - 200 || 900);
  const height = 320;
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const pad = { l: 56, r: 12, t: 10, b: 30 };
  const pts = Object.values(trials).flatMap((c) => c.x.map((x, i) => [x, c.y[i]])).filter(([x, y]) => x !== null && y !== null
    && Number.isFinite(x) && Number.isFinite(y) && (!log || y > 0));
  const ends = {};
  if (!pts.length) {
    canvas.dataset.drawn = "0";
    canvas.dataset.ends = "{}";
    return;
  }
  const fy = log ? Math.log10 : (v) => v;
  const [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  const [y0, y1] = [Math.min(...pts.map((p) => fy(p[1]))), Math.max(...pts.map((p) => fy(p[1])))];
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0 || 1)) * (width - pad.l - pad.r);
  const sy = (y) => height - pad.b - ((fy(y) - y0) / (y1 - y0 || 1)) * (height - pad.t - pad.b);
  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  ctx.font = "11px system-ui, sans-serif";
  for (const v of niceTicks(x0, x1)) {
    ctx.beginPath(); ctx.moveTo(sx(v), pad.t); ctx.lineTo(sx(v), height - pad.b); ctx.stroke();
    ctx.fillText(short(v), sx(v) - 8, height - pad.b + 14);
  }
  for (const v of niceTicks(y0, y1)) {
    const y = log ? 10 ** v : v;
    ctx.beginPath(); ctx.moveTo(pad.l, sy(y)); ctx.lineTo(width - pad.r, sy(y)); ctx.stroke();
    ctx.fillText(short(y), 4, sy(y) + 4);
  }
  ctx.fillText(xLabel, width - pad.r - 60, height - 4);
  let drawn = 0;
  for (const [id, c] of Object.entries(trials)) {
    ctx.strokeStyle = color(id);
    ctx.lineWidth = c.pruned ? 1 : 1.5;
    ctx.beginPath();
    let pen = false;
    let last = null;
    c.x.forEach((x, i) => {
      const y = c.y[i];
      if (x === null || y === null || !Number.isFinite(y) || (log && y <= 0)) { pen = false; return; }
      if (pen) ctx.lineTo(sx(x), sy(y)); else ctx.moveTo(sx(x), sy(y));
      pen = true;
      last = [x, y];
    });
    ctx.stroke();
    if (last && c.pruned) { // where the scheduler stopped it: a cross
      const [px, py] = [sx(last[0]), sy(last[1])];
      ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(px - 5, py - 5); ctx.lineTo(px + 5, py + 5); ctx.moveTo(px + 5, py - 5); ctx.lineTo(px - 5, py + 5);
      ctx.stroke();
    }
    if (last) { ends[id] = last[0]; drawn += 1; }
  }
  canvas.dataset.drawn = String(drawn);
  canvas.dataset.ends = JSON.stringify(ends);
}

// Best so far against trials finished (x "n") or time (x "t"): the trials' values as points, the best as a step line.
export function drawBest(box, points, xKey, plot) {
  const xs = points.map((p) => (xKey === "t" ? p.t : p.n));
  const data = [xs, points.map((p) => p.value), points.map((p) => p.best)];
  if (plot && plot.xKey === xKey) { plot.setData(data); return plot; }
  if (plot) plot.destroy();
  box.replaceChildren();
  const width = Math.max(300, Math.min(640, box.clientWidth || 560));
  const made = new uPlot({ // eslint-disable-line no-undef -- uPlot: the vendored script the page loads
    width, height: 240, scales: { x: { time: false } }, legend: { live: false },
    series: [{ label: xKey === "t" ? "seconds" : "trials" },
      { label: "trial", stroke: "#9ca3af", width: 0, points: { show: true, size: 5, fill: "#9ca3af" } },
      { label: "best so far", stroke: "#2563eb", width: 2, paths: uPlot.paths.stepped({ align: 1 }) }], // eslint-disable-line no-undef
    axes: [{}, { size: 56 }],
  }, data, box);
  made.xKey = xKey;
  box.dataset.points = String(points.length);
  return made;
}

// The scheduler's decisions over time: x seconds since the experiment started, y the iteration.
export function drawDecisions(box, decisions, t0) {
  box.replaceChildren();
  if (!decisions.length) { box.textContent = "No decision yet (a scheduler that stops trials early says here which, when, and at which iteration)."; return; }
  const width = Math.max(360, Math.min(900, box.clientWidth || 800));
  const height = 180;
  const pad = { l: 40, r: 10, t: 10, b: 24 };
  const svg = document.createElementNS(SVGNS, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.setAttribute("class", "decisions-svg");
  const xs = decisions.map((d) => d.ts - t0);
  const ys = decisions.map((d) => d.iteration ?? 0);
  const [x1, y1] = [Math.max(1e-9, ...xs), Math.max(1, ...ys)];
  const sx = (x) => pad.l + (x / x1) * (width - pad.l - pad.r);
  const sy = (y) => height - pad.b - (y / y1) * (height - pad.t - pad.b);
  const add = (name, attrs, text) => {
    const n = document.createElementNS(SVGNS, name);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = text;
    svg.appendChild(n);
    return n;
  };
  add("line", { x1: pad.l, x2: width - pad.r, y1: height - pad.b, y2: height - pad.b, stroke: "#9ca3af" });
  add("line", { x1: pad.l, x2: pad.l, y1: pad.t, y2: height - pad.b, stroke: "#9ca3af" });
  for (const v of niceTicks(0, y1, 4)) add("text", { x: 4, y: sy(v) + 4, class: "pc-tick" }, short(v));
  for (const v of niceTicks(0, x1, 6)) add("text", { x: sx(v) - 6, y: height - 6, class: "pc-tick" }, `${short(v)}s`);
  decisions.forEach((d, i) => {
    const dot = add("circle", { cx: sx(xs[i]), cy: sy(ys[i]), r: 4, fill: KIND_COLORS[d.kind] || "#374151", "data-kind": d.kind });
    const title = document.createElementNS(SVGNS, "title");
    title.textContent = `${d.trial_id}: ${d.detail.text || d.kind}`;
    dot.appendChild(title);
  });
  box.appendChild(svg);
}

// Importance: a bar per parameter, most important first.
// Bars of the importances, each with its 10-90% interval over bootstrap resamples when there is one
// (a line across the bar; the figures beside it), all on one scale.
export function drawImportance(box, importances, intervals = {}) {
  box.replaceChildren();
  const entries = Object.entries(importances);
  const top = Math.max(1e-12, ...entries.map(([, v]) => v), ...Object.values(intervals).map(([, hi]) => hi));
  for (const [name, value] of entries) {
    const row = document.createElement("div");
    row.className = "imp-row";
    row.dataset.param = name;
    const label = document.createElement("span");
    label.className = "imp-name";
    label.textContent = name;
    const track = document.createElement("span");
    track.className = "imp-track";
    const bar = document.createElement("span");
    bar.className = "imp-bar";
    bar.style.width = `${(100 * value) / top}%`;
    track.appendChild(bar);
    const range = intervals[name];
    if (range) {
      const line = document.createElement("span");
      line.className = "imp-interval";
      line.style.left = `${(100 * range[0]) / top}%`;
      line.style.width = `${Math.max(0.5, (100 * (range[1] - range[0])) / top)}%`;
      track.appendChild(line);
    }
    const num = document.createElement("span");
    num.className = "imp-value";
    num.textContent = range ? `${value.toFixed(2)} (${range[0].toFixed(2)}–${range[1].toFixed(2)})` : value.toFixed(3);
    row.append(label, track, num);
    box.appendChild(row);
  }
}
