// Parallel coordinates: one polyline per row across vertical axes. The lines are drawn on a canvas
// (a thousand trials stay cheap), the axes, their ticks and the brushes in an SVG on top. Dragging
// along an axis keeps only the rows whose value there falls in the dragged range (`onBrush` is told);
// a click on an axis clears its range. Axes are linear, log (from the search space) or categorical.
const SVGNS = "http://www.w3.org/2000/svg";
const MARGIN = { top: 28, bottom: 22, left: 40, right: 60 };
const DIM = "rgba(156, 163, 175, 0.25)";

function el(name, attrs, parent) {
  const node = document.createElementNS(SVGNS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

export function short(v) {
  if (typeof v !== "number") return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}

// An axis's scale: value -> position in [0, 1] (0 at the bottom), and back; its ticks.
function scaleOf(dim, values) {
  if (dim.type === "cat") {
    const cats = dim.categories && dim.categories.length ? dim.categories.map(String)
      : [...new Set(values.map(String))].sort();
    const pos = (v) => { const i = cats.indexOf(String(v)); return i < 0 ? null : cats.length === 1 ? 0.5 : i / (cats.length - 1); };
    return { cats, pos, ticks: cats.map((c) => [pos(c), c]) };
  }
  const nums = values.filter((v) => typeof v === "number" && Number.isFinite(v) && (dim.type !== "log" || v > 0));
  let lo = dim.low ?? Math.min(...nums);
  let hi = dim.high ?? Math.max(...nums);
  if (nums.length) { lo = Math.min(lo, ...nums); hi = Math.max(hi, ...nums); }
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) { lo = 0; hi = 1; }
  const log = dim.type === "log" && lo > 0;
  const f = log ? Math.log10 : (x) => x;
  const inv = log ? (x) => 10 ** x : (x) => x;
  let a = f(lo);
  let b = f(hi);
  if (a === b) { a -= 0.5; b += 0.5; }
  const pos = (v) => (typeof v === "number" && Number.isFinite(v) && (!log || v > 0) ? (f(v) - a) / (b - a) : null);
  const value = (p) => inv(a + p * (b - a));
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((p) => [p, short(value(p))]);
  return { pos, value, ticks };
}

export class ParallelCoordinates {
  // box: the element to draw in; onBrush(): called when a range is set or cleared.
  constructor(box, { height = 320, onBrush = () => {} } = {}) {
    this.box = box;
    this.height = height;
    this.onBrush = onBrush;
    this.canvas = document.createElement("canvas");
    this.svg = el("svg", { class: "pc-axes" });
    box.classList.add("pc");
    box.append(this.canvas, this.svg);
    this.dims = [];
    this.rows = [];
    this.scales = new Map();
    this.brushes = new Map(); // dim key -> [lo, hi] in [0, 1] positions
    this.color = () => "#2563eb";
    this.drag = null;
  }

  // dims: [{key, label, type: "linear" | "log" | "cat", low?, high?, categories?, get(row)}]; color(row): a CSS colour.
  setData(dims, rows, color) {
    this.dims = dims;
    this.rows = rows;
    this.color = color || this.color;
    this.scales = new Map(dims.map((d) => [d.key, scaleOf(d, rows.map((r) => d.get(r)).filter((v) => v !== undefined && v !== null))]));
    for (const key of [...this.brushes.keys()]) if (!this.scales.has(key)) this.brushes.delete(key);
    this.draw();
  }

  // Whether the row is inside every brushed range.
  passes(row) {
    for (const [key, [lo, hi]] of this.brushes) {
      const dim = this.dims.find((d) => d.key === key);
      const p = dim ? this.scales.get(key).pos(dim.get(row)) : null;
      if (p === null || p < lo - 1e-9 || p > hi + 1e-9) return false;
    }
    return true;
  }

  // The brushed ranges in data units: {key: [lo, hi]} (a categorical axis: {key: [categories]}).
  ranges() {
    const out = {};
    for (const [key, [lo, hi]] of this.brushes) {
      const s = this.scales.get(key);
      out[key] = s.cats ? s.cats.filter((c) => { const p = s.pos(c); return p >= lo - 1e-9 && p <= hi + 1e-9; }) : [s.value(lo), s.value(hi)];
    }
    return out;
  }

  clear() {
    this.brushes.clear();
    this.draw();
    this.onBrush();
  }

  layout() {
    const width = Math.max(360, this.box.clientWidth || 800);
    const n = this.dims.length;
    const inner = width - MARGIN.left - MARGIN.right;
    const xs = this.dims.map((_, i) => MARGIN.left + (n === 1 ? inner / 2 : (i * inner) / (n - 1)));
    const y = (p) => MARGIN.top + (1 - p) * (this.height - MARGIN.top - MARGIN.bottom);
    return { width, xs, y };
  }

  draw() {
    const { width, xs, y } = this.layout();
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = width * ratio;
    this.canvas.height = this.height * ratio;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${this.height}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, this.height);
    const drawRow = (row, stroke) => {
      ctx.strokeStyle = stroke;
      ctx.beginPath();
      let pen = false;
      this.dims.forEach((d, i) => {
        const p = this.scales.get(d.key).pos(d.get(row));
        if (p === null) { pen = false; return; }
        if (pen) ctx.lineTo(xs[i], y(p)); else ctx.moveTo(xs[i], y(p));
        pen = true;
      });
      ctx.stroke();
    };
    const inside = this.rows.filter((r) => this.passes(r));
    const kept = new Set(inside);
    ctx.lineWidth = 1;
    for (const row of this.rows) if (!kept.has(row)) drawRow(row, DIM);
    ctx.lineWidth = 1.5;
    for (const row of inside) drawRow(row, this.color(row));
    this.drawAxes(width, xs, y);
    this.box.dataset.lines = String(this.rows.length);
    this.box.dataset.inside = String(inside.length);
  }

  drawAxes(width, xs, y) {
    const svg = this.svg;
    svg.setAttribute("width", width);
    svg.setAttribute("height", this.height);
    svg.setAttribute("viewBox", `0 0 ${width} ${this.height}`);
    svg.replaceChildren();
    this.dims.forEach((d, i) => {
      const g = el("g", { class: "pc-axis", "data-axis": d.key }, svg);
      const x = xs[i];
      el("line", { x1: x, x2: x, y1: y(0), y2: y(1), stroke: "#374151" }, g);
      for (const [p, label] of this.scales.get(d.key).ticks) {
        el("line", { x1: x - 3, x2: x, y1: y(p), y2: y(p), stroke: "#374151" }, g);
        const t = el("text", { x: x - 5, y: y(p) + 3, "text-anchor": "end", class: "pc-tick" }, g);
        t.textContent = label.length > 10 ? `${label.slice(0, 9)}…` : label;
      }
      const title = el("text", { x, y: MARGIN.top - 12, "text-anchor": "middle", class: "pc-label" }, g);
      title.textContent = d.label;
      const brush = this.brushes.get(d.key);
      if (brush) {
        const r = el("rect", { x: x - 8, y: y(brush[1]), width: 16, height: Math.max(2, y(brush[0]) - y(brush[1])), class: "pc-brush" }, g);
        const range = this.ranges()[d.key];
        r.setAttribute("data-range", JSON.stringify(range));
      }
      const hit = el("rect", { x: x - 12, y: y(1) - 4, width: 24, height: y(0) - y(1) + 8, class: "pc-hit", "data-axis": d.key }, g);
      hit.addEventListener("pointerdown", (ev) => this.start(ev, d.key, y));
    });
  }

  start(ev, key, y) {
    ev.preventDefault();
    const box = this.svg.getBoundingClientRect();
    const toP = (clientY) => Math.min(1, Math.max(0, 1 - (clientY - box.top - y(1)) / (y(0) - y(1))));
    const from = toP(ev.clientY);
    const target = ev.target;
    target.setPointerCapture?.(ev.pointerId);
    const move = (e) => {
      const to = toP(e.clientY);
      if (Math.abs(to - from) * (y(0) - y(1)) < 3) return;
      this.brushes.set(key, [Math.min(from, to), Math.max(from, to)]);
      this.draw();
    };
    const up = (e) => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      const to = toP(e.clientY);
      if (Math.abs(to - from) * (y(0) - y(1)) < 3) this.brushes.delete(key); // a click: clear it
      else this.brushes.set(key, [Math.min(from, to), Math.max(from, to)]);
      this.draw();
      this.onBrush();
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }
}
